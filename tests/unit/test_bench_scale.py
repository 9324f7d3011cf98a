"""The pure parts of ``mnemos bench scale``: turn pool, copies, tenants, Zipf draws, request summary,
phase selection and the report (the service runs are in tests/e2e/test_bench_scale.py)."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import click
import numpy as np
import pytest

from api.validation import Limits
from bench.common.datasets import Conversation, Question, Turn
from bench.scale.cli import parse_phases
from bench.scale.data import (
    COPY_MARGIN_BYTES,
    cycled,
    haystack_pool,
    question_tenants,
    question_texts,
    zipf_draws,
)
from bench.scale.probe import memory_of
from bench.scale.tenants import summarise_requests

T0 = datetime(2023, 5, 20, 2, 21, tzinfo=UTC)
LIMITS = Limits(max_text_bytes=200)


def _turn(session: str, position: int, text: str | None = None) -> Turn:
    return Turn(f"{session}:{position}", session, "user", text or f"{session} says {position}", T0)


def _conversation(name: str, sessions: list[str], question: str = "What?") -> Conversation:
    turns = tuple(_turn(s, i) for s in sessions for i in range(3))
    return Conversation(name, turns, (Question(f"{name}-q", name, question, frozenset(), None, None),))


def test_the_pool_holds_each_session_turn_once_and_counts_what_the_service_would_refuse() -> None:
    refused = Conversation("c", (_turn("long", 0, "x" * (LIMITS.max_text_bytes - COPY_MARGIN_BYTES + 1)),
                                 _turn("blank", 0, "   ")), ())
    pool = haystack_pool([_conversation("a", ["s1", "s2"]), _conversation("b", ["s2", "s3"]), refused], LIMITS)
    assert [t.turn_id for t in pool.turns] == [f"{s}:{i}" for s in ("s1", "s2", "s3") for i in range(3)]
    assert pool.refused == 2


def test_copies_get_their_own_ids_sessions_and_a_numbered_text() -> None:
    turns = [_turn("s", 0), _turn("s", 1)]
    out = cycled(turns, 5)
    assert [t.turn_id for t in out] == ["s:0", "s:1", "s:0~1", "s:1~1", "s:0~2"]
    assert out[2].session_id == "s~1" and out[2].text == "s says 0 [copy 1]"
    assert out[0] is turns[0] and len({t.turn_id for t in out}) == 5
    assert cycled(turns, 1) == turns[:1]
    with pytest.raises(ValueError):
        cycled([], 1)


def test_question_tenants_repeat_the_questions_under_new_ids() -> None:
    conversations = [_conversation("q1", ["a"], "Where?"), _conversation("q2", ["b"], "When?")]
    tenants = question_tenants(conversations, 3, LIMITS)
    assert [t.conversation_id for t in tenants] == ["q1", "q2", "q1~1"]
    assert tenants[2].turns == conversations[0].turns
    assert tenants[2].questions[0].conversation_id == "q1~1" and tenants[2].questions[0].text == "Where?"
    assert sorted(question_texts(conversations, 3, seed=0)[:2]) == ["When?", "Where?"]


def test_zipf_draws_are_seeded_and_favour_the_first_ranks() -> None:
    draws = zipf_draws(50, 5_000, 1.1, seed=3)
    assert draws.shape == (5_000,) and draws.dtype == np.int64
    assert np.array_equal(draws, zipf_draws(50, 5_000, 1.1, seed=3))
    assert not np.array_equal(draws, zipf_draws(50, 5_000, 1.1, seed=4))
    counts = np.sort(np.bincount(draws, minlength=50))[::-1]
    expected = 1 / np.arange(1, 51) ** 1.1
    assert counts[0] / 5_000 == pytest.approx(expected[0] / expected.sum(), abs=0.02)
    assert counts[0] > 5 * counts[25]
    assert set(np.unique(zipf_draws(3, 300, 0.0, seed=0))) == {0, 1, 2}  # s = 0 is uniform
    with pytest.raises(ValueError):
        zipf_draws(0, 1, 1.1, seed=0)


def _row(tenant: int, first: bool, hit: bool, seconds: float, load_s: float) -> dict:
    return {"tenant": tenant, "first": first, "hit": hit, "miss": not hit, "evictions": 0 if hit else 1,
            "seconds": seconds, "load_s": load_s, "cached_bytes": 10.0, "cached_tenants": 1.0}


def test_the_summary_separates_first_loads_reloads_and_hits() -> None:
    rows = [_row(0, True, False, 1.0, 0.5), _row(1, True, False, 1.0, 0.6), _row(0, False, True, 0.2, 0.01),
            _row(1, False, False, 0.9, 0.4)]
    summary = summarise_requests(rows)
    assert (summary["requests"], summary["hits"], summary["misses"], summary["tenants_requested"]) == (4, 1, 3, 2)
    assert summary["eviction_hit_rate"] == 0.25
    assert summary["hit_rate_without_eviction"] == 0.5
    assert summary["hit_rate_after_first_request"] == 0.5
    assert summary["reload_n"] == 1 and summary["reload_p50_s"] == 0.4
    assert summary["first_load_n"] == 2 and summary["first_load_p50_s"] == pytest.approx(0.55)
    assert summary["evictions"] == 3 and summary["request_n"] == 4
    assert summarise_requests([])["eviction_hit_rate"] is None


def test_phases_are_chosen_by_name_and_run_in_their_order() -> None:
    assert parse_phases("shards, large") == ("large", "shards")
    assert parse_phases("many") == ("many",)
    for bad in ("", "large,huge"):
        with pytest.raises(click.BadParameter):
            parse_phases(bad)


def test_memory_of_reads_this_process() -> None:
    memory = memory_of(os.getpid())
    if memory is None:
        pytest.skip("no /proc here")
    assert 0 < memory["rss_bytes"] <= memory["peak_rss_bytes"]
