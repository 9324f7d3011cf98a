"""What ``mnemos bench packets`` selects from one question's reranked pool (:class:`RankedPool`): per
budget, the packet, the top-k list and the top-k list priced like a packet (:func:`choose`). Used by
the bench (:mod:`bench.packets.run`) and by its knob study (:mod:`bench.packets.knobs`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mnemos.packets import Candidate, PacketConfig, build_packet, cost_in
from mnemos.supersession import SupersessionTable

__all__ = ["RankedPool", "choose", "topk_within_budget"]


def topk_within_budget(candidates: Sequence[Candidate], budget_tokens: int,
                       flat_tokens: Sequence[int] | None = None) -> list[int]:
    """Entry ids of ``candidates`` (best first) kept in rank order while they fit ``budget_tokens``.

    With ``flat_tokens`` (one per candidate) an item costs that (a flat list's line); without, it
    is priced as in a packet: its line, plus its session header the first time the header is used.
    """
    kept, used, headers = [], 0, set()
    for row, c in enumerate(candidates):
        cost = flat_tokens[row] if flat_tokens is not None else cost_in(c, headers)
        if used + cost <= budget_tokens:
            kept.append(c.entry_id)
            used += cost
            headers.add(c.header)
    return kept


@dataclass(frozen=True)
class _Selections:
    """Per budget, the entry ids of the packet, of the top-k list (flat lines) and of the top-k
    list priced like a packet (``topk_grouped``) for one question."""

    packet: dict[int, frozenset[int]]
    topk: dict[int, frozenset[int]]
    topk_grouped: dict[int, frozenset[int]]


@dataclass(frozen=True)
class RankedPool:
    """One question's reranked candidates (best first), their embeddings ``(n, dim)``, the packet
    configuration fitting its scores (min-max relevance when nothing was reranked) and each
    candidate's tokens as a flat list's line (:func:`mnemos.packets.render_item`)."""

    candidates: list[Candidate]
    embeddings: np.ndarray
    config: PacketConfig
    flat_tokens: tuple[int, ...]


def choose(pool: RankedPool, budgets: Sequence[int], packet: PacketConfig | None = None,
           supersessions: SupersessionTable | None = None) -> _Selections:
    """Per budget, the packet (``packet`` knobs, default the pool's) and the top-k list of ``pool``."""
    config = pool.config if packet is None else dataclasses.replace(packet, relevance=pool.config.relevance)
    chosen, topk, grouped = {}, {}, {}
    for budget in budgets:
        built = build_packet(pool.candidates, pool.embeddings, budget, config, supersessions=supersessions)
        assert built.used_tokens <= budget
        chosen[budget] = frozenset(item.entry_id for item in built.items)
        topk[budget] = frozenset(topk_within_budget(pool.candidates, budget, pool.flat_tokens))
        grouped[budget] = frozenset(topk_within_budget(pool.candidates, budget))
    return _Selections(chosen, topk, grouped)
