"""Embedded Redis/Postgres start only for an unconfigured URL at which nothing answers (no server started here)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.runtime.embedded import EmbeddedServices, postgres_answers, redis_answers
from workers.settings import Settings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port something listens on for the test's duration."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield int(server.getsockname()[1])
    server.close()


def test_answers_reads_host_and_port_from_the_url(listening: int) -> None:
    dead = _free_port()
    assert redis_answers(f"redis://127.0.0.1:{listening}/0") and not redis_answers(f"redis://127.0.0.1:{dead}/0")
    assert redis_answers("unix:///tmp/some.sock")  # checked on use, not here
    assert postgres_answers(f"postgresql://postgres@127.0.0.1:{listening}/mnemos")
    assert not postgres_answers(f"host=127.0.0.1 port={dead} dbname=mnemos user=postgres")
    assert postgres_answers("postgresql:///mnemos?host=/var/run/postgresql")


def _fake_starters(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []

    def redis(self: EmbeddedServices, directory: Path) -> str:
        started.append("redis")
        return "unix:///embedded/redis.sock"

    def postgres(self: EmbeddedServices, directory: Path) -> str:
        started.append("postgres")
        return "postgresql:///mnemos?host=/embedded"

    monkeypatch.setattr(EmbeddedServices, "_redis", redis)
    monkeypatch.setattr(EmbeddedServices, "_postgres", postgres)
    return started


def test_nothing_answers_at_the_default_urls_so_embedded_ones_start_and_say_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started = _fake_starters(monkeypatch)
    dead = _free_port()
    settings = Settings(redis_url=f"redis://127.0.0.1:{dead}/0", database_url=f"postgresql://postgres@127.0.0.1:{dead}/x",
                        embedded_dir=str(tmp_path))
    embedded = EmbeddedServices(settings)
    resolved = embedded.start()
    assert started == ["redis", "postgres"]
    assert resolved.redis_url == "unix:///embedded/redis.sock"
    assert resolved.database_url == "postgresql:///mnemos?host=/embedded"
    assert len(embedded.started) == 2 and "no Redis answered" in embedded.started[0]
    assert "no Postgres answered" in embedded.started[1]


def test_configured_or_answering_urls_are_left_alone(monkeypatch: pytest.MonkeyPatch, listening: int,
                                                     tmp_path: Path) -> None:
    started = _fake_starters(monkeypatch)
    dead = _free_port()
    configured = Settings.from_env({"MNEMOS_REDIS_URL": f"redis://127.0.0.1:{dead}/0",
                                    "MNEMOS_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{dead}/x",
                                    "MNEMOS_EMBEDDED_DIR": str(tmp_path)})
    assert EmbeddedServices(configured).start() == configured
    answering = Settings(redis_url=f"redis://127.0.0.1:{listening}/0",
                         database_url=f"postgresql://postgres@127.0.0.1:{listening}/x", embedded_dir=str(tmp_path))
    embedded = EmbeddedServices(answering)
    assert embedded.start() == answering and embedded.started == []
    assert started == []
