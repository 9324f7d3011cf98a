"""The records of ``mnemos bench service`` (:mod:`bench.service.mainjob`) that its replay
(:mod:`bench.service.mainjob_replay`) and its report (:mod:`bench.service.report`) read, and the phases'
progress bar, in a module of their own so that neither imports the main job back."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from api.schemas import Outcome as OutcomeMessage
from api.schemas import RetrievalResult
from bench.common.datasets import Conversation
from bench.common.questions import BenchQuestion
from workers.settings import Settings


@dataclass(frozen=True)
class TenantPlan:
    """One service tenant: its conversation, the half it burns in on, its draws and its evaluation."""

    tenant_id: str
    conversation: Conversation
    burn_half: int
    burn_in: tuple[BenchQuestion, ...]
    evaluate: tuple[BenchQuestion, ...]


@dataclass(frozen=True)
class Asked:
    """One question as the service answered it (``phase``: ``"burn-in"`` or ``"evaluation"``)."""

    tenant_id: str
    question: BenchQuestion
    phase: str
    latency_s: float
    result: RetrievalResult


@dataclass
class ServiceRecord:
    """Everything the replay and the report need from the service, read before it is torn down."""

    settings: Settings
    plans: list[TenantPlan]
    asked: list[Asked]
    outcomes: dict[str, OutcomeMessage]
    ledgers: dict[str, list[str]]
    entry_turns: dict[str, dict[int, str]]
    canonical: dict[str, dict[str, str]]
    embeddings: dict[str, dict[str, np.ndarray]]
    tenants: list[dict[str, Any]]
    centroids: dict[str, np.ndarray | None]
    ingest: dict[str, float]
    freshness_s: list[float]
    freshness_returned: int
    rerank_cache_hits: float | None
    phases_s: dict[str, float]


def progress_bar(total: int, description: str, unit: str) -> tqdm:
    """One phase's bar on stderr: redrawn every second on a terminal, a line every 15 s in a log."""
    interactive = sys.stderr.isatty()
    return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True,
                mininterval=1.0 if interactive else 15.0, leave=True)
