"""The Redis client every mnemos process builds from its settings (one place for timeouts and TLS)."""

from __future__ import annotations

import redis

from workers.settings import Settings


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


__all__ = ["client_connections", "redis_client"]


def client_connections(settings: Settings) -> redis.Redis | list[redis.Redis]:
    """What a :class:`api.client.MnemosClient` is built on: with a shard map, one Redis client per
    shard, each on that shard's own server (index = shard); else the one Redis client."""
    if settings.shard_map is None:
        return redis_client(settings)
    return [redis_client(settings.for_shard(shard)) for shard in range(settings.shards)]
