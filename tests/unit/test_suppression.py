"""Suppression rules (Clustered Retrieval-Induced Forgetting, Eq. 1 and Eq. 2) on a hand-worked example, the table, the clusters."""

import math

import numpy as np
import pytest

from mnemos import suppression
from mnemos.errors import DimensionMismatchError, InvalidParameterError
from mnemos.records import Outcome, PoolEntry

from .conftest import unit_rows

# Worked example: P = 5, eta = 0.1. sigma(1) = 0.7310586, sigma(-1) = 0.2689414,
# sigma(-2) = 0.1192029, sigma(0) = 0.5.
#  entry  r_init r_final  s_xenc   Eq. 1: eta (1 - r_init/P) sigma(-s)   Eq. 2: eta max(0, r_final - r_init)/P sigma(-s)
#  A=11     1      4      -1.0     0.1 * 0.8 * 0.7310586 = 0.05848469    0.1 * 3/5 * 0.7310586 = 0.04386351
#  D=14     2      3       0.0     0.1 * 0.6 * 0.5       = 0.03          0.1 * 1/5 * 0.5       = 0.01
#  E=15     3      2       1.0     0.1 * 0.4 * 0.2689414 = 0.01075766    0 (moved up)
#  B=12     4      1       2.0     0.1 * 0.2 * 0.1192029 = 0.00238406    0 (moved up)
#  C=13     5      5       0.0     0.1 * 0.0 * 0.5       = 0             0 (no drop)
ROWS = [
    PoolEntry(11, 1, 4, -1.0),
    PoolEntry(14, 2, 3, 0.0),
    PoolEntry(15, 3, 2, 1.0),
    PoolEntry(12, 4, 1, 2.0),
    PoolEntry(13, 5, 5, 0.0),
]
UNIFORM = {11: 0.05848469, 14: 0.03, 15: 0.01075766, 12: 0.00238406, 13: 0.0}
RANK_GAP = {11: 0.04386351, 14: 0.01, 15: 0.0, 12: 0.0, 13: 0.0}


def _outcome(cluster=7):
    return Outcome("o1", "t1", cluster, 5, tuple(ROWS))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: str(r.entry_id))
def test_rules_on_worked_example(row):
    args = (row.initial_rank, row.final_rank, row.rerank_score, 5, 0.1)
    assert suppression.uniform_delta(*args) == pytest.approx(UNIFORM[row.entry_id], abs=1e-8)
    assert suppression.rank_gap_delta(*args) == pytest.approx(RANK_GAP[row.entry_id], abs=1e-8)


def test_rules_are_chosen_by_enum():
    assert suppression.UPDATE_RULES[suppression.UpdateRule.UNIFORM] is suppression.uniform_delta
    assert suppression.UPDATE_RULES[suppression.UpdateRule.RANK_GAP] is suppression.rank_gap_delta
    assert set(suppression.UPDATE_RULES) == set(suppression.UpdateRule)
    assert suppression.UpdateRule("rank_gap") is suppression.UpdateRule.RANK_GAP


def test_outcome_deltas_rank_gap_drops_zeros_and_keys_by_cluster():
    deltas = suppression.outcome_deltas(_outcome(), suppression.UpdateRule.RANK_GAP, eta=0.1)
    assert set(deltas) == {(11, 7), (14, 7)}
    assert deltas[(11, 7)] == pytest.approx(0.04386351, abs=1e-8)
    assert deltas[(14, 7)] == pytest.approx(0.01, abs=1e-12)


def test_outcome_deltas_uniform():
    deltas = suppression.outcome_deltas(_outcome(), "uniform", eta=0.1)
    assert set(deltas) == {(11, 7), (14, 7), (15, 7), (12, 7)}
    assert sum(deltas.values()) == pytest.approx(sum(UNIFORM.values()), abs=1e-7)


def test_outcome_deltas_cluster_override_and_no_cue():
    assert suppression.outcome_deltas(_outcome(cluster=None), suppression.UpdateRule.RANK_GAP, 0.1) == {}
    deltas = suppression.outcome_deltas(_outcome(cluster=None), suppression.UpdateRule.RANK_GAP, 0.1, cluster=2)
    assert set(deltas) == {(11, 2), (14, 2)}


def test_outcome_deltas_sum_repeated_entries():
    outcome = Outcome("o", "t", 0, 4, (PoolEntry(1, 1, 4, 0.0), PoolEntry(1, 2, 4, 0.0)))
    # (3/4 + 2/4) * 0.1 * 0.5 = 0.0625
    assert suppression.outcome_deltas(outcome, suppression.UpdateRule.RANK_GAP, 0.1) == {(1, 0): pytest.approx(0.0625)}


@pytest.mark.parametrize(
    "args",
    [(0, 1, 0.0, 5, 0.1), (1, 6, 0.0, 5, 0.1), (1, 1, 0.0, 0, 0.1), (1, 1, 0.0, 5, -0.1), (1, 1, math.nan, 5, 0.1)],
)
def test_rules_reject_out_of_range_arguments(args):
    for rule in suppression.UPDATE_RULES.values():
        with pytest.raises(InvalidParameterError):
            rule(*args)


def test_extreme_logits_do_not_overflow():
    assert suppression.rank_gap_delta(1, 5, -1e4, 5, 0.1) == pytest.approx(0.1 * 4 / 5)
    assert suppression.rank_gap_delta(1, 5, 1e4, 5, 0.1) == pytest.approx(0.0, abs=1e-300)


def test_table_accumulates_and_defaults_to_zero():
    table = suppression.SuppressionTable()
    assert table.penalty(11, 7) == 0.0
    deltas = suppression.outcome_deltas(_outcome(), suppression.UpdateRule.RANK_GAP, 0.1)
    table.apply(deltas)
    table.apply(deltas)
    assert table.penalty(11, 7) == pytest.approx(0.08772703, abs=1e-8)
    assert table.penalty(11, 8) == 0.0  # another cluster is untouched (cue dependence)
    assert len(table) == 2 and table.scores()[(14, 7)] == pytest.approx(0.02)


def _blobs(rng, k, per, dim=16):
    centers = unit_rows(rng, k, dim)
    points = np.repeat(centers, per, axis=0) + 0.05 * rng.standard_normal((k * per, dim)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    labels = np.repeat(np.arange(k), per)
    order = rng.permutation(k * per)
    return points[order], labels[order]


def test_bootstrap_freezes_at_exactly_ten_times_k(rng):
    clusters = suppression.QueryClusters(k=3, seed=0)
    points, _ = _blobs(rng, 3, 10)
    assert clusters.bootstrap_size == 30
    for i, point in enumerate(points[:29]):
        assert clusters.observe(point) is False, i
        assert clusters.assign(point) is None
    assert not clusters.frozen and clusters.n_buffered == 29
    assert clusters.observe(points[29]) is True
    assert clusters.frozen and clusters.centroids.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(clusters.centroids, axis=1), 1.0, atol=1e-6)
    frozen = clusters.centroids.copy()
    assert clusters.observe(points[0]) is False  # frozen: further queries change nothing
    np.testing.assert_array_equal(clusters.centroids, frozen)


def test_clusters_separate_blobs_and_are_seeded(rng):
    points, labels = _blobs(rng, 4, 10)
    first, second = suppression.QueryClusters(k=4, seed=3), suppression.QueryClusters(k=4, seed=3)
    for point in points:
        first.observe(point)
        second.observe(point)
    np.testing.assert_array_equal(first.centroids, second.centroids)
    assigned = np.array([first.assign(p) for p in points])
    for label in range(4):  # each blob maps to one cluster, and blobs to distinct clusters
        assert len(set(assigned[labels == label])) == 1
    assert len(set(assigned)) == 4


def test_k1_is_global_suppression_without_bootstrap(rng):
    clusters = suppression.QueryClusters(k=1)
    assert clusters.frozen
    assert clusters.assign(unit_rows(rng, 1, 8)[0]) == 0
    assert clusters.observe(unit_rows(rng, 1, 8)[0]) is False


def test_degenerate_buffer_still_freezes(rng):
    clusters = suppression.QueryClusters(k=2, bootstrap_factor=2)
    point = unit_rows(rng, 1, 8)[0]
    for _ in range(4):
        clusters.observe(point)  # identical points: sklearn warns, we log and carry on
    assert clusters.frozen and clusters.assign(point) in (0, 1)


def test_from_centroids_and_dimension_checks(rng):
    centroids = np.eye(3, dtype=np.float32) * 2.0
    clusters = suppression.QueryClusters.from_centroids(centroids)
    assert clusters.frozen and clusters.k == 3
    assert clusters.assign(np.array([0.1, 0.9, 0.2], np.float32)) == 1
    with pytest.raises(DimensionMismatchError):
        clusters.assign(np.ones(4, np.float32))
    with pytest.raises(DimensionMismatchError):
        suppression.QueryClusters.from_centroids(np.ones(3, np.float32))
    open_clusters = suppression.QueryClusters(k=2)
    open_clusters.observe(np.ones(3, np.float32))
    with pytest.raises(DimensionMismatchError):
        open_clusters.observe(np.ones(4, np.float32))
    with pytest.raises(InvalidParameterError):
        suppression.QueryClusters(k=0)
