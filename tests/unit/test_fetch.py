"""``mnemos data fetch``: downloads from a real HTTP server in a thread (good file, wrong checksum, unreachable)."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import click
import pytest

import bench.common.fetch as fetch_module
from bench.common.fetch import LOCOMO, DataFetchError, RemoteFile, cached_file, fetch, locate_locomo

BODY = b'[{"sample_id": "conv-x", "conversation": {}, "qa": []}]\n' * 50


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server serving ``served/`` (``served/data.json`` holds BODY); yields its base URL."""
    root = tmp_path / "served"
    root.mkdir()
    (root / "data.json").write_bytes(BODY)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _remote(url: str, body: bytes = BODY) -> RemoteFile:
    return RemoteFile("data.json", url, hashlib.sha256(body).hexdigest(), len(body))


def test_a_good_download_is_cached_and_reused(server: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    remote = _remote(f"{server}/data.json")
    seen: list[int] = []
    path = fetch(remote, cache, progress=seen.append)
    assert path == cache / "data.json" and path.read_bytes() == BODY
    assert sum(seen) == len(BODY)
    assert sorted(p.name for p in cache.iterdir()) == ["data.json"]  # no temporary file left
    assert cached_file(remote, cache) == path
    # a second fetch does not download again
    assert fetch(RemoteFile(remote.name, f"{server}/gone.json", remote.sha256, remote.size_bytes), cache) == path


def test_a_wrong_checksum_is_refused_and_nothing_is_cached(server: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    remote = RemoteFile("data.json", f"{server}/data.json", "0" * 64, len(BODY))
    with pytest.raises(DataFetchError, match="sha256") as info:
        fetch(remote, cache)
    assert info.value.url == remote.url
    assert list(cache.iterdir()) == []
    assert cached_file(remote, cache) is None


def test_a_wrong_size_is_refused(server: str, tmp_path: Path) -> None:
    remote = RemoteFile("data.json", f"{server}/data.json", hashlib.sha256(BODY).hexdigest(), len(BODY) - 1)
    with pytest.raises(DataFetchError, match="more than the expected"):
        fetch(remote, tmp_path)
    assert not (tmp_path / "data.json").exists()


def test_an_unreachable_server_or_a_missing_file_is_a_typed_error(server: str, tmp_path: Path) -> None:
    with pytest.raises(DataFetchError, match="download failed"):
        fetch(_remote(f"{server}/missing.json"), tmp_path / "a")  # HTTP 404
    with pytest.raises(DataFetchError, match="download failed"):
        fetch(_remote(f"http://127.0.0.1:{_free_port()}/data.json"), tmp_path / "b", timeout_s=5)
    assert list((tmp_path / "a").iterdir()) == [] and list((tmp_path / "b").iterdir()) == []


def _free_port() -> int:
    """A loopback port that was free a moment ago (nothing listens on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_locomo_is_looked_for_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    given = tmp_path / "given.json"
    given.write_text("[]", encoding="utf-8")
    monkeypatch.setattr(fetch_module, "SHARED_LOCOMO", tmp_path / "shared" / "locomo10.json")
    downloads: list[RemoteFile] = []

    def download(remote: RemoteFile, cache_dir: Path) -> Path:
        downloads.append(remote)
        return cache_dir / remote.name

    assert locate_locomo(given, tmp_path / "cache", echo=said.append, download=download) == given
    with pytest.raises(click.BadParameter):
        locate_locomo(tmp_path / "nothing.json", tmp_path / "cache", echo=said.append, download=download)
    # nothing shared, nothing cached: download
    assert locate_locomo(None, tmp_path / "cache", echo=said.append, download=download) == tmp_path / "cache" / LOCOMO.name
    assert downloads == [LOCOMO] and any("downloading LoCoMo" in line for line in said)
    # the shared copy wins over a download
    shared = tmp_path / "shared" / "locomo10.json"
    shared.parent.mkdir()
    shared.write_text("[]", encoding="utf-8")
    assert locate_locomo(None, tmp_path / "cache", echo=said.append, download=download) == shared
    assert len(downloads) == 1


def test_locomo_is_pinned_to_an_upstream_commit() -> None:
    assert "/3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376/" in LOCOMO.url
    assert LOCOMO.size_bytes == 2_805_274 and len(LOCOMO.sha256) == 64


def test_a_data_folder_that_cannot_hold_the_download_is_a_setting_to_change(server: str, tmp_path: Path) -> None:
    """Break-it round 15: MNEMOS_DATA_DIR naming a file ended as a bare FileExistsError, exit 1."""
    from click.testing import CliRunner

    from bench.common.fetch import DataFolderError, fetch_command
    from workers.settings import Settings

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(DataFolderError, match="cannot download into .*a-file \\(MNEMOS_DATA_DIR\\)"):
        fetch(_remote(f"{server}/data.json"), blocker)
    result = CliRunner().invoke(fetch_command, ["locomo"], obj=Settings(data_dir=str(blocker / "sub")))
    assert result.exit_code == 2 and "(MNEMOS_DATA_DIR)" in result.output, result.output
