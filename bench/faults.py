"""Fault-injection runner: real worker processes, private Redis and Postgres, faults, then a count.

Promises 1, 2 and 5 of issue 4, checked from the ids:

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

``python -m bench.faults --turns 5000 --outcomes 2000 --kills 8`` runs a longer version and can
write the figures as Markdown (``--markdown bench/results/faults.md``). Fake models (hashing
encoder), loopback only, everything in one temporary directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from bench.fault_phases import run_outcomes, run_queries, run_turns
from bench.fault_run import FaultPlan, FaultRun, PhaseReport

__all__ = ["FaultPlan", "FaultRun", "PhaseReport", "main", "markdown", "run_outcomes", "run_queries", "run_turns"]


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
        else:
            checks = (f"answered {r.answered}, typed failures {r.typed_failures or '{}'}, untyped "
                      f"{len(r.untyped_failures)}, over timeout {r.overtime}, longest wait {r.max_wait_s:.1f}s, "
                      f"foreign hits {r.isolation_violations}, retry ok {r.retry_ok}")
        rows.append(f"| {r.phase} | {r.accepted} | {r.resent} | {r.kills} | {r.pauses} | {r.redis_restarts} | "
                    f"{r.postgres_restarts} | {len(r.worker_exits)} | {r.lost} | {r.duplicated} | {checks} | "
                    f"{r.seconds:.1f} |")
    server = f" Redis {redis_version}." if redis_version else ""
    intro = ("Real `mnemos worker <kind>` processes against a private Redis (append-only file, fsync always) "
             "and a private Postgres cluster, fake models. Per phase the faults fire while publishing: workers "
             "SIGKILLed and restarted, SIGSTOPped past the claim idle time then SIGCONTed, Redis SIGKILLed and "
             "restarted, Postgres crashed (`pg_ctl stop -m immediate`) and restarted. Lost / duplicated are "
             "counted from the turn and outcome ids; scores are compared with a recomputation from the "
             "published outcomes and from the ledger. `worker exits` counts workers that died on their own.")
    return "\n".join(["# Fault injection", "", intro, "", f"Command: `{command}` ({os.cpu_count()} cores)", "",
                      f"Plan: `{asdict(plan)}`.{server}", "", *rows, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = FaultPlan()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--phases", default="turns,outcomes,queries", help="comma-separated subset")
    parser.add_argument("--redis-server", default=None, help="redis-server binary (default: newest on PATH)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the figures here")
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the servers' files and worker logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plan = replace(defaults, **{k: getattr(args, k) for k in asdict(defaults)})
    phases = {"turns": run_turns, "outcomes": run_outcomes, "queries": run_queries}
    tmp = Path(tempfile.mkdtemp(prefix="mnemos-faults-", dir=args.workdir))
    tmp.chmod(0o755)  # the postgres user must reach its data directory inside
    try:
        with FaultRun(tmp, redis_binary=args.redis_server) as run:
            reports = [phases[name](run, plan) for name in args.phases.split(",")]
            version = ".".join(map(str, run.redis.version))
    finally:
        if args.keep:
            print(f"files and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for report in reports:
        print(report.line())
    if args.markdown is not None:
        command = "python -m bench.faults " + shlex.join(sys.argv[1:] if argv is None else argv)
        args.markdown.write_text(markdown(reports, plan, command, version))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
