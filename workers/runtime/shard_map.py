"""The shard map: which Redis and which Postgres serve each shard (``MNEMOS_SHARD_MAP``, docs/scaling.md).

A deployment past one machine gives every shard its own Redis (with a replica) and its own Postgres
server or database. The map is JSON, or YAML when PyYAML is installed (the service image has only
JSON), either inline or in a file whose path is the setting's value; a file is read once, when the
settings are built (:class:`workers.settings.Settings` keeps its text, so child processes and
``Settings.replace`` never read it again)::

    {"0": {"redis_url": "redis://redis-0:6379/0", "database_url": "postgresql://pg-0/mnemos"},
     "1": {"redis_url": "redis://redis-1:6379/0", "database_url": "postgresql://pg-1/mnemos"}}

A map must name exactly the shards ``0 .. MNEMOS_SHARDS - 1``, and no two shards may share a Redis
URL or a database URL (two shards on one server are one failure domain: use one shard, or give
each its own database). Every problem is refused with one line naming it (:class:`SettingsError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.runtime.errors import SettingsError
from workers.runtime.redaction import redact_url
from workers.runtime.server_urls import check_database_url, check_redis_url

VAR = "MNEMOS_SHARD_MAP"


@dataclass(frozen=True)
class ShardServers:
    """The servers of one shard: its Redis URL and its Postgres URL."""

    shard: int
    redis_url: str
    database_url: str


def map_text(value: str) -> str:
    """The map's text: ``value`` itself when it is inline (starts with ``{``, spans lines, or is
    YAML with ``": "`` and no such file), else the content of the file it names. Raises SettingsError when that file cannot be read."""
    stripped = value.strip()
    if stripped.startswith(("{", "[")) or "\n" in stripped or (": " in stripped and not Path(stripped).exists()):
        return stripped
    try:
        return Path(stripped).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{VAR}={stripped!r} is neither an inline JSON map nor a readable file: "
                            f"{exc.strerror or exc}") from None


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as json_error:
        try:
            import yaml  # optional: the dev extra has it, the service image does not
        except ModuleNotFoundError:
            raise SettingsError(f"{VAR} is not valid JSON ({json_error}) and PyYAML is not installed "
                                "to read it as YAML") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsError(f"{VAR} is neither valid JSON nor valid YAML: {' '.join(str(exc).split())}") from None


def parse_shard_map(text: str, shards: int) -> tuple[ShardServers, ...]:
    """The servers of shards ``0 .. shards - 1``, in shard order, from the map's ``text``.

    Raises SettingsError (one line) when the map is not a mapping of shard -> ``redis_url`` and
    ``database_url``, names a shard ``MNEMOS_SHARDS`` does not have, leaves one out, gives two
    shards the same URL, or holds a URL redis-py or libpq could not use.
    """
    loaded = _load(text)
    if not isinstance(loaded, dict) or not loaded:
        raise SettingsError(f"{VAR} must map each shard number to its redis_url and database_url")
    servers: dict[int, ShardServers] = {}
    for key, entry in loaded.items():
        shard = _shard_number(key)
        if not 0 <= shard < shards:
            raise SettingsError(f"{VAR} names shard {shard}, which MNEMOS_SHARDS={shards} does not have "
                                f"(shards are 0..{shards - 1})")
        if shard in servers:
            raise SettingsError(f"{VAR} names shard {shard} twice")
        if not isinstance(entry, dict) or set(entry) != {"redis_url", "database_url"} \
                or not all(isinstance(v, str) and v.strip() for v in entry.values()):
            raise SettingsError(f"{VAR} shard {shard} must have exactly a redis_url and a database_url, "
                                "both non-empty strings")
        servers[shard] = ShardServers(shard, entry["redis_url"].strip(), entry["database_url"].strip())
        check_redis_url(servers[shard].redis_url, f"{VAR} shard {shard} redis_url")
        check_database_url(servers[shard].database_url, f"{VAR} shard {shard} database_url")
    missing = [s for s in range(shards) if s not in servers]
    if missing:
        raise SettingsError(f"{VAR} names {len(servers)} shard(s) but MNEMOS_SHARDS={shards}: no servers for "
                            f"shard {', '.join(map(str, missing))}")
    ordered = tuple(servers[s] for s in range(shards))
    for what in ("redis_url", "database_url"):
        seen: dict[str, int] = {}
        for entry in ordered:
            url = getattr(entry, what)
            if url in seen:
                raise SettingsError(f"{VAR} gives shards {seen[url]} and {entry.shard} the same {what} "
                                    f"{redact_url(url)!r}: each shard needs its own server or database")
            seen[url] = entry.shard
    return ordered


def _shard_number(key: object) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    raise SettingsError(f"{VAR} names shard {key!r}, which is not a shard number")


__all__ = ["VAR", "ShardServers", "map_text", "parse_shard_map"]
