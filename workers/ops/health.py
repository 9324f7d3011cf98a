"""``mnemos health``: can this process reach Redis and a migrated Postgres whose stored embeddings
fit its models, and which workers have live heartbeats?

One line per check (``ok`` or ``FAIL``) on stdout. When a check failed, one ``Error: ...`` line on
stderr names the failure behind the exit code, as every ``mnemos`` command ends an error
(:mod:`workers.cli`): exit code 2 when an operator must change something first (a missing or
unmigrated database, stored embeddings of another version, a model or model setting), else 1 (Redis
or Postgres unreachable, a required worker without a live heartbeat); 0 when every check passed.
With failures of both kinds the code is 2 and the line names the first such failure. Workers
are reported, not required: by default the command stays usable as the probe of one worker's pod
(it passes while Redis and Postgres are fine, whatever else runs). ``require`` names worker kinds
that must have a live heartbeat for the check to pass. Without models (``--no-models``, the pods'
probe) the stored embedding versions are reported but not compared. Every printed URL and error
has its password masked. With more than one shard, every line starts with the shard it checked
(``shard 1 redis: ...``): the Redis and Postgres of ``settings.shard`` (``mnemos health --shard``,
``--all-shards``), never a tenant.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

import redis

from api import sharding
from api.directory import FROZEN
from api.heartbeats import KINDS, WorkerBeat, worker_beats
from workers.runtime.connections import redis_client
from workers.runtime.errors import (
    EmbeddingVersionError,
    ModelSetupError,
    SettingsError,
    StoreError,
    StoreStateError,
)
from workers.runtime.exit_codes import EXIT_FAILED, EXIT_MISCONFIGURED
from workers.runtime.models import load_encoder, load_reranker
from workers.runtime.redaction import redact, redact_url, secrets_of
from workers.settings import Settings
from workers.store import PostgresStore, Store
from workers.store.schema import discover
from workers.store.state import EmbeddingVersion, check_schema, current_version, version_counts


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def run_health(settings: Settings, *, check_models: bool = True, require: Sequence[str] = (),
               echo: Callable[[str], None] = print, error: Callable[[str], None] = _to_stderr,
               clock: Callable[[], float] = time.time) -> int:
    """Print one line per check with ``echo`` and, when one failed, the ``Error: ...`` line with
    ``error``; returns the exit code: 0, 1 or 2 (see the module docstring)."""
    secrets = secrets_of([settings.redis_url, settings.database_url])
    failures: list[tuple[int, str]] = []  # (exit code, "name: detail") in check order
    label = f"shard {settings.shard} " if settings.shards > 1 else ""

    def report(name: str, passed: bool, detail: str, code: int = EXIT_FAILED) -> None:
        line = redact(f"{label}{name}: {' '.join(detail.split())}", secrets)
        echo(f"{'ok  ' if passed else 'FAIL'} {line}")
        if not passed:
            failures.append((code, line))

    connection = redis_client(settings, socket_connect_timeout=3, socket_timeout=3, health_check_interval=0)
    redis_ok = True
    try:
        connection.ping()
        report("redis", True, redact_url(settings.redis_url))
    except redis.RedisError as exc:
        report("redis", False, f"{redact_url(settings.redis_url)}: {exc}")
        redis_ok = False

    store: PostgresStore | None = None
    try:
        store = PostgresStore(settings.database_url, settings.db_app_role, max_size=1, timeout_s=3.0,
                      statement_timeout_s=settings.db_statement_timeout_s).open()
        check_schema(store)
        report("postgres", True, f"{redact_url(settings.database_url)}: migrated to {discover()[-1].version}")
    except (StoreError, StoreStateError) as exc:
        report("postgres", False, str(exc), EXIT_MISCONFIGURED if isinstance(exc, StoreStateError) else EXIT_FAILED)
        if store is not None:
            store.close()
        store = None

    version: EmbeddingVersion | None = None
    if check_models:
        try:
            encoder = load_encoder(settings)
            version = current_version(encoder.dim)
            precision = getattr(getattr(encoder, "precision", None), "value", None)  # None: the fake
            report("bi-encoder", True, f"{settings.bi_encoder} (dim {encoder.dim}"
                   + (f", {precision})" if precision else ")"))
            reranker = load_reranker(settings)
            report("cross-encoder", True, settings.cross_encoder or "none configured (no rerank)")
            del reranker
        except (ModelSetupError, SettingsError) as exc:  # SettingsError: fp16 where the device is the CPU
            report("models", False, str(exc), EXIT_MISCONFIGURED)

    if store is not None:
        try:
            _embeddings(store, version, report)
        finally:
            store.close()

    if redis_ok:
        for kind in KINDS:
            try:
                beats = worker_beats(connection, settings.stream_prefix, kind)
            except redis.RedisError as exc:
                report(f"{kind} workers", False, str(exc))
                continue
            live = [b for b in beats if b.live]
            report(f"{kind} workers", bool(live) or kind not in require, _describe(beats, clock()))
        if settings.shards > 1:  # a stopped move leaves its tenant frozen, its clients waiting
            report("tenant moves", True, _frozen(connection, settings))
    elif require:
        report("workers", False, "Redis is unreachable: no heartbeat can be read")
    connection.close()
    return _conclude(failures, error)


def _frozen(connection: redis.Redis, settings: Settings) -> str:
    """The tenants this shard's directory holds frozen (a move running, or stopped: its clients wait and
    then get TenantMoving until the same move runs again), or that there are none."""
    key = sharding.directory_key(settings.stream_prefix, settings.shard, settings.shards)
    try:
        frozen = sorted(_text(t) for t, v in connection.hgetall(key).items() if _text(v) == FROZEN)
    except redis.RedisError as exc:
        return f"cannot read the tenant directory: {exc}"
    if not frozen:
        return "no tenant frozen"
    shown = ", ".join(repr(t) for t in frozen[:5]) + (f" and {len(frozen) - 5} more" if len(frozen) > 5 else "")
    return (f"{len(frozen)} tenant(s) frozen by a move running or stopped: {shown} (`mnemos reshard where --tenant "
            "T`; run a stopped move again to finish it)")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _conclude(failures: list[tuple[int, str]], error: Callable[[str], None]) -> int:
    """The exit code of the failed checks (2 before 1); the ``Error:`` line names the first failure
    with that code and counts the others."""
    if not failures:
        return 0
    code = max(c for c, _ in failures)
    first = next(line for c, line in failures if c == code)
    others = len(failures) - 1
    error(f"Error: {first}" + (f" ({others} more failed check{'s' if others != 1 else ''} above)" if others else ""))
    return code


def _embeddings(store: Store, version: EmbeddingVersion | None, report: Callable[..., None]) -> None:
    try:
        counts = version_counts(store)
    except StoreError as exc:
        report("embeddings", False, str(exc))
        return
    ordered = sorted(counts.items(), key=lambda item: item[0].sort_key())
    stored = "; ".join(f"{v} ({n} tenant{'s' if n != 1 else ''})" for v, n in ordered
                       if v.dim is not None) or "none stored yet"
    if version is None:
        report("embeddings", True, f"stored: {stored} (not compared: models not loaded)")
        return
    for v, n in ordered:
        if not v.fits(version):
            assert version.dim is not None
            report("embeddings", False, str(EmbeddingVersionError(v.pair(), (version.rendering, version.dim),
                                                                  tenants=n, what="this configuration")),
                   EXIT_MISCONFIGURED)
            return
    report("embeddings", True, f"stored: {stored}; this configuration makes {version}")


def _describe(beats: list[WorkerBeat], now: float) -> str:
    if not beats:
        return "none seen"
    live = [b for b in beats if b.live]
    parts = [f"{b.name} ({'busy, ' if b.info.get('busy') else ''}beat {max(0.0, now - b.last_seen):.0f}s ago)"
             for b in live]
    dead = [b for b in beats if not b.live]
    if dead:
        parts.append(f"{len(dead)} stopped (last {dead[0].name}, {max(0.0, now - dead[0].last_seen):.0f}s ago)")
    return f"{len(live)} live: " + ", ".join(parts)
