"""The packet knob study: which selection knobs fit evidence best, chosen on the dev split.

``mnemos bench packets`` scores every LoCoMo question's pool once and then, on those same pools,
builds packets for each point of :data:`KNOB_GRID` (MMR weight, session share, token exponent of
:class:`mnemos.packets.PacketConfig`) and compares each with the top-k list at the same budget.
The grid is read on the **dev split** of each conversation's questions (the seeded half that
:func:`bench.common.questions.prepare_questions` marks ``dev``, as the suppression study does) and the
other half is reported beside it but never used to choose, so the defaults of the service
(``MNEMOS_PACKET_*``, docs/architecture.md "Evidence packets") are picked without looking at the
questions the headline is read on. Numbers only; the choice is the mean over budgets of the dev
split's packet-minus-top-k evidence recall.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.packets.selection import RankedPool, choose
from mnemos.packets import PacketConfig
from mnemos.supersession import SupersessionTable

__all__ = ["KNOB_GRID", "StudyQuestion", "knob_study"]

KNOB_GRID: Mapping[str, tuple[float, ...]] = {
    "mmr_lambda": (0.7, 0.9, 1.0),
    "session_share": (0.5, 0.75),
    "token_exponent": (0.0, 0.5, 1.0),
}
"""Values tried per knob (every combination)."""


@dataclass(frozen=True)
class StudyQuestion:
    """One question of the study: its split, its relevant canonical entries and its scored pool."""

    dev: bool
    relevant: frozenset[int]
    pool: RankedPool
    supersessions: SupersessionTable | None = None


def _differences(questions: Sequence[StudyQuestion], budgets: Sequence[int], knobs: Mapping[str, float]
                 ) -> dict[str, dict[str, float]]:
    """Mean packet-minus-top-k evidence recall per split and budget for one knob setting."""
    sums: dict[str, dict[int, list[float]]] = {"dev": {b: [] for b in budgets}, "test": {b: [] for b in budgets}}
    for q in questions:
        chosen = choose(q.pool, budgets, dataclasses.replace(q.pool.config, **knobs), q.supersessions)
        for budget in budgets:
            gain = len(q.relevant & chosen.packet[budget]) - len(q.relevant & chosen.topk[budget])
            sums["dev" if q.dev else "test"][budget].append(gain / len(q.relevant))
    return {split: {str(b): float(np.mean(v)) if v else float("nan") for b, v in per.items()}
            for split, per in sums.items()}


def knob_study(questions: Sequence[StudyQuestion], budgets: Sequence[int], default: PacketConfig,
               grid: Mapping[str, Sequence[float]] = KNOB_GRID) -> dict[str, Any]:
    """Every knob combination of ``grid`` on ``questions``' pools: per split and budget, the mean of
    (packet evidence recall - top-k evidence recall); the combination with the best dev mean over
    budgets is ``chosen`` (ties: the earlier in grid order). Empty when there are no questions.
    """
    if not questions:
        return {}
    names = list(grid)
    rows = []
    for values in itertools.product(*(grid[n] for n in names)):
        knobs = dict(zip(names, values, strict=True))
        by_split = _differences(questions, budgets, knobs)
        dev_mean = float(np.mean(list(by_split["dev"].values())))
        rows.append({"knobs": knobs, "dev": by_split["dev"], "test": by_split["test"], "dev_mean": dev_mean})
    best = max(range(len(rows)), key=lambda i: (rows[i]["dev_mean"], -i))
    return {"split": "dev half of each conversation's questions chooses; the test half is reported only",
            "n_dev": sum(q.dev for q in questions), "n_test": sum(not q.dev for q in questions),
            "default": {n: getattr(default, n) for n in names}, "chosen": rows[best]["knobs"], "grid": rows}
