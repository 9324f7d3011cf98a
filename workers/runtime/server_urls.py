"""Checks of the connection URLs in the settings: refused when redis-py or libpq could not use them,
each in one line naming the variable, with the password masked."""

from __future__ import annotations

from urllib.parse import urlsplit

from workers.runtime.errors import SettingsError
from workers.runtime.redaction import redact_url


def check_redis_url(url: str, var: str = "MNEMOS_REDIS_URL") -> None:
    """Refuse a Redis URL redis-py cannot use (scheme, port), naming it with its password masked."""
    parts = urlsplit(url)
    if not url.startswith(("redis://", "rediss://", "unix://")):  # redis-py's own test (case and both slashes)
        raise SettingsError(f"{var}={redact_url(url)!r} is not a Redis URL: it must start with "
                            "redis://, rediss:// or unix://")
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise SettingsError(f"{var}={redact_url(url)!r} has a port that is not a number") from None


def check_database_url(url: str, var: str = "MNEMOS_DATABASE_URL") -> None:
    """Refuse a database URL libpq cannot parse: a URL with another scheme or a non-numeric port, or
    text that is neither a URL nor ``key=value`` pairs (the message masks the password)."""
    if "://" not in url:
        if "=" not in url:
            raise SettingsError(f"{var}={redact_url(url)!r} is neither a postgresql:// URL nor "
                                "key=value connection parameters")
        return
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise SettingsError(f"{var}={redact_url(url)!r} must start with postgresql:// or postgres://")
    if parts.netloc.count("@") > 1:  # libpq ends the password at the first '@' and prints the rest as the host
        raise SettingsError(f"{var}={redact_url(url)!r} has an '@' in its user or password: "
                            "percent-encode it as %40")
    hosts = parts.netloc.rsplit("@", 1)[-1]
    for host in hosts.split(","):
        tail = host.rsplit("]", 1)[-1]  # after an IPv6 literal
        port = tail.rpartition(":")[2] if ":" in tail else ""
        if port and not port.isdigit():
            raise SettingsError(f"{var}={redact_url(url)!r} has a port that is not a number")


__all__ = ["check_database_url", "check_redis_url"]
