"""A small simulation of shard loads and of what moves when a shard is added (docs/scaling.md
"Sizing a shard, and how many" and "Adding shards: consistent hashing or a directory table").

    python -m bench.scale.shard_sim [--tenants 100000] [--seed 0] [--json bench/results/shard_sim.json]

Tenants get sizes (stored turns) from a Pareto law (shape ``alpha``, scaled so the median tenant
holds ``median_turns``; a few tenants are very large, as in any multi-tenant service). For
each shard count N the tenants are placed two ways:

* **ring**: ``api.sharding``'s consistent-hash ring (what the service does): a tenant's shard is a
  function of its id alone;
* **directory**: a table tenant -> shard, filled greedily (largest tenant first onto the least
  loaded shard), as an operator-maintained directory would be.

Reported per N: the heaviest shard's turns and tenants over the mean (1.0 is perfect balance);
and for N -> N + 1 the share of tenants and of turns that move. On the ring, the movers are the
tenants whose successor point now belongs to the new shard (about 1 / (N + 1) of them), all to
the new shard; with a directory, the operator chooses whom to move: here, the largest tenants that
fit under the new mean load, each from a shard left no lighter than the new one.
Pure computation, seeded: the same arguments give the same numbers.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import numpy as np

from api.sharding import ShardRing

SHARD_COUNTS = (2, 4, 8, 16, 32, 64, 100)


def tenant_sizes(tenants: int, *, alpha: float = 1.2, median_turns: float = 500.0, seed: int = 0) -> np.ndarray:
    """``(tenants,)`` int64 stored turns per tenant: Pareto(``alpha``) scaled to the median, at least 1."""
    rng = np.random.default_rng(seed)
    raw = rng.pareto(alpha, tenants) + 1.0  # Lomax + 1: Pareto with minimum 1, median 2 ** (1 / alpha)
    return np.maximum(1, np.round(raw * median_turns / 2 ** (1 / alpha))).astype(np.int64)


def ring_placement(ids: list[str], shards: int) -> np.ndarray:
    """``(tenants,)`` the ring's shard of each tenant id."""
    ring = ShardRing(shards)
    return np.fromiter((ring.shard_of(t) for t in ids), dtype=np.int64, count=len(ids))


def directory_placement(sizes: np.ndarray, shards: int) -> np.ndarray:
    """``(tenants,)`` a greedy directory: largest tenant first onto the least loaded shard."""
    placement = np.empty(len(sizes), dtype=np.int64)
    heap = [(0, shard) for shard in range(shards)]
    for index in np.argsort(-sizes, kind="stable"):
        load, shard = heapq.heappop(heap)
        placement[index] = shard
        heapq.heappush(heap, (load + int(sizes[index]), shard))
    return placement


def directory_grow(sizes: np.ndarray, placement: np.ndarray, shards: int) -> np.ndarray:
    """The directory after adding shard ``shards``: tenants moved to it, largest that fit first, from
    the heaviest shards, until it holds the mean load of ``shards + 1`` shards."""
    grown = placement.copy()
    target = sizes.sum() / (shards + 1)
    loads = np.bincount(placement, weights=sizes, minlength=shards)
    moved = 0.0
    for index in np.argsort(-sizes, kind="stable"):
        size = float(sizes[index])
        if moved + size > target:
            continue
        if loads[grown[index]] - size < moved + size:  # a donor never ends lighter than the new shard
            continue
        loads[grown[index]] -= size
        grown[index] = shards
        moved += size
    return grown


def _balance(sizes: np.ndarray, placement: np.ndarray, shards: int) -> dict[str, float]:
    turns = np.bincount(placement, weights=sizes, minlength=shards)
    tenants = np.bincount(placement, minlength=shards)
    return {"max_over_mean_turns": round(float(turns.max() / turns.mean()), 3),
            "min_over_mean_turns": round(float(turns.min() / turns.mean()), 3),
            "max_over_mean_tenants": round(float(tenants.max() / tenants.mean()), 3),
            "max_shard_turns": int(turns.max())}


def _moves(sizes: np.ndarray, before: np.ndarray, after: np.ndarray, new_shard: int) -> dict[str, object]:
    moved = before != after
    return {"tenants_moved_share": round(float(moved.mean()), 4),
            "turns_moved_share": round(float(sizes[moved].sum() / sizes.sum()), 4),
            "all_moves_to_new_shard": bool((after[moved] == new_shard).all())}


def simulate(tenants: int = 100_000, *, seed: int = 0, alpha: float = 1.2, median_turns: float = 500.0,
             shard_counts: tuple[int, ...] = SHARD_COUNTS) -> dict[str, object]:
    """Every figure of the module docstring, for each N in ``shard_counts`` (and N -> N + 1)."""
    sizes = tenant_sizes(tenants, alpha=alpha, median_turns=median_turns, seed=seed)
    ids = [f"tenant-{seed}-{n}" for n in range(tenants)]
    rows = []
    for shards in shard_counts:
        ring_now, ring_next = ring_placement(ids, shards), ring_placement(ids, shards + 1)
        directory_now = directory_placement(sizes, shards)
        rows.append({"shards": shards,
                     "ring": {**_balance(sizes, ring_now, shards),
                              "add_one": {"expected_share": round(1 / (shards + 1), 4),
                                          **_moves(sizes, ring_now, ring_next, shards)}},
                     "directory": {**_balance(sizes, directory_now, shards),
                                   "add_one": _moves(sizes, directory_now,
                                                     directory_grow(sizes, directory_now, shards), shards)}})
    return {"command": "python -m bench.scale.shard_sim " + " ".join(sys.argv[1:]),
            "tenants": tenants, "seed": seed, "pareto_alpha": alpha, "median_turns": median_turns,
            "turns": int(sizes.sum()), "largest_tenant_turns": int(sizes.max()),
            "largest_tenant_share": round(float(sizes.max() / sizes.sum()), 4),
            "p99_tenant_turns": int(np.percentile(sizes, 99)), "by_shards": rows}


def markdown(result: dict) -> str:
    """The table docs/scaling.md quotes."""
    lines = [f"{result['tenants']:,} tenants, Pareto alpha {result['pareto_alpha']}, median "
             f"{result['median_turns']:.0f} turns, {result['turns']:,} turns (largest tenant "
             f"{result['largest_tenant_turns']:,}, p99 {result['p99_tenant_turns']:,}), seed {result['seed']}", "",
             "| N | ring: max/mean turns | ring: max/mean tenants | directory: max/mean turns | N -> N+1, ring: "
             "tenants / turns moved | directory: tenants / turns moved |", "|---|---|---|---|---|---|"]
    for row in result["by_shards"]:
        ring, directory = row["ring"], row["directory"]
        lines.append(f"| {row['shards']} | {ring['max_over_mean_turns']} | {ring['max_over_mean_tenants']} | "
                     f"{directory['max_over_mean_turns']} | {ring['add_one']['tenants_moved_share']:.2%} / "
                     f"{ring['add_one']['turns_moved_share']:.2%} | "
                     f"{directory['add_one']['tenants_moved_share']:.2%} / "
                     f"{directory['add_one']['turns_moved_share']:.2%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=1.2, help="Pareto shape of tenant sizes")
    parser.add_argument("--median-turns", type=float, default=500.0)
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)
    result = simulate(args.tenants, seed=args.seed, alpha=args.alpha, median_turns=args.median_turns)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = markdown(result)
    if args.markdown:
        args.markdown.write_text("# Shard loads and moves (`python -m bench.scale.shard_sim`)\n\n" + table, encoding="utf-8")
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
