"""The Redis client every mnemos process builds from its settings (one place for timeouts and TLS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from workers.settings import Settings

if TYPE_CHECKING:
    from api.client import MnemosClient


def redis_client(settings: Settings, **overrides: object) -> redis.Redis:
    """The Redis client of every mnemos process: ``redis_socket_timeout_s`` on every read (longer than
    any blocking read, checked by the settings), a TCP keepalive, and for ``rediss://`` the CA bundle
    ``redis_ca_file`` (system CAs when unset). ``overrides`` replace client arguments (``health``
    uses shorter timeouts; it never blocks)."""
    options: dict[str, object] = {"health_check_interval": 30, "socket_keepalive": True,
                                  "socket_timeout": settings.redis_socket_timeout_s,
                                  "socket_connect_timeout": min(10.0, settings.redis_socket_timeout_s)}
    if settings.redis_ca_file is not None:
        options["ssl_ca_certs"] = settings.redis_ca_file
    options.update(overrides)
    return redis.Redis.from_url(settings.redis_url, **options)  # type: ignore[arg-type]


def settings_client(settings: Settings) -> MnemosClient:
    """A :class:`api.client.MnemosClient` configured as the service is (``MNEMOS_*`` settings: Redis
    URL or shard map, stream prefix, queue, limits, timeouts, result TTL, shards, the wait for a tenant
    being moved): what the CLI and the MCP server use, and what code that shares the workers'
    environment should use (``settings_client(Settings.from_env())``)."""
    from api.client import MnemosClient
    from api.validation import limits_of

    return MnemosClient(client_connections(settings), stream_prefix=settings.stream_prefix,
                        queue_name=settings.queue_name, limits=limits_of(settings),
                        retrieve_timeout_s=settings.retrieve_timeout_s, job_timeout_s=settings.job_timeout_s,
                        result_ttl_s=settings.result_ttl_s, shards=settings.shards,
                        move_wait_s=settings.move_wait_s)


__all__ = ["client_connections", "redis_client", "settings_client"]


def client_connections(settings: Settings) -> redis.Redis | list[redis.Redis]:
    """What a :class:`api.client.MnemosClient` is built on: with a shard map, one Redis client per
    shard, each on that shard's own server (index = shard); else the one Redis client."""
    if settings.shard_map is None:
        return redis_client(settings)
    return [redis_client(settings.for_shard(shard)) for shard in range(settings.shards)]
