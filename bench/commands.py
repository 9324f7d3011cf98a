"""The command groups the benchmark part adds to the ``mnemos`` CLI, as entry-point plugins.

``pyproject.toml`` declares them under the entry-point group ``mnemos.commands``
(:data:`workers.cli.COMMANDS_GROUP`): ``bench`` (quality, pair, service, speed, speed-report, scale, faults, packets,
precision, mcp), ``reranker``
(train, check, pools, pools-compare) and ``data`` (fetch). The service CLI finds them through the installed
distribution's metadata and never imports this package by name, so the service image, which
installs neither extra, simply has no such commands.

Importing this module checks that the ``bench`` extra is installed and raises
:class:`ModuleNotFoundError` naming it otherwise (the CLI then leaves the groups out). The
``train`` extra is checked when ``mnemos reranker train`` runs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from bench.common.extras import require_extra

require_extra("bench")

from bench.common.fetch import data  # noqa: E402 (after the extra check, on purpose)
from bench.faults.cli import faults  # noqa: E402
from bench.packets.cli import packets  # noqa: E402
from bench.quality.cli import quality  # noqa: E402
from bench.quality.pair import pair  # noqa: E402
from bench.quality.precision_check import precision  # noqa: E402
from bench.scale.cli import scale  # noqa: E402
from bench.service.mainjob import service  # noqa: E402
from bench.speed.mcp_latency import mcp_latency  # noqa: E402
from bench.speed.run import speed, speed_report  # noqa: E402
from bench.training.cli import reranker  # noqa: E402
from bench.training.pools_cli import pools  # noqa: E402
from bench.training.pools_compare import pools_compare  # noqa: E402

__all__ = ["bench", "data", "reranker"]


def exit_on_sigterm() -> None:
    """Make SIGTERM raise :class:`SystemExit` (status 143) in this process.

    Python's default SIGTERM handling ends the process without unwinding, so a benchmark stopped
    by ``kill`` (or a CI timeout) left its workers' database, streams and queues behind. Raised as
    an exception, it runs the ``finally`` of :func:`bench.common.harness.running_service`, which
    stops the workers and removes what the run made. Only the main thread may set a handler, so
    elsewhere (a command invoked from a thread) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)


@click.group()
def bench() -> None:
    """Benchmarks: retrieval quality (and, from the service, speed)."""
    exit_on_sigterm()


bench.add_command(quality, "quality")
bench.add_command(service, "service")
bench.add_command(speed, "speed")
bench.add_command(speed_report, "speed-report")
bench.add_command(scale, "scale")
bench.add_command(faults, "faults")
bench.add_command(packets, "packets")
bench.add_command(precision, "precision")
bench.add_command(mcp_latency, "mcp")
bench.add_command(pair, "pair")

reranker.add_command(pools, "pools")  # bench/training/cli.py is full
reranker.add_command(pools_compare, "pools-compare")
