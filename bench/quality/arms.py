"""The benchmark's arms; the candidate features of ``mnemos_full`` are pure functions of the core.

An arm is a :class:`~mnemos.pipeline.RetrievalConfig` plus, for the suppression arms, how the
suppression state is kept (update rule, clustered or global). ``mnemos_full`` is the best arm of
*Clustered Retrieval-Induced Forgetting* (``+clustered_rif_gap``, §5.1) plus whichever candidate features the held-out
development split supports (``bench.quality.run`` runs that selection); the candidates come from
*AssoMem* (session-then-utterance retrieval, explicit temporal match, Personalized-PageRank
importance, §3.2.3) and the lethe research journal (adaptive deep pass, k_shallow 30 / k_deep 100);
see docs/architecture.md "Sources".

Every candidate except the deep pass re-scores the reranked pool after the cross-encoder:
``final = rerank_logit + sum(feature adjustments)``, then a stable re-sort. They never change
what the cross-encoder saw, so the suppression outcome (and thus the suppression state) of
``mnemos_full`` stays that of its retrieval configuration. The features live in the core
(:mod:`mnemos.features`, which the service's pipeline runs too).
"""

from __future__ import annotations

from dataclasses import dataclass

from mnemos.fusion import Fusion
from mnemos.pipeline import RetrievalConfig
from mnemos.suppression import DEFAULT_ETA, UpdateRule

__all__ = [
    "ARM_NAMES",
    "BASELINE_ARM",
    "CONVEX_ARM",
    "GAP_ARM",
    "FULL_ARM",
    "SUPPRESSION_ARMS",
    "Arm",
    "SuppressionSpec",
    "arm_by_name",
]

BASELINE_ARM = "hybrid_rerank"
"""The baseline of *Clustered Retrieval-Induced Forgetting* (§4.3): BM25 + dense, RRF, cross-encoder, no suppression."""
GAP_ARM = "+clustered_rif_gap"
"""The baseline with clustered rank-gap suppression (Eq. 2), the paper's best arm."""
CONVEX_ARM = "hybrid_convex"
"""BM25 + dense fused by a convex combination of min-max normalised scores, no rerank; its weight is
chosen per run on the dev split (:mod:`bench.quality.fusion_choice`), the registered 0.5 is a placeholder."""
FULL_ARM = "mnemos_full"
"""The best arm of this project: ``+clustered_rif_gap`` with the features its selection kept (:mod:`bench.quality.selection`)."""


@dataclass(frozen=True)
class SuppressionSpec:
    """How an arm keeps suppression state: the update rule, whether it is cue-dependent, and the
    learning rate its outcomes are applied with.

    ``clustered`` False is global RIF (one cluster, K = 1); True uses k-means query clusters.
    """

    rule: UpdateRule
    clustered: bool
    eta: float = DEFAULT_ETA


@dataclass(frozen=True)
class Arm:
    """One benchmark arm: a retrieval configuration and, optionally, a suppression spec."""

    name: str
    config: RetrievalConfig
    suppression: SuppressionSpec | None = None

    @property
    def reranks(self) -> bool:
        """True when the arm's pool goes through the cross-encoder."""
        return self.config.rerank


_SHALLOW = RetrievalConfig(deep_threshold=None, suppression=False)
_SHALLOW_SUPPRESSED = RetrievalConfig(deep_threshold=None)  # the four suppression arms' configuration
_ARMS: tuple[Arm, ...] = (
    Arm("bm25", RetrievalConfig(use_dense=False, rerank=False, suppression=False, deep_threshold=None)),
    Arm("dense", RetrievalConfig(use_bm25=False, rerank=False, suppression=False, deep_threshold=None)),
    Arm("hybrid_rrf", RetrievalConfig(rerank=False, suppression=False, deep_threshold=None)),
    Arm(CONVEX_ARM, RetrievalConfig(fusion=Fusion.CONVEX, rerank=False, suppression=False, deep_threshold=None)),
    Arm("dense_rerank", RetrievalConfig(use_bm25=False, suppression=False, deep_threshold=None)),
    Arm(BASELINE_ARM, _SHALLOW),
    Arm("+global_rif", _SHALLOW_SUPPRESSED, SuppressionSpec(UpdateRule.RANK_GAP, clustered=False)),
    Arm("+clustered_rif_uniform", _SHALLOW_SUPPRESSED, SuppressionSpec(UpdateRule.UNIFORM, clustered=True)),
    Arm("+clustered_rif_gap", _SHALLOW_SUPPRESSED, SuppressionSpec(UpdateRule.RANK_GAP, clustered=True)),
    Arm("mnemos_full", _SHALLOW_SUPPRESSED, SuppressionSpec(UpdateRule.RANK_GAP, clustered=True)),
)
ARM_NAMES: tuple[str, ...] = tuple(a.name for a in _ARMS)
"""Every arm, in report order."""
SUPPRESSION_ARMS: tuple[str, ...] = tuple(a.name for a in _ARMS if a.suppression is not None)

DEEP_CONFIG = RetrievalConfig(deep_threshold=0.0, deep_pool_size=100)
"""``+clustered_rif_gap`` with the adaptive deep pass (pool 30, deep 100). The threshold 0 logits is
a fallback: the engine uses each reranker fold's calibrated threshold from its provenance."""


def arm_by_name(name: str, *, deep_pass: bool = False) -> Arm:
    """The arm called ``name``; ``deep_pass`` swaps ``mnemos_full``'s config for :data:`DEEP_CONFIG`.

    Global RIF uses the rank-gap rule: the post-submission notes of *Clustered Retrieval-Induced Forgetting* report
    global RIF with rank-gap, the rule the service ships.

    Raises:
        KeyError: for an unknown arm name (the message lists the known ones).
    """
    for arm in _ARMS:
        if arm.name == name:
            if deep_pass and name == "mnemos_full":
                return Arm(name, DEEP_CONFIG, arm.suppression)
            return arm
    raise KeyError(f"unknown arm {name!r}; known: {', '.join(ARM_NAMES)}")
