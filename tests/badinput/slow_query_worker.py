"""A real query worker process whose reranker is slow: ``python -m tests.badinput.slow_query_worker``.

Runs :func:`workers.launch.process.run_query` with settings from the environment (``MNEMOS_*``), but the
reranker is a :class:`mnemos.rerank.FakeReranker` that touches ``--marker`` when a rerank starts
and then sleeps ``--sleep-s`` seconds, so a test can SIGKILL the process in the middle of a
rerank. Test support only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mnemos.rerank import FakeReranker
from workers.settings import Settings, prepare_offline_models


class SlowReranker(FakeReranker):
    def __init__(self, marker: Path, sleep_s: float) -> None:
        super().__init__()
        self.marker = marker
        self.sleep_s = sleep_s

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        if query != "warm up":
            self.marker.write_text(query)
            time.sleep(self.sleep_s)
        return super().score(query, texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--sleep-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    prepare_offline_models()
    from workers.launch import process

    reranker = SlowReranker(args.marker, args.sleep_s)
    process.load_reranker = lambda _settings: reranker  # type: ignore[assignment]
    return process.run_query(Settings.from_env())


if __name__ == "__main__":
    sys.exit(main())
