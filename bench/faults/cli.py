"""Fault-injection runner: real worker processes, private Redis and Postgres, faults, then a count.

The promises of docs/architecture.md "Invariants" (exactly once, tenant isolation, a typed end to
every request), checked from the ids:

* **turns**: uniquely identified turns of several tenants (some near-duplicates that must become
  aliases, some exact re-sends, a few malformed ones that must become dead letters) are published
  while ``mnemos worker ingest`` processes are SIGKILLed and restarted, one is SIGSTOPped past the
  claim idle time and SIGCONTed, Redis is SIGKILLed and restarted (append-only file, fsync
  always) and Postgres is crashed (``pg_ctl stop -m immediate``) and restarted. Then every
  accepted turn must be in Postgres exactly once, as an entry or an alias.
* **outcomes**: the same faults against ``mnemos worker suppression`` processes; every accepted
  outcome must be in the ledger once and the scores must equal a recomputation from the
  published outcomes and from the ledger.
* **queries**: the same faults against ``mnemos worker query`` processes while clients ask; every
  request must end within its timeout with a result or a typed error, and a retry must succeed.
* **redis_empty**: turns through ingest workers while Redis restarts once, halfway, without its data
  (:mod:`bench.faults.redis_empty`); the workers recreate their consumer group and go on. Turns Redis
  held unacknowledged are lost upstream and counted apart; every turn published after the restart
  must be stored exactly once.
* **shards**: three shards, each on its own Redis and database, with an ingest and a query worker
  each, while shard 1's Redis is SIGKILLed for ``--shard-outage-s`` seconds and restarted
  (:mod:`bench.faults.shards`): per shard, turns lost and duplicated, retrievals answered and failed,
  the down shard's fast ShardUnavailable errors, and the healthy shards' latency before and during
  the outage.

``mnemos bench faults --turns 5000 --outcomes 2000 --kills 8`` runs a longer version and can
write the figures as Markdown (``--markdown bench/results/faults.md``). Fake models (hashing
encoder), loopback only, everything in one temporary directory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click

from bench.faults.phases import run_outcomes, run_queries, run_turns
from bench.faults.redis_empty import run_redis_empty
from bench.faults.run import FaultPlan, FaultRun, PhaseReport
from bench.faults.shards import DOWN, run_shards, shard_table

__all__ = ["FaultPlan", "FaultRun", "PhaseReport", "faults", "markdown", "run_outcomes", "run_queries",
           "run_redis_empty", "run_shards", "run_turns"]


def markdown(reports: Sequence[PhaseReport], plan: FaultPlan, command: str, redis_version: str = "") -> str:
    """The figures of a run as a Markdown table, with the command and the plan that produced them."""
    rows = ["| phase | accepted | re-sent | kills | pauses | redis restarts | postgres restarts | worker exits "
            "| lost | duplicated | checks | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        if r.phase == "turns":
            checks = (f"aliases {r.aliases}, dedupe violations {r.dedupe_violations}, dead letters "
                      f"{r.dead_letters_found}/{r.dead_letters_expected}")
        elif r.phase == "outcomes":
            checks = (f"score mismatches {r.score_mismatches}, ledger mismatches {r.ledger_mismatches}, "
                      f"bootstrap buffer violations {r.buffer_violations}")
        elif r.phase == "redis_empty":
            checks = (f"published before / after the empty restart {r.published_before} / {r.published_after}, "
                      f"lost upstream by Redis {r.upstream_lost} (of {r.unacked_at_restart} unacknowledged "
                      f"at the restart), aliases {r.aliases}, dedupe violations {r.dedupe_violations}")
        elif r.phase == "shards":
            checks = (f"shard {DOWN}'s Redis down {r.outage_s:g} s; retrievals answered {r.answered}, typed failures "
                      f"{r.typed_failures or '{}'}, untyped {len(r.untyped_failures)}, isolation violations "
                      f"{r.isolation_violations}, retry ok {r.retry_ok} (per shard below)")
        else:
            checks = (f"answered {r.answered}, typed failures {r.typed_failures or '{}'}, untyped "
                      f"{len(r.untyped_failures)}, over timeout {r.overtime}, longest wait {r.max_wait_s:.1f}s, "
                      f"foreign hits {r.isolation_violations}, retry ok {r.retry_ok}")
        rows.append(f"| {r.phase} | {r.accepted} | {r.resent} | {r.kills} | {r.pauses} | {r.redis_restarts} | "
                    f"{r.postgres_restarts} | {len(r.worker_exits)} | {r.lost} | {r.duplicated} | {checks} | "
                    f"{r.seconds:.1f} |")
    shards = [line for r in reports if r.phase == "shards" for line in ["", *shard_table(r)]]
    server = f" Redis {redis_version}." if redis_version else ""
    intro = ("Real `mnemos worker <kind>` processes against a private Redis (append-only file, fsync always) "
             "and a private Postgres cluster, fake models. Per phase the faults fire while publishing: workers "
             "SIGKILLed and restarted, SIGSTOPped past the claim idle time then SIGCONTed, Redis SIGKILLed and "
             "restarted, Postgres crashed (`pg_ctl stop -m immediate`) and restarted. Lost / duplicated are "
             "counted from the turn and outcome ids; scores are compared with a recomputation from the "
             "published outcomes and from the ledger. `worker exits` counts workers that died on their own. "
             "The redis_empty phase has no other fault: Redis restarts once, halfway, with its data files "
             "deleted; its lost / duplicated count the turns published after that restart, and the turns "
             "Redis lost with its data are counted apart, as lost upstream. The shards phase has no other fault "
             "either: three shards on their own Redis and database, shard 1's Redis SIGKILLed and restarted with "
             "its append-only file; latency is of answered retrievals begun before the outage (each tenant's "
             "first, a cold load, left out), during it and after it.")
    return "\n".join(["# Fault injection", "", intro, "", f"Command: `{command}` ({os.cpu_count()} cores)", "",
                      f"Plan: `{asdict(plan)}`.{server}", "", *rows, *shards, ""])


PHASES = {"turns": run_turns, "outcomes": run_outcomes, "queries": run_queries, "redis_empty": run_redis_empty,
          "shards": run_shards}


def run_faults(plan: FaultPlan, *, phases: Sequence[str], redis_server: str | None, markdown_path: Path | None,
               workdir: Path | None, keep: bool, command: str, echo: Any = click.echo) -> int:
    """Run ``phases`` (names of :data:`PHASES`) of ``plan`` in one temporary directory under ``workdir``.

    Prints one line per phase; writes the Markdown table to ``markdown_path`` when given (with
    ``command``). Returns 0 when every phase lost and duplicated nothing, else 1.
    """
    tmp = Path(tempfile.mkdtemp(prefix="mnemos-faults-", dir=workdir))
    tmp.chmod(0o755)  # the postgres user must reach its data directory inside
    try:
        with FaultRun(tmp, redis_binary=redis_server) as run:
            reports = [PHASES[name](run, plan) for name in phases]
            version = ".".join(map(str, run.redis.version))
    finally:
        if keep:
            echo(f"files and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for report in reports:
        echo(report.line())
    if markdown_path is not None:
        markdown_path.write_text(markdown(reports, plan, command, version))
    return 0 if all(r.ok for r in reports) else 1


def _plan_options(command: Any) -> Any:
    """One ``--name`` option per :class:`FaultPlan` field, typed and defaulted like the field."""
    for name, value in reversed(asdict(FaultPlan()).items()):
        command = click.option(f"--{name.replace('_', '-')}", name, type=type(value), default=value,
                               show_default=True)(command)
    return command


@click.command("faults")
@_plan_options
@click.option("--phases", default="turns,outcomes,queries,redis_empty,shards", show_default=True,
              help="comma-separated subset of turns, outcomes, queries, redis_empty, shards")
@click.option("--redis-server", default=None, help="redis-server binary (default: newest on PATH)")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the figures here")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="parent of the temporary directory")
@click.option("--keep", is_flag=True, help="keep the servers' files and worker logs")
def faults(phases: str, redis_server: str | None, markdown_path: Path | None, workdir: Path | None, keep: bool,
           **plan_values: Any) -> None:
    """Fault injection: real workers under SIGKILL, SIGSTOP, Redis and Postgres restarts; lost and
    duplicated turns and outcomes counted from their ids."""
    names = [p.strip() for p in phases.split(",") if p.strip()]
    unknown = sorted(set(names) - set(PHASES))
    if unknown:
        raise click.BadParameter(f"unknown phase {unknown[0]!r} (known: {', '.join(PHASES)})", param_hint="--phases")
    args = sys.argv[sys.argv.index("faults") + 1:] if "faults" in sys.argv else []
    sys.exit(run_faults(replace(FaultPlan(), **plan_values), phases=names, redis_server=redis_server,
                        markdown_path=markdown_path, workdir=workdir, keep=keep,
                        command="mnemos bench faults " + shlex.join(args)))
