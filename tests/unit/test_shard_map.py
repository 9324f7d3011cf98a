"""MNEMOS_SHARD_MAP (workers/runtime/shard_map.py): each shard's own Redis and Postgres, read once by the
settings, refused in one line when it names an unknown shard, repeats a URL or disagrees with
MNEMOS_SHARDS; without a map every shard keeps the single URLs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.runtime.errors import SettingsError
from workers.settings import Settings, to_environment

MAP = {str(n): {"redis_url": f"redis://127.0.0.1:{7000 + n}/0",
                "database_url": f"postgresql://postgres@127.0.0.1:5432/shard{n}"} for n in range(3)}


def _env(shard_map: object, shards: int = 3, **extra: str) -> dict[str, str]:
    text = shard_map if isinstance(shard_map, str) else json.dumps(shard_map)
    return {"MNEMOS_SHARDS": str(shards), "MNEMOS_SHARD_MAP": text, **extra}


def test_a_worker_gets_its_own_shard_s_urls_and_knows_every_shard_s() -> None:
    settings = Settings.from_env(_env(MAP, MNEMOS_SHARD="2"))
    assert (settings.redis_url, settings.database_url) == (MAP["2"]["redis_url"], MAP["2"]["database_url"])
    for shard in range(3):
        assert settings.servers_of(shard).redis_url == MAP[str(shard)]["redis_url"]
        assert settings.for_shard(shard).database_url == MAP[str(shard)]["database_url"]
        assert settings.for_shard(shard).shard == shard


def test_a_map_file_is_read_once_and_children_get_its_text(tmp_path: Path) -> None:
    path = tmp_path / "shards.json"
    path.write_text(json.dumps(MAP), encoding="utf-8")
    settings = Settings.from_env(_env(str(path), MNEMOS_SHARD="1"))
    path.unlink()  # read when the settings were built, never again
    assert settings.for_shard(0).redis_url == MAP["0"]["redis_url"]
    child = to_environment(settings)
    assert "MNEMOS_REDIS_URL" not in child and "MNEMOS_DATABASE_URL" not in child
    again = Settings.from_env(child)
    assert again.replace(from_environment=frozenset()) == settings.replace(from_environment=frozenset())


def test_yaml_inline_map_is_read() -> None:
    pytest.importorskip("yaml")
    text = "\n".join(f"{n}: {{redis_url: '{v['redis_url']}', database_url: '{v['database_url']}'}}"
                     for n, v in MAP.items())
    assert Settings.from_env(_env(text)).servers_of(1).redis_url == MAP["1"]["redis_url"]


def test_without_a_map_every_shard_uses_the_single_urls() -> None:
    settings = Settings.from_env({"MNEMOS_SHARDS": "3", "MNEMOS_REDIS_URL": "redis://10.0.0.1:6379/0"})
    assert {settings.servers_of(s).redis_url for s in range(3)} == {"redis://10.0.0.1:6379/0"}
    assert Settings().servers_of(0).database_url == Settings().database_url


@pytest.mark.parametrize(("shard_map", "shards", "extra", "message"), [
    ({**MAP, "3": MAP["0"]}, 3, {}, "names shard 3, which MNEMOS_SHARDS=3 does not have"),
    ({"0": MAP["0"], "1": MAP["1"]}, 3, {}, "MNEMOS_SHARDS=3: no servers for shard 2"),
    (MAP, 2, {}, "names shard 2, which MNEMOS_SHARDS=2 does not have"),
    ({**MAP, "2": {**MAP["2"], "redis_url": MAP["0"]["redis_url"]}}, 3, {}, "shards 0 and 2 the same redis_url"),
    ({**MAP, "1": {**MAP["1"], "database_url": MAP["0"]["database_url"]}}, 3, {},
     "shards 0 and 1 the same database_url"),
    ({**MAP, "x": MAP["0"]}, 3, {}, "names shard 'x', which is not a shard number"),
    ({**MAP, "1": {"redis_url": MAP["1"]["redis_url"]}}, 3, {}, "shard 1 must have exactly a redis_url"),
    ({**MAP, "1": {**MAP["1"], "redis_url": "http://x"}}, 3, {}, "shard 1 redis_url='http://x' is not a Redis URL"),
    ("/no/such/map.json", 3, {}, "neither an inline JSON map nor a readable file"),
    ("[1, 2]", 3, {}, "must map each shard number"),
    (MAP, 3, {"MNEMOS_REDIS_URL": "redis://elsewhere:6379/0"}, "MNEMOS_REDIS_URL disagrees with MNEMOS_SHARD_MAP"),
])
def test_a_bad_map_is_refused_in_one_line(shard_map: object, shards: int, extra: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match="MNEMOS_") as caught:
        Settings.from_env(_env(shard_map, shards, **extra))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_url_the_map_agrees_with_is_accepted() -> None:
    settings = Settings.from_env(_env(MAP, MNEMOS_SHARD="1", MNEMOS_REDIS_URL=MAP["1"]["redis_url"]))
    assert settings.redis_url == MAP["1"]["redis_url"]


def test_a_child_of_another_shard_is_not_handed_this_process_s_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.settings import child_environment

    monkeypatch.setenv("MNEMOS_REDIS_URL", MAP["0"]["redis_url"])  # agrees with shard 0's map entry
    parent = Settings.from_env(_env(MAP, MNEMOS_REDIS_URL=MAP["0"]["redis_url"]))
    child = Settings.from_env(child_environment(parent.for_shard(2)))
    assert (child.shard, child.redis_url) == (2, MAP["2"]["redis_url"])


def test_every_client_gets_one_redis_per_shard_from_the_map() -> None:
    # the CLI's client and the MCP server's build on the same connections: each shard's own server
    from workers.runtime.connections import client_connections

    connections = client_connections(Settings.from_env(_env(MAP)))
    assert isinstance(connections, list)
    assert [c.connection_pool.connection_kwargs["port"] for c in connections] == [7000, 7001, 7002]
    single = client_connections(Settings.from_env({}))
    assert not isinstance(single, list)


def test_the_cli_client_waits_for_a_moved_tenant_as_long_as_move_wait_s_says() -> None:
    # new-operator session: move_wait_s was a MnemosClient argument only, so the CLI and the MCP server
    # always waited 30 s for a tenant being moved
    from workers.runtime.connections import settings_client

    settings = Settings.from_env(_env(MAP, MNEMOS_MOVE_WAIT_S="2.5"))
    assert settings.move_wait_s == 2.5
    client = settings_client(settings)
    assert client.directory is not None and client.directory.wait_s == 2.5
    with pytest.raises(SettingsError, match="move_wait_s must be a number of seconds >= 0"):
        Settings.from_env(_env(MAP, MNEMOS_MOVE_WAIT_S="-1"))
