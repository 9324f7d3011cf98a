"""RetrievalConfig.for_k: retrieve() with it returns min(k, allowed entries) hits for every k the API
accepts, with or without a reranker and a filter; the default k = 10 keeps the configured depths
(30 candidates, a pool of 30) and the configuration object itself."""

from __future__ import annotations

import pytest

from mnemos.errors import InvalidParameterError
from mnemos.filters import EntryFilter
from mnemos.fusion import reciprocal_rank_fusion
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import FakeReranker

from .conftest import build_index

NO_DEEP = RetrievalConfig(deep_threshold=None)
DEFAULT = RetrievalConfig()
QUERY = "topic3 item5 note"


def _texts(n: int) -> list[str]:
    """``n`` distinct turns; BM25 matches only some of them for :data:`QUERY`, dense ranks them all."""
    return [f"note {i} on topic{i % 17} with item{i % 23} and tag{i}" for i in range(n)]


def _retrieve(index, encoder, k, reranker, config, allowed=None):
    return retrieve(index, QUERY, encoder.encode([QUERY])[0], k=k, reranker=reranker, config=config.for_k(k),
                    outcome_id="o", allowed=allowed)


def _check(result, k: int, allowed_ids: set[int]) -> None:
    ids = [h.entry_id for h in result.hits]
    assert len(ids) == min(k, len(allowed_ids)), (k, len(ids), len(allowed_ids))
    assert len(set(ids)) == len(ids) and set(ids) <= allowed_ids
    assert [h.rank for h in result.hits] == list(range(1, len(ids) + 1))


@pytest.mark.parametrize("reranker", [None, FakeReranker()], ids=["fused", "reranked"])
@pytest.mark.parametrize("config", [DEFAULT, NO_DEEP], ids=["deep-pass", "no-deep-pass"])
def test_forty_distinct_turns_with_k_40_give_40_hits(encoder, reranker, config):
    index = build_index(_texts(40), encoder)
    _check(_retrieve(index, encoder, 40, reranker, config), 40, set(range(1, 41)))


@pytest.mark.parametrize("reranker", [None, FakeReranker()], ids=["fused", "reranked"])
@pytest.mark.parametrize("config", [DEFAULT, NO_DEEP], ids=["deep-pass", "no-deep-pass"])
def test_a_3000_turn_tenant_with_k_100_gives_100_hits(encoder, reranker, config):
    index = build_index(_texts(3000), encoder)
    result = _retrieve(index, encoder, 100, reranker, config)
    _check(result, 100, set(range(1, 3001)))
    if reranker is not None:
        assert result.pool_size >= 100


@pytest.mark.parametrize("reranker", [None, FakeReranker()], ids=["fused", "reranked"])
def test_every_k_from_1_to_100_matches_a_brute_force_count(encoder, reranker):
    texts = _texts(70)
    index = build_index(texts, encoder)  # sessions S1.. of three turns each (tests/unit/conftest.py)
    sessions = frozenset(f"S{i}" for i in range(1, 9))
    narrow = EntryFilter(session_ids=sessions)
    # the brute-force counts: every entry, and every entry whose turn is in one of the sessions
    everyone = {entry.entry_id for entry in index.entries()}
    in_sessions = {entry.entry_id for entry in index.entries() if entry.session_id in sessions}
    assert len(everyone) == 70 and len(in_sessions) == 24
    for config in (DEFAULT, NO_DEEP):
        for k in range(1, 101):
            _check(_retrieve(index, encoder, k, reranker, config), k, everyone)
            _check(_retrieve(index, encoder, k, reranker, config, allowed=narrow), k, in_sessions)


def test_the_default_k_keeps_the_configured_depths(encoder):
    """k = 10 reads 30 candidates per retriever and reranks a pool of 30, exactly as before k followed."""
    for config in (DEFAULT, NO_DEEP):
        for k in (1, 10, 30):
            assert config.for_k(k) is config
    assert (DEFAULT.for_k(31).n_candidates, DEFAULT.for_k(31).pool_size, DEFAULT.for_k(31).deep_pool_size) == (
        31, 31, 100)
    assert (NO_DEEP.for_k(100).pool_size, NO_DEEP.for_k(100).deep_pool_size) == (100, 100)
    index = build_index(_texts(3000), encoder)
    vector = encoder.encode([QUERY])[0]
    bm25 = [e for e, _ in index.bm25.search(QUERY, 30)]
    dense = [e for e, _ in index.dense.search(vector, 30)[0]]
    fused = [e for e, _ in reciprocal_rank_fusion([bm25, dense], k=60)]
    result = _retrieve(index, encoder, 10, FakeReranker(), NO_DEEP)
    assert result.pool_size == 30
    assert [row.entry_id for row in result.outcome.pool] == fused[:30]
    assert len(result.hits) == 10


def test_k_below_one_is_refused():
    with pytest.raises(InvalidParameterError):
        DEFAULT.for_k(0)
