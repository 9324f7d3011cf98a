"""Clustered retrieval-induced forgetting: update rules, suppression scores, query clusters.

Source: §3.2-§3.4 and Algorithm 1 of *Clustered Retrieval-Induced Forgetting*
(docs/architecture.md "Suppression").

* After a reranked retrieval, every pool entry d_i gets a delta on its score for the query's
  cluster c(q): Eq. 1 (uniform) or Eq. 2 (rank-gap, the default). The deltas are computed
  from an :class:`~mnemos.records.Outcome` as data (:func:`outcome_deltas`) and applied by a
  separate step (:meth:`SuppressionTable.apply`), so the service can ship them through a stream
  and apply them exactly once.
* At retrieval time the penalty ``alpha * s(d_i)_c`` is subtracted from the fused score before
  the pool is cut (the pipeline does that with :meth:`SuppressionTable.penalty`).
* Clusters are k-means centroids of the first ``10 x K`` query embeddings, then frozen
  (§3.4 of the paper and its post-submission note on query-based clustering). K = 1 is global
  suppression: every query is cluster 0 from the start.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum

import numpy as np

from mnemos.errors import DimensionMismatchError, InvalidParameterError
from mnemos.records import Outcome

logger = logging.getLogger(__name__)


class UpdateRule(StrEnum):
    """Which suppression update rule to use (§3.3 of *Clustered Retrieval-Induced Forgetting*)."""

    UNIFORM = "uniform"
    """Eq. 1: every pool entry, weighted by how high it started."""
    RANK_GAP = "rank_gap"
    """Eq. 2: only entries that dropped in rank, weighted by the size of the drop."""


DEFAULT_UPDATE_RULE = UpdateRule.RANK_GAP
"""The update rule of the service and of the paper's best arm (Eq. 2)."""
DEFAULT_ETA = 0.1
"""Learning rate eta of the update rules (§4.3 of the paper)."""
DEFAULT_CLUSTERS_K = 30
"""Query clusters K (§4.3: K = 30 at 500 queries; 1 is global suppression)."""
DEFAULT_BOOTSTRAP_FACTOR = 10
"""Clusters are fitted after ``DEFAULT_BOOTSTRAP_FACTOR * K`` query embeddings, then frozen."""


def _sigmoid(x: float) -> float:
    """Numerically stable logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _check(initial_rank: int, final_rank: int, rerank_score: float, pool_size: int, eta: float) -> None:
    if pool_size < 1:
        raise InvalidParameterError(f"pool_size must be >= 1, got {pool_size}")
    for name, rank in (("initial_rank", initial_rank), ("final_rank", final_rank)):
        if not 1 <= rank <= pool_size:
            raise InvalidParameterError(f"{name} must be in 1..{pool_size} (1-based), got {rank}")
    if eta < 0 or not math.isfinite(eta):
        raise InvalidParameterError(f"eta must be a finite number >= 0, got {eta}")
    if not math.isfinite(rerank_score):
        raise InvalidParameterError(f"rerank_score must be finite, got {rerank_score}")


def uniform_delta(initial_rank: int, final_rank: int, rerank_score: float, pool_size: int, eta: float) -> float:
    """Eq. 1 of *Clustered Retrieval-Induced Forgetting*: ``eta * (1 - r_init / P) * sigmoid(-s_xenc)``.

    ``final_rank`` is accepted for a uniform signature and not used. Ranks are 1-based, so the
    top initial rank gets weight ``1 - 1/P`` and the last one weight 0.

    Raises:
        InvalidParameterError: if a rank is outside ``1..pool_size``, ``pool_size < 1``,
            ``eta < 0`` or the score is not finite.
    """
    _check(initial_rank, final_rank, rerank_score, pool_size, eta)
    return eta * (1.0 - initial_rank / pool_size) * _sigmoid(-rerank_score)


def rank_gap_delta(initial_rank: int, final_rank: int, rerank_score: float, pool_size: int, eta: float) -> float:
    """Eq. 2 of *Clustered Retrieval-Induced Forgetting*: ``eta * max(0, r_final - r_init) / P * sigmoid(-s_xenc)``.

    Zero for entries that kept or improved their rank.

    Raises:
        InvalidParameterError: as :func:`uniform_delta`.
    """
    _check(initial_rank, final_rank, rerank_score, pool_size, eta)
    return eta * max(0, final_rank - initial_rank) / pool_size * _sigmoid(-rerank_score)


DeltaRule = Callable[[int, int, float, int, float], float]

UPDATE_RULES: dict[UpdateRule, DeltaRule] = {
    UpdateRule.UNIFORM: uniform_delta,
    UpdateRule.RANK_GAP: rank_gap_delta,
}
"""The update rule function of each :class:`UpdateRule`."""


def outcome_deltas(
    outcome: Outcome, rule: UpdateRule, eta: float, cluster: int | None = None
) -> dict[tuple[int, int], float]:
    """Suppression deltas of one outcome: ``{(entry_id, cluster): delta}`` (Algorithm 1, l. 9-12).

    P is ``outcome.pool_size``. ``cluster`` overrides ``outcome.cluster`` (the suppression worker
    may assign it after bootstrap); when both are None the outcome carries no cue and gives
    ``{}``. Deltas of one key are summed and zero deltas are dropped.

    Raises:
        InvalidParameterError: if a pool row has a rank outside ``1..pool_size``, or ``eta < 0``.
        KeyError: if ``rule`` is not an :class:`UpdateRule`.
    """
    target = outcome.cluster if cluster is None else cluster
    if target is None:
        return {}
    fn = UPDATE_RULES[UpdateRule(rule)]
    deltas: dict[tuple[int, int], float] = {}
    for row in outcome.pool:
        delta = fn(row.initial_rank, row.final_rank, row.rerank_score, outcome.pool_size, eta)
        if delta != 0.0:
            key = (row.entry_id, target)
            deltas[key] = deltas.get(key, 0.0) + delta
    return deltas


class SuppressionTable:
    """In-memory suppression scores ``{(entry_id, cluster): score}`` of one tenant; missing = 0."""

    def __init__(self, scores: Mapping[tuple[int, int], float] | None = None) -> None:
        self._scores: dict[tuple[int, int], float] = dict(scores or {})

    def __len__(self) -> int:
        return len(self._scores)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._scores)

    def penalty(self, entry_id: int, cluster: int) -> float:
        """Suppression score s(d)_c of ``entry_id`` in ``cluster`` (0.0 when never suppressed)."""
        return self._scores.get((entry_id, cluster), 0.0)

    def apply(self, deltas: Mapping[tuple[int, int], float]) -> None:
        """Add each delta to its ``(entry_id, cluster)`` score (Algorithm 1, line 11)."""
        for key, delta in deltas.items():
            self._scores[key] = self._scores.get(key, 0.0) + delta

    def scores(self) -> dict[tuple[int, int], float]:
        """A copy of every stored score."""
        return dict(self._scores)


class QueryClusters:
    """Query clusters for cue-dependent suppression (§3.4 of *Clustered Retrieval-Induced Forgetting*).

    Embeddings passed to :meth:`observe` are buffered until ``k * bootstrap_factor`` are held;
    k-means (scikit-learn, ``n_init`` fixed, ``random_state=seed``) then fits ``k`` centroids,
    which are L2-normalised and frozen. ``k == 1`` is global suppression: frozen from the start,
    no centroids, every query is cluster 0.

    Attributes:
        frozen: True once centroids are fixed (always True for k == 1).
        centroids: ``(k, dim)`` float32 unit rows, or None before bootstrap (and for k == 1).
    """

    def __init__(self, k: int = DEFAULT_CLUSTERS_K, bootstrap_factor: int = DEFAULT_BOOTSTRAP_FACTOR, seed: int = 0,
                 n_init: int = 10) -> None:
        if k < 1:
            raise InvalidParameterError(f"k must be >= 1, got {k}")
        if bootstrap_factor < 1:
            raise InvalidParameterError(f"bootstrap_factor must be >= 1, got {bootstrap_factor}")
        self.k = k
        self.bootstrap_factor = bootstrap_factor
        self.seed = seed
        self.n_init = n_init
        self.centroids: np.ndarray | None = None
        self.frozen = k == 1
        self._buffer: list[np.ndarray] = []

    @property
    def bootstrap_size(self) -> int:
        """Number of query embeddings buffered before k-means runs (``10 x K`` by default)."""
        return self.k * self.bootstrap_factor

    @property
    def n_buffered(self) -> int:
        """Query embeddings currently held in the bootstrap buffer."""
        return len(self._buffer)

    def buffer(self) -> np.ndarray:
        """The bootstrap buffer as an ``(n, dim)`` float32 array (a copy)."""
        if not self._buffer:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack(self._buffer).astype(np.float32)

    @staticmethod
    def _vector(query_embedding: np.ndarray) -> np.ndarray:
        vec = np.asarray(query_embedding, dtype=np.float32)
        if vec.ndim == 2 and vec.shape[0] == 1:
            vec = vec[0]
        if vec.ndim != 1 or vec.size == 0:
            raise DimensionMismatchError("query embedding", "(dim,)", tuple(vec.shape))
        return vec

    def observe(self, query_embedding: np.ndarray) -> bool:
        """Buffer one ``(dim,)`` query embedding; fit and freeze when the buffer is full.

        Does nothing once frozen. Returns True exactly when this call froze the centroids.

        Raises:
            DimensionMismatchError: if the embedding is not 1-D or differs in size from the buffer.
        """
        if self.frozen:
            return False
        vec = self._vector(query_embedding)
        if self._buffer and vec.shape[0] != self._buffer[0].shape[0]:
            raise DimensionMismatchError("query embedding", (self._buffer[0].shape[0],), tuple(vec.shape))
        self._buffer.append(vec.copy())
        if len(self._buffer) < self.bootstrap_size:
            return False
        self._fit()
        return True

    def _fit(self) -> None:
        data = np.stack(self._buffer).astype(np.float32)
        self.centroids = _normalise_rows(_kmeans_centres(data, self.k, self.n_init, self.seed))
        self.frozen = True
        self._buffer = []
        logger.info("query clusters frozen: k=%d from %d queries", self.k, data.shape[0])

    def assign(self, query_embedding: np.ndarray) -> int | None:
        """Cluster of a query: ``argmax_k q . c_k`` (ties: lowest k); None before bootstrap; 0 if k == 1.

        Raises:
            DimensionMismatchError: if the embedding size differs from the centroids'.
        """
        if self.k == 1:
            return 0
        if self.centroids is None:
            return None
        vec = self._vector(query_embedding)
        if vec.shape[0] != self.centroids.shape[1]:
            raise DimensionMismatchError("query embedding", (self.centroids.shape[1],), tuple(vec.shape))
        return int(np.argmax(self.centroids @ vec))

    @classmethod
    def from_centroids(cls, centroids: np.ndarray, bootstrap_factor: int = DEFAULT_BOOTSTRAP_FACTOR,
                       seed: int = 0) -> QueryClusters:
        """Frozen clusters from stored ``(k, dim)`` centroids (rows are re-normalised).

        Raises:
            DimensionMismatchError: if ``centroids`` is not a non-empty 2-D array.
        """
        arr = np.asarray(centroids, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise DimensionMismatchError("centroids", "(k, dim)", tuple(arr.shape))
        clusters = cls(k=arr.shape[0], bootstrap_factor=bootstrap_factor, seed=seed)
        clusters.centroids = _normalise_rows(arr)
        clusters.frozen = True
        return clusters


def warm_up_kmeans() -> None:
    """Fit a k-means of two points once and keep nothing: imports scikit-learn's k-means, so a
    worker that calls it at start does not make its first tenant's bootstrap wait seconds for the
    import. Logs nothing (no clusters were frozen)."""
    _kmeans_centres(np.eye(2, dtype=np.float32), k=2, n_init=1, seed=0)


def _kmeans_centres(data: np.ndarray, k: int, n_init: int, seed: int) -> np.ndarray:
    """``(k, dim)`` float32 k-means centres of ``(n, dim)`` ``data``; convergence warnings are logged."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(data)
    for warning in caught:
        logger.warning("k-means bootstrap: %s", warning.message)
    return np.asarray(model.cluster_centers_, dtype=np.float32)


def _normalise_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(matrix / norms, dtype=np.float32)
