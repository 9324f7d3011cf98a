"""One shard's figures in the fault run's shards phase (:mod:`bench.faults.shards`), in a module of
their own so that the phase report (:class:`bench.faults.run.PhaseReport`) can hold them without
importing the phase back."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ShardFigures"]


@dataclass
class ShardFigures:
    """One shard's figures in the shards phase (seconds are wall-clock seconds of one retrieval)."""

    shard: int
    tenants: int = 0
    turns: int = 0  # turns accepted for this shard's tenants
    lost: int = 0
    duplicated: int = 0
    answered: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # error class -> retrievals
    answered_during: int = 0  # answered retrievals begun while shard DOWN's Redis was down
    failed_during: int = 0
    unavailable_named: int = 0  # failures raised as ShardUnavailable naming this shard
    max_fail_s: float = 0.0
    p50_before_s: float | None = None
    p95_before_s: float | None = None
    p50_during_s: float | None = None
    p95_during_s: float | None = None
    p50_after_s: float | None = None
    p95_after_s: float | None = None

    def summary(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.0f}ms"

        return (f"shard{self.shard}[turns={self.turns} lost={self.lost} duplicated={self.duplicated} "
                f"answered={self.answered} failed={self.failed or '{}'} answered_during={self.answered_during} "
                f"failed_during={self.failed_during} shard_unavailable_named={self.unavailable_named} "
                f"max_fail_s={self.max_fail_s:.2f} p50/p95 before={ms(self.p50_before_s)}/{ms(self.p95_before_s)} "
                f"during={ms(self.p50_during_s)}/{ms(self.p95_during_s)} "
                f"after={ms(self.p50_after_s)}/{ms(self.p95_after_s)}]")
