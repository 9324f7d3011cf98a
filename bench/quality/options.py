"""What a ``mnemos bench quality`` run runs (:class:`QualityOptions`), read by :mod:`bench.quality.run` and
by the document it writes (:mod:`bench.quality.document`)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.common.corpora import CorpusMode
from bench.common.stats import DEFAULT_RESAMPLES
from bench.quality.arms import ARM_NAMES
from bench.quality.engine import Protocol

__all__ = ["QualityOptions"]


@dataclass(frozen=True)
class QualityOptions:
    """What to run. ``full_features``: ``"auto"`` selects on the dev split (needs the held-out
    protocol), ``"none"`` makes ``mnemos_full`` equal to ``+clustered_rif_gap``. ``variant_modes``:
    the corpus modes the variants run on (empty: ``modes``); each must be one of ``modes``."""

    arms: tuple[str, ...] = ARM_NAMES
    modes: tuple[CorpusMode, ...] = (CorpusMode.PER_TENANT, CorpusMode.POOLED)
    protocols: tuple[Protocol, ...] = (Protocol.HELDOUT, Protocol.TRANSDUCTIVE)
    burnin_factor: float = 5.0
    clusters: int = 30
    queries_per_cluster: int = 17
    bootstrap_factor: int = 10
    seed: int = 0
    n_resamples: int = DEFAULT_RESAMPLES
    abstain_threshold: float = 0.0
    dedupe_threshold: float | None = 0.95
    limit: int | None = None
    full_features: str = "auto"
    alpha: float = 0.05
    suppression_study: bool = False
    variant_modes: tuple[CorpusMode, ...] = ()

    def __post_init__(self) -> None:
        if not set(self.variant_modes) <= set(self.modes):
            raise ValueError(f"variant corpus modes {[m.value for m in self.variant_modes]} must be among "
                             f"{[m.value for m in self.modes]}")
        unknown = [a for a in self.arms if a not in ARM_NAMES]
        if unknown:
            raise ValueError(f"unknown arms {unknown}; known: {', '.join(ARM_NAMES)}")
        if self.full_features not in ("auto", "none"):
            raise ValueError(f"full_features must be 'auto' or 'none', got {self.full_features!r}")
        if self.burnin_factor < 0:
            raise ValueError(f"burnin_factor must be >= 0, got {self.burnin_factor}")
