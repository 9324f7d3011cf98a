"""Training-data licences of a cross-encoder, read from its ``mnemos_provenance.json``.

A model's weights derive from the data it was trained on, so the data's licence decides who may
ship it (docs/reranker.md "Licences"). Every model ``mnemos reranker train`` writes lists its
training sources with their SPDX licence ids under ``sources``; this module reads that list and
applies the project's rule: a source permits commercial use when its licence is one of
:data:`COMMERCIAL_USE_LICENCES`. The committed default model must have only such sources (a test
checks it), and loading any other model logs one warning naming the licence.

A provenance written before ``sources`` existed names LoCoMo in its ``data`` field: it is read as
a LoCoMo (CC-BY-NC-4.0) source; a provenance with neither is a source of unknown licence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMMERCIAL_USE_LICENCES",
    "DATASET_LICENCES",
    "TrainingSource",
    "restricted_sources",
    "training_sources",
]

COMMERCIAL_USE_LICENCES = frozenset({
    "MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "CC-BY-4.0", "CC-BY-3.0", "CC0-1.0",
})
"""SPDX ids of licences that let a company ship weights trained on the data (attribution at most)."""

DATASET_LICENCES = {"LoCoMo": "CC-BY-NC-4.0", "LongMemEval": "MIT"}
"""The licence of each dataset ``mnemos reranker train`` reads by name (JSONL pairs state theirs)."""

UNKNOWN = "unknown"


@dataclass(frozen=True)
class TrainingSource:
    """One training source of a model: its name (``LoCoMo``, ``LongMemEval``, a pairs file), its
    SPDX licence id (``unknown`` when not recorded) and how many items (conversations, questions,
    pairs) of it were used."""

    name: str
    licence: str
    n_items: int = 0

    @property
    def commercial_use(self) -> bool:
        """Whether the licence is one of :data:`COMMERCIAL_USE_LICENCES`."""
        return self.licence in COMMERCIAL_USE_LICENCES


def training_sources(provenance: Mapping[str, Any]) -> list[TrainingSource]:
    """The training sources a provenance record names (see the module docstring for old records).

    Returns an empty list for a model trained on nothing recorded (e.g. a provenance-less model
    directory: the caller decides what that means).
    """
    raw = provenance.get("sources")
    if isinstance(raw, list):
        out = []
        for item in raw:
            if isinstance(item, Mapping):
                items = item.get("items")
                out.append(TrainingSource(str(item.get("name", UNKNOWN)), str(item.get("licence", UNKNOWN)),
                                          len(items) if isinstance(items, list) else int(item.get("n_items", 0))))
        return out
    data = provenance.get("data")
    if isinstance(data, str) and "locomo" in data.lower():
        return [TrainingSource("LoCoMo", DATASET_LICENCES["LoCoMo"],
                               len(provenance.get("training_conversations") or []))]
    if provenance.get("training_conversations") or provenance.get("pairs_file"):
        return [TrainingSource(str(provenance.get("pairs_file") or "unnamed data"), UNKNOWN)]
    return []


def restricted_sources(provenance: Mapping[str, Any]) -> list[TrainingSource]:
    """The sources whose licence does not permit commercial use (unknown ones included)."""
    return [s for s in training_sources(provenance) if not s.commercial_use]
