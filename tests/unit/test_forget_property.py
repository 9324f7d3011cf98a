"""Property test (hypothesis): after a forget, no retrieval path returns what it covered, and
nothing else is lost (docs/architecture.md "Forget").

A random conversation of one tenant (near-duplicates become aliases, so promotion is exercised)
goes through the ingest worker into the in-memory store; the query service answers once (its
tenant index and rerank cache warm up), suppression scores are added, then a random forget (the
tenant, a session, or some turn ids) is applied. Afterwards every path is asked: the service with
and without filters and ``as_of``, and the core pipeline on the service's refreshed index with
BM25 alone, dense alone, hybrid without reranking, reranking with a forced deep pass, and the
post-rerank features. No hit (nor its aliases) may be a forgotten turn, no hit may show a text only
forgotten turns had, the rerank cache may hold no such text, no suppression score may name a
forgotten entry; and every surviving turn is still stored and still found.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.schemas import RetrievalFilters, RetrievalRequest
from mnemos.features import Feature, FeatureSetting
from mnemos.filters import EntryFilter
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Hit
from mnemos.rendering import render_turn
from tests.unit.worker_fakes import (
    BASE_TIME,
    RecordingRedis,
    forget_message,
    ingest_worker,
    query_service,
    turn_message,
)
from workers.store import FakeStore

BASES = ("I adopted a grey cat named Pixel", "My brother Tomas moved to Porto", "I started learning the cello",
         "My cello teacher is strict", "We hiked the Douro valley in May", "My pin code is 4417")
SESSIONS = ("s1", "s2", "s3")

turns_strategy = st.lists(st.tuples(st.integers(0, len(BASES) - 1), st.integers(0, 2), st.sampled_from(SESSIONS)),
                          min_size=2, max_size=10)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[tuple[str, str, str, int]], tuple[str, object]]:
    raw = draw(turns_strategy)
    turns = [(f"t{i}", BASES[base] + "!" * bang, session, i) for i, (base, bang, session) in enumerate(raw)]
    scope = draw(st.sampled_from(("tenant", "session", "turns")))
    if scope == "session":
        return turns, ("session", draw(st.sampled_from(SESSIONS)))
    if scope == "turns":
        ids = draw(st.lists(st.sampled_from([t[0] for t in turns]), min_size=1, max_size=len(turns), unique=True))
        return turns, ("turns", tuple(ids))
    return turns, ("tenant", None)


def _covered(turn: tuple[str, str, str, int], scope: tuple[str, object]) -> bool:
    kind, value = scope
    if kind == "tenant":
        return True
    if kind == "session":
        return turn[2] == value
    assert isinstance(value, tuple)
    return turn[0] in value


def _check(hits: list[Hit] | tuple, forgotten_ids: set[str], forgotten_texts: set[str]) -> set[str]:
    """Assert no hit shows forgotten content; returns the turn ids the hits stand for."""
    seen: set[str] = set()
    for hit in hits:
        ids = {hit.turn_id, *hit.aliases}
        assert not ids & forgotten_ids, (ids, forgotten_ids)
        assert hit.text not in forgotten_texts
        seen |= ids
    return seen


CONFIGS = {
    "bm25": RetrievalConfig(use_dense=False, rerank=False),
    "dense": RetrievalConfig(use_bm25=False, rerank=False),
    "hybrid": RetrievalConfig(rerank=False),
    "rerank-deep": RetrievalConfig(deep_threshold=1e9, pool_size=2, deep_pool_size=30),
    "features": RetrievalConfig(features=(FeatureSetting(Feature.SESSION, {"top": 1, "weight": 2.0}),
                                          FeatureSetting(Feature.TEMPORAL, {"slack_days": 7, "weight": 2.0}))),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.sampled_from(BASES))
def test_after_a_forget_no_retrieval_path_returns_it(case: tuple, query: str) -> None:
    turns, scope = case
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message(f"{minute + 1}-0", "alice", turn_id, text, session=session, minutes=minute)
                   for turn_id, text, session, minute in turns])
    service = query_service(store, redis)
    service.answer(RetrievalRequest("alice", query, k=20))  # warm index and rerank cache
    with store.tenant("alice") as tx:
        ids = {r.turn_id: r.entry_id for r in tx.entries_after(0)}
        tx.add_suppression({(entry_id, 0): 0.5 for entry_id in ids.values()})

    kind, value = scope
    forget = forget_message("100-0", "alice", session=value if kind == "session" else None,
                            turn_ids=value if kind == "turns" else None)  # type: ignore[arg-type]
    worker.handle([forget])

    forgotten = {t[0] for t in turns if _covered(t, scope)}
    surviving = {t[0] for t in turns} - forgotten
    forgotten_texts = {t[1] for t in turns if t[0] in forgotten} - {t[1] for t in turns if t[0] in surviving}
    with store.tenant("alice") as tx:
        assert {r.turn_id for r in tx.entries_after(0)} == surviving
        assert not {e for e, _ in tx.suppression_scores()} & {ids[t] for t in forgotten}

    seen = _check(service.answer(RetrievalRequest("alice", query, k=20)).hits, forgotten, forgotten_texts)
    for session in SESSIONS:
        _check(service.answer(RetrievalRequest("alice", query, k=20, filters=RetrievalFilters(session_ids=(session,))))
               .hits, forgotten, forgotten_texts)
    as_of = BASE_TIME + timedelta(minutes=len(turns) // 2)
    _check(service.answer(RetrievalRequest("alice", query, k=20, as_of=as_of)).hits, forgotten, forgotten_texts)
    assert service.rerank_cache is not None
    assert not any(service.rerank_cache.pairs_of(render_turn("user", text, None)) for text in forgotten_texts)

    state = service.cache.get("alice")
    if not surviving:
        assert state is None or len(state.index) == 0
        return
    assert state is not None
    vector = service.encoder.encode([query])[0]
    for name, config in CONFIGS.items():
        for allowed in (None, EntryFilter(as_of=as_of), EntryFilter(session_ids=frozenset({"s1"}))):
            result = retrieve(state.index, query, vector, k=20, config=config, reranker=service.reranker,
                              reference_time=as_of, allowed=allowed)
            found = _check(list(result.hits), forgotten, forgotten_texts)
            if name == "hybrid" and allowed is None:
                seen |= found
    assert seen == surviving  # nothing else is lost: every surviving turn is still found
