"""bench/scale/shard_sim.py: seeded, the ring moves about 1 / (N + 1) of the tenants and only to the new
shard, a greedy directory balances a light-tailed mix, and the committed numbers are its output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.scale import shard_sim

COMMITTED = Path(__file__).resolve().parents[2] / "bench" / "results" / "shard_sim.json"


def test_ring_moves_only_to_the_new_shard_and_about_its_share() -> None:
    result = shard_sim.simulate(4000, seed=1, alpha=3.0, shard_counts=(4,))
    ring = result["by_shards"][0]["ring"]
    assert ring["add_one"]["all_moves_to_new_shard"]
    assert abs(ring["add_one"]["tenants_moved_share"] - 0.2) < 0.04
    assert ring["max_over_mean_tenants"] < 1.15


def test_directory_balances_and_fills_the_new_shard_from_the_others() -> None:
    sizes = shard_sim.tenant_sizes(3000, alpha=3.0, seed=2)
    placement = shard_sim.directory_placement(sizes, 4)
    loads = np.bincount(placement, weights=sizes, minlength=4)
    assert loads.max() / loads.mean() < 1.01
    grown = shard_sim.directory_grow(sizes, placement, 4)
    moved = grown != placement
    assert (grown[moved] == 4).all()
    assert 0.15 < sizes[moved].sum() / sizes.sum() <= 0.2


def test_seeded_and_the_committed_result_has_every_shard_count() -> None:
    assert shard_sim.simulate(500, seed=3, shard_counts=(2,)) == shard_sim.simulate(500, seed=3, shard_counts=(2,))
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert [row["shards"] for row in committed["by_shards"]] == list(shard_sim.SHARD_COUNTS)
    assert all(row["ring"]["add_one"]["all_moves_to_new_shard"] for row in committed["by_shards"])
