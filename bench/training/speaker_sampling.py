"""Orderings and seeded draws that prefer one speaker's turns (docs/reranker.md "Why the first LongMemEval model was weak").

Hard and model-ranked negatives are ordered this way and random and evidence negatives drawn so, so that a positive's negatives
share its speaker prefix and the prefix does not become a label.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

__all__ = ["speaker_first", "speaker_first_sample"]


def speaker_first(candidates: Sequence[str], speaker: str | None, speaker_of: Mapping[str, str | None]) -> list[str]:
    """``candidates`` with those whose ``speaker_of`` is ``speaker`` first, each part in its own order
    (``speaker`` None: unchanged)."""
    if speaker is None:
        return list(candidates)
    same: list[str] = []
    other: list[str] = []
    for candidate in candidates:
        (same if speaker_of[candidate] == speaker else other).append(candidate)
    return same + other


def speaker_first_sample(rng: random.Random, pool: Sequence[str], speaker: str | None,
                         speaker_of: Mapping[str, str | None], k: int) -> list[str]:
    """``k`` distinct passages drawn from ``pool`` by ``rng``: those whose ``speaker_of`` is ``speaker``
    first, topped up from the rest of ``pool`` when they run out (``speaker`` None: from all of it).
    Fewer when ``pool`` holds fewer than ``k``."""
    same = [x for x in pool if speaker_of[x] == speaker] if speaker is not None else []
    picked = rng.sample(same, min(k, len(same)))
    rest = [x for x in pool if x not in picked] if picked else list(pool)
    return picked + rng.sample(rest, min(k - len(picked), len(rest)))
