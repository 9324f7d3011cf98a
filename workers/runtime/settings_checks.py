"""The settings' operating limits: timeouts, intervals, sizes and ports a deployment sets, checked
when :class:`workers.settings.Settings` is built, so a value that would break every request (a
result kept 0 s, a NaN timeout) stops the process at start with one line naming the knob, instead
of failing each retrieval later (found in a break-it session, 2026-12-07). Every integer knob's
lower bound is here, the retrieval sizes' too; the other retrieval knobs (weights, thresholds,
choices) are checked in ``Settings.__post_init__`` and again by the core's own configs.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from api.validation import MAX_WAIT_S
from workers.runtime.errors import SettingsError
from workers.runtime.redaction import redact_url

log = logging.getLogger(__name__)

INT_MINIMUMS = {name: 1 for name in (
    "n_candidates", "pool_size", "deep_pool_size", "clusters_k", "bootstrap_factor", "ingest_batch_size",
    "outcome_batch_size", "max_k", "default_k", "max_text_bytes", "rerank_windows", "reindex_batch_size",
    "encoder_batch_size", "rerank_batch_size", "rerank_max_length", "fake_encoder_dim", "max_query_bytes",
    "max_id_chars", "max_metadata_bytes", "result_ttl_s", "block_ms")} | {"claim_idle_ms": 0}
"""Integer knobs and their least value (a size, a count, seconds; ``claim_idle_ms`` 0 claims at once).
``result_ttl_s`` has no "keep for ever" (rq's -1): stored results hold turn text. ``block_ms`` 0
would block for ever (Redis), so every idle read would end at the socket timeout as if Redis were down."""

CLIENT_WAITS = ("retrieve_timeout_s", "mcp_ingest_wait_s")
"""Waits a client call makes, at most :data:`api.validation.MAX_WAIT_S` (the client refuses longer)."""

SECONDS_ABOVE_ZERO = ("intermediate_grace_s", "retrieve_timeout_s", "sample_interval_s")
"""Second knobs that must be finite and > 0."""

SECONDS_AT_LEAST_ZERO = ("move_wait_s", "mcp_ingest_wait_s", "max_future_skew_s", "claim_interval_s",
                         "trim_interval_s")
"""Second knobs that must be finite and >= 0 (0: at once, or no allowance)."""

PORTS = ("mcp_port", "mcp_metrics_port", "ingest_metrics_port", "query_metrics_port", "suppression_metrics_port")


def check_operating_limits(settings: Any) -> None:
    """Raise :class:`SettingsError` naming the first knob of ``settings`` (a :class:`workers.settings.Settings`,
    not imported here: it calls this) out of range: the Redis socket timeout
    (the URL's own ``socket_timeout`` wins) above every blocking read, TLS settings that fit the URL,
    the tables above, ``default_k`` within ``max_k``, rq's job timeout (>= 1 s, or -1 for none) and the dedupe threshold (0, 1]."""
    _check_socket_timeout(settings)
    if settings.redis_ca_file is not None and urlsplit(settings.redis_url).scheme != "rediss":
        raise SettingsError("MNEMOS_REDIS_CA_FILE is set but MNEMOS_REDIS_URL is not a rediss:// (TLS) URL")
    statement_s = settings.db_statement_timeout_s
    if statement_s is not None and not (math.isfinite(statement_s) and statement_s > 0):
        raise SettingsError(f"db_statement_timeout_s must be positive or none, got {statement_s}")
    for name, least in INT_MINIMUMS.items():
        if getattr(settings, name) < least:
            raise SettingsError(f"{name} must be >= {least}, got {getattr(settings, name)}")
    if not settings.default_k <= settings.max_k:
        raise SettingsError(f"default_k must be within 1..max_k, got {settings.default_k}")
    for names, strict in ((SECONDS_ABOVE_ZERO, True), (SECONDS_AT_LEAST_ZERO, False)):
        for name in names:
            value = getattr(settings, name)
            if not (math.isfinite(value) and (value > 0 if strict else value >= 0)):
                raise SettingsError(f"{name} must be a number of seconds {'>' if strict else '>='} 0, got {value}")
    for name in CLIENT_WAITS:
        if getattr(settings, name) > MAX_WAIT_S:
            raise SettingsError(f"{name} must be at most {MAX_WAIT_S:g} s (a client call's longest wait), "
                                f"got {getattr(settings, name)}")
    if settings.job_timeout_s < 1 and settings.job_timeout_s != -1:
        raise SettingsError(f"job_timeout_s must be >= 1 (seconds) or -1 (no timeout), got {settings.job_timeout_s}")
    if not 0.0 < settings.dedupe_threshold <= 1.0:  # False for NaN too
        raise SettingsError(f"dedupe_threshold must be in (0, 1], got {settings.dedupe_threshold}")
    if not math.isfinite(settings.alpha):
        raise SettingsError(f"alpha must be finite, got {settings.alpha}")
    for name in PORTS:
        if not 0 < getattr(settings, name) < 65536:
            raise SettingsError(f"{name} must be a TCP port (1..65535), got {getattr(settings, name)}")


def _check_socket_timeout(settings: Any) -> None:
    timeout_s = settings.redis_socket_timeout_s
    url_timeout = parse_qs(urlsplit(settings.redis_url).query).get("socket_timeout")
    if url_timeout:  # redis-py lets the URL's own socket_timeout win over the client's argument
        try:
            timeout_s = float(url_timeout[-1])
        except ValueError:
            raise SettingsError(f"MNEMOS_REDIS_URL={redact_url(settings.redis_url)!r} has a socket_timeout that is "
                                "not a number") from None
    source = "the socket_timeout of MNEMOS_REDIS_URL" if url_timeout else "MNEMOS_REDIS_SOCKET_TIMEOUT_S"
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise SettingsError(f"{source} must be a positive number of seconds, got {timeout_s}")
    for what, blocking_s in ((f"MNEMOS_BLOCK_MS ({settings.block_ms} ms, the stream workers' blocking read)",
                              settings.block_ms / 1000),
                             (f"the query worker's dequeue wait ({settings.dequeue_wait_s} s, a third of "
                              "MNEMOS_HEARTBEAT_TTL_S)", float(settings.dequeue_wait_s))):
        if timeout_s <= blocking_s:
            raise SettingsError(f"{source} ({timeout_s:g} s) must exceed {what}: an idle blocking read "
                                "would otherwise time out as if Redis were down")


KNOWN_ELSEWHERE = frozenset({"MNEMOS_MIGRATE_DATABASE_URL"})
"""``MNEMOS_*`` names that are not settings but may be in a worker's environment: a key of the
connections Secret that the migration Job maps to ``MNEMOS_DATABASE_URL`` (deploy/README.md)."""

# the variables Kubernetes injects for every Service of the namespace (service links), e.g. for the
# mnemos-query-metrics Service: MNEMOS_QUERY_METRICS_SERVICE_HOST, ..._PORT_9102_TCP_ADDR (break-it round 16)
_SERVICE_LINK = re.compile(r"_SERVICE_(HOST|PORT)(_[A-Z0-9_]+)?$|_PORT_\d+_(TCP|UDP|SCTP)(_[A-Z]+)?$")
_warned: set[str] = set()


def warn_unknown_variables(environ: Mapping[str, str], known: Collection[str]) -> list[str]:
    """Log one WARNING per ``MNEMOS_*`` variable of ``environ`` that no setting reads (a misspelt
    name is otherwise ignored without a word; new-user trial 2026-12-08), with the closest known
    name; returns the unknown names. Each name is warned about once per process."""
    unknown = sorted(name for name in environ if name.startswith("MNEMOS_") and name not in known
                     and name not in KNOWN_ELSEWHERE and not _SERVICE_LINK.search(name))
    for name in unknown:
        if name not in _warned:
            _warned.add(name)
            close = difflib.get_close_matches(name, list(known), n=1)
            log.warning("%s is not a Mnemos setting and is ignored%s", name,
                        f" (did you mean {close[0]}?)" if close else "")
    return unknown


__all__ = ["KNOWN_ELSEWHERE", "check_operating_limits", "warn_unknown_variables"]
