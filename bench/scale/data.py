"""The data of ``mnemos bench scale`` (:mod:`bench.scale.run`): LongMemEval turns, tenants and a Zipf mix.

* :func:`haystack_pool`: every haystack turn of a LongMemEval file once, in file order. The S file
  repeats sessions across questions (198,956 distinct turns of 245,625 counted per question), so
  turns are deduplicated by haystack session id and position in the session (the loader's turn id
  ``"<session id>:<index>"``); turns the service would refuse (text over ``MNEMOS_MAX_TEXT_BYTES``,
  blank) are left out and counted.
* :func:`cycled`: the first ``n`` turns of the pool, going round again when it has fewer. A copy
  of the ``c``-th round gets ids suffixed ``~c`` and ``" [copy c]"`` appended to its text: the
  number makes its dedupe signature differ from the original's (docs/architecture.md "Dedupe"),
  so a copy is stored as a turn of its own, not folded into the original as an alias.
* :func:`question_tenants`: one tenant per LongMemEval question, holding that question's haystack
  (as ``mnemos bench quality --corpus per_tenant`` does); with more tenants than questions the
  questions repeat as tenants ``<question id>~<round>``.
* :func:`zipf_draws`: which tenant each request goes to, Zipf-distributed over a seeded ranking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from api.errors import InvalidInputError
from api.schemas import Turn as WireTurn
from api.validation import Limits
from bench.common.datasets import Conversation, Turn
from bench.common.harness import turn_message

_T = TypeVar("_T")

COPY_MARGIN_BYTES = 32
"""Bytes kept free under the text limit so that ``" [copy c]"`` still fits."""


@dataclass(frozen=True)
class Pool:
    """Distinct publishable turns of a data set, in file order; ``refused`` counts those left out."""

    turns: tuple[Turn, ...]
    refused: int


def publishable(turn: Turn, limits: Limits) -> bool:
    """True when the service accepts ``turn`` (the client's own validation), with
    :data:`COPY_MARGIN_BYTES` to spare under the text limit."""
    if len(turn.text.encode("utf-8")) > limits.max_text_bytes - COPY_MARGIN_BYTES:
        return False
    try:
        WireTurn.parse({"v": 1, **turn_message("t", turn)}, limits)
    except InvalidInputError:
        return False
    return True


def haystack_pool(conversations: Sequence[Conversation], limits: Limits) -> Pool:
    """Every turn of every conversation once (by turn id: haystack session id and position), in
    order; turns the service would refuse are counted in ``refused``."""
    seen: set[str] = set()
    turns: list[Turn] = []
    refused = 0
    for conversation in conversations:
        for turn in conversation.turns:
            if turn.turn_id in seen:
                continue
            seen.add(turn.turn_id)
            if publishable(turn, limits):
                turns.append(turn)
            else:
                refused += 1
    return Pool(tuple(turns), refused)


def _rounds(items: Sequence[_T], n: int, empty: str) -> Iterator[tuple[int, _T]]:
    """``n`` times ``(round, item)``: ``items`` in order, round 0, then again round by round.

    Raises ValueError(``empty``) when ``items`` is empty and ``n`` > 0.
    """
    if n > 0 and not items:
        raise ValueError(empty)
    for number in range(n):
        round_, position = divmod(number, len(items))
        yield round_, items[position]


def cycled(turns: Sequence[Turn], n: int) -> list[Turn]:
    """``n`` turns: ``turns`` in order, then copies of them round by round (module docstring).

    Raises ValueError when ``turns`` is empty and ``n`` > 0.
    """
    out = []
    for round_, turn in _rounds(turns, n, "no turn to take from"):
        if round_:
            turn = dataclasses.replace(turn, turn_id=f"{turn.turn_id}~{round_}",
                                       session_id=f"{turn.session_id}~{round_}", text=f"{turn.text} [copy {round_}]")
        out.append(turn)
    return out


def question_tenants(conversations: Sequence[Conversation], n: int, limits: Limits) -> list[Conversation]:
    """``n`` tenants, one per LongMemEval question (its haystack, publishable turns only, and its
    question); question ``i % len(conversations)``, id suffixed ``~<round>`` after the first round.

    Raises ValueError when there is no conversation and ``n`` > 0.
    """
    tenants = []
    for round_, source in _rounds(conversations, n, "no conversation to make tenants of"):
        name = source.conversation_id if not round_ else f"{source.conversation_id}~{round_}"
        turns = tuple(t for t in source.turns if publishable(t, limits))
        questions = tuple(dataclasses.replace(q, conversation_id=name) for q in source.questions)
        tenants.append(Conversation(conversation_id=name, turns=turns, questions=questions))
    return tenants


def question_texts(conversations: Sequence[Conversation], n: int, seed: int) -> list[str]:
    """``n`` question texts: the distinct questions of ``conversations`` in a seeded order, repeated
    when there are fewer. Raises ValueError when there is none and ``n`` > 0."""
    texts = sorted({q.text for c in conversations for q in c.questions})
    if n > 0 and not texts:
        raise ValueError("the data has no question")
    order = np.random.default_rng(seed).permutation(len(texts))
    return [texts[order[i % len(texts)]] for i in range(n)]


def zipf_draws(n_tenants: int, n_requests: int, s: float, seed: int) -> np.ndarray:
    """The tenant index (``0 .. n_tenants - 1``) of each of ``n_requests`` requests, ``(n_requests,)`` int64.

    Tenants are ranked by a seeded permutation; rank ``r`` (1-based) is drawn with probability
    proportional to ``1 / r**s`` (a Zipf law bounded to ``n_tenants``). Same arguments, same draws.

    Raises ValueError when ``n_tenants`` < 1 or ``s`` < 0.
    """
    if n_tenants < 1 or s < 0:
        raise ValueError(f"need n_tenants >= 1 and s >= 0, got {n_tenants}, {s}")
    rng = np.random.default_rng(seed)
    tenant_of_rank = rng.permutation(n_tenants)
    weights = 1.0 / np.arange(1, n_tenants + 1, dtype=np.float64) ** s
    ranks = rng.choice(n_tenants, size=n_requests, p=weights / weights.sum())
    return tenant_of_rank[ranks].astype(np.int64)
