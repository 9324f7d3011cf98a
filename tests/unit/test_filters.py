"""EntryFilter / TurnTable and filtered retrieval, against brute-force oracles (seeded).

Oracles: the allowed set is every entry with a turn ``EntryFilter.admits``; dense results equal a
fresh index built over the allowed entries only; BM25 results equal the unrestricted scores of a
fresh index over every entry, restricted to the allowed ones (IDF and length statistics are the
whole memory's, as documented in BM25Index.scores), and they match exactly the documents a fresh
allowed-only index matches.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest

from mnemos.bm25_index import BM25Index
from mnemos.dense_index import DenseIndex
from mnemos.errors import InvalidParameterError
from mnemos.features import Feature, FeatureSetting
from mnemos.filters import EntryFilter, TurnTable
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Entry, TurnFacts
from mnemos.rerank import FakeReranker
from mnemos.suppression import SuppressionTable
from mnemos.tenant_index import TenantIndex

T0 = datetime(2024, 1, 1, tzinfo=UTC)
WORDS = ("dog", "cat", "rex", "miso", "garden", "beach", "lisbon", "porto", "flight", "friday", "dentist",
         "tuesday", "roses", "tax", "sister", "coffee", "train", "paris", "movie", "book", "piano", "rain", "snow",
         "cake")
ROLES = ("user", "assistant", "tool")


def _world(rng: np.random.Generator, n: int = 150, tenant_id: str = "t1") -> list[Entry]:
    entries = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(2, 9)))
        entries.append(Entry(
            entry_id=i + 1, tenant_id=tenant_id, turn_id=f"u{i + 1}", session_id=f"S{int(rng.integers(1, 9))}",
            role=ROLES[int(rng.integers(0, 3))], text=" ".join(words),
            occurred_at=T0 + timedelta(hours=int(rng.integers(0, 24 * 60)))))
    return entries


def _filters(rng: np.random.Generator, count: int) -> list[EntryFilter]:
    out = []
    for _ in range(count):
        as_of = T0 + timedelta(hours=int(rng.integers(0, 24 * 60))) if rng.random() < 0.6 else None
        after = None
        if rng.random() < 0.4:
            after = T0 + timedelta(hours=int(rng.integers(0, 24 * 30)))
            if as_of is not None and after > as_of:
                after, as_of = as_of, after
        sessions = frozenset(f"S{s}" for s in rng.choice(range(1, 10), size=int(rng.integers(1, 4)))) \
            if rng.random() < 0.5 else None
        roles = frozenset(rng.choice(ROLES, size=int(rng.integers(1, 3)))) if rng.random() < 0.4 else None
        out.append(EntryFilter(as_of=as_of, occurred_after=after, session_ids=sessions, roles=roles))
    return out


def _index(entries: list[Entry], encoder, tenant_id: str = "t1") -> TenantIndex:
    index = TenantIndex(tenant_id, encoder.dim)
    if entries:
        index.add(entries, encoder.encode([e.text for e in entries]))
    return index


def _oracle_ids(entries: list[Entry], entry_filter: EntryFilter, aliases: dict[int, list[TurnFacts]] | None = None
                ) -> list[int]:
    aliases = aliases or {}
    return sorted(e.entry_id for e in entries
                  if any(entry_filter.admits(f) for f in (e.facts, *aliases.get(e.entry_id, ()))))


# -- EntryFilter ---------------------------------------------------------------------------------

def test_filter_normalises_and_refuses_bad_values():
    lisbon = timezone(timedelta(hours=1))
    f = EntryFilter(as_of=datetime(2024, 5, 1, 12, tzinfo=lisbon), session_ids=["a", "a", "b"])
    assert f.as_of == datetime(2024, 5, 1, 11, tzinfo=UTC) and f.session_ids == frozenset({"a", "b"})
    assert EntryFilter().is_open and not f.is_open
    same = datetime(2024, 5, 1, tzinfo=UTC)
    assert EntryFilter(as_of=same, occurred_after=same).admits(TurnFacts("s", "r", same))  # both bounds inclusive
    for bad in (dict(as_of=datetime(2024, 5, 1)), dict(occurred_after="2024-05-01T00:00:00Z"),
                dict(as_of=T0, occurred_after=T0 + timedelta(seconds=1)), dict(session_ids=[]),
                dict(roles="user"), dict(roles=[1])):
        with pytest.raises(InvalidParameterError):
            EntryFilter(**bad)


def test_turn_table_matches_the_scalar_oracle(rng):
    entries = _world(rng)
    table = TurnTable()
    table.add([e.entry_id for e in entries], [e.facts for e in entries])
    aliases = {}
    for entry_id in rng.choice(range(1, len(entries) + 1), size=30, replace=False).tolist():
        extra = [TurnFacts(f"S{int(rng.integers(1, 9))}", ROLES[int(rng.integers(0, 3))],
                           T0 + timedelta(hours=int(rng.integers(0, 24 * 60)))) for _ in range(int(rng.integers(1, 3)))]
        aliases[entry_id] = extra
        table.add([entry_id] * len(extra), extra)
    for entry_filter in [EntryFilter(), *_filters(rng, 200)]:
        got = table.allowed(entry_filter)
        assert got.dtype == np.int64
        assert got.tolist() == _oracle_ids(entries, entry_filter, aliases)


def test_turn_table_refuses_naive_times_without_changing():
    table = TurnTable()
    with pytest.raises(InvalidParameterError):
        table.add([1, 2], [TurnFacts("s", "r", T0), TurnFacts("s", "r", datetime(2024, 1, 1))])
    assert len(table) == 0
    with pytest.raises(InvalidParameterError):
        table.add([1], [])


# -- retrievers under a mask ---------------------------------------------------------------------

def test_bm25_restricted_equals_full_scores_of_allowed_documents(rng):
    entries = _world(rng)
    full = BM25Index()
    full.add([e.entry_id for e in entries], [e.text for e in entries])
    table = TurnTable()
    table.add([e.entry_id for e in entries], [e.facts for e in entries])
    for entry_filter, query in zip(_filters(rng, 60), itertools.cycle(["dog garden", "flight to lisbon", "cake"]),
                                   strict=False):
        allowed = table.allowed(entry_filter)
        scores = full.scores(query)  # unrestricted
        oracle = sorted(((e.entry_id, float(scores[i])) for i, e in enumerate(entries)
                         if e.entry_id in set(allowed.tolist()) and scores[i] > 0), key=lambda p: (-p[1], p[0]))
        for n in (1, 5, 30, 500):
            assert full.search(query, n, allowed) == oracle[:n]
        fresh = BM25Index()
        kept = [e for e in entries if e.entry_id in set(allowed.tolist())]
        fresh.add([e.entry_id for e in kept], [e.text for e in kept])
        assert {eid for eid, _ in full.search(query, 500, allowed)} == {eid for eid, _ in fresh.search(query, 500)}


def test_dense_restricted_equals_a_fresh_index_of_the_allowed_entries(rng, encoder):
    entries = _world(rng)
    vectors = encoder.encode([e.text for e in entries])
    full = DenseIndex(encoder.dim)
    full.add([e.entry_id for e in entries], vectors)
    table = TurnTable()
    table.add([e.entry_id for e in entries], [e.facts for e in entries])
    queries = encoder.encode(["dog in the garden", "a flight to lisbon", "cake"])
    for entry_filter in _filters(rng, 60):
        allowed = table.allowed(entry_filter)
        fresh = DenseIndex(encoder.dim)
        fresh.add(allowed.tolist(), vectors[allowed - 1])
        for n in (1, 7, 30, 500):
            assert full.search(queries, n, allowed) == fresh.search(queries, n)
    assert full.search(queries, 5, np.zeros(0, np.int64)) == [[], [], []]
    assert full.search(queries, 5, np.asarray([9999], np.int64)) == [[], [], []]  # not indexed: ignored
    assert full.search(queries, 5, np.arange(1, len(entries) + 1)) == full.search(queries, 5)


def test_one_scoring_pass_gives_the_filtered_and_the_unfiltered_ranking(rng, encoder):
    """``search_split`` scores a query once and returns exactly what the filtered and the unfiltered
    searches return (a packet's hidden candidates are ranked from the second, without a second search)."""
    entries = _world(rng)
    texts = [e.text for e in entries]
    bm25, dense = BM25Index(), DenseIndex(encoder.dim)
    bm25.add([e.entry_id for e in entries], texts)
    dense.add([e.entry_id for e in entries], encoder.encode(texts))
    table = TurnTable()
    table.add([e.entry_id for e in entries], [e.facts for e in entries])
    for entry_filter, query in zip(_filters(rng, 40), itertools.cycle(["dog garden", "flight to lisbon", "cake"]),
                                   strict=False):
        allowed = table.allowed(entry_filter)
        vector = encoder.encode([query])[0]
        for n in (1, 7, 30, 500):
            assert bm25.search_split(query, n, allowed) == (bm25.search(query, n, allowed), bm25.search(query, n))
            assert dense.search_split(vector, n, allowed) == (dense.search(vector, n, allowed)[0],
                                                              dense.search(vector, n)[0])
    vector = encoder.encode(["dog garden"])[0]
    nothing = np.zeros(0, np.int64)
    assert bm25.search_split("dog garden", 5, nothing) == ([], bm25.search("dog garden", 5))
    assert dense.search_split(vector, 5, nothing) == ([], dense.search(vector, 5)[0])
    assert bm25.search_split("dog", 0, nothing) == dense.search_split(vector, 0, nothing) == ([], [])
    assert DenseIndex(encoder.dim).search_split(vector, 5, nothing) == ([], [])


# -- the pipeline --------------------------------------------------------------------------------

class _Ticks:
    """A clock advancing one second a call, so timings are equal when the stages are."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _suppression(entries: list[Entry]) -> SuppressionTable:
    return SuppressionTable({(e.entry_id, 2): 0.01 * (e.entry_id % 7) for e in entries})


@pytest.mark.parametrize("config", [RetrievalConfig(), RetrievalConfig(deep_threshold=None),
                                    RetrievalConfig(deep_threshold=5.0, pool_size=10, deep_pool_size=40)])
def test_an_all_allowing_filter_changes_nothing(rng, encoder, config):
    entries = _world(rng)
    index = _index(entries, encoder)
    everything = EntryFilter(as_of=T0 + timedelta(days=3650), occurred_after=T0 - timedelta(days=1),
                             session_ids={f"S{i}" for i in range(1, 9)}, roles=set(ROLES))
    for query in ("dog garden", "flight to lisbon on friday", "piano"):
        q = encoder.encode([query])[0]
        runs = [retrieve(index, query, q, k=10, config=config, reranker=FakeReranker(), suppression=_suppression(entries),
                         cluster=2, outcome_id="o", clock=_Ticks(), allowed=allowed)
                for allowed in (None, EntryFilter(), everything)]
        assert runs[0] == runs[1] == runs[2]
        assert runs[0].hits


def test_filtered_retrieval_equals_retrieval_over_only_the_allowed_entries(rng, encoder):
    """Dense-only: exactly a fresh tenant of the allowed entries (pool, deep pass, hits, outcome)."""
    entries = _world(rng, n=200)
    index = _index(entries, encoder)
    dense_only = RetrievalConfig(use_bm25=False, n_candidates=10, pool_size=10, deep_pool_size=25, deep_threshold=1.0)
    for entry_filter in _filters(rng, 25):
        allowed = set(_oracle_ids(entries, entry_filter))
        alone = _index([e for e in entries if e.entry_id in allowed], encoder)
        query = "the dog and the cake"
        q = encoder.encode([query])[0]
        got = retrieve(index, query, q, k=8, config=dense_only, reranker=FakeReranker(), outcome_id="o",
                       clock=_Ticks(), allowed=entry_filter)
        ref = retrieve(alone, query, q, k=8, config=dense_only, reranker=FakeReranker(), outcome_id="o",
                       clock=_Ticks())
        assert (got.hits, got.outcome, got.pool_size, got.deep_pass) == (ref.hits, ref.outcome, ref.pool_size,
                                                                         ref.deep_pass)


def test_a_selective_filter_still_finds_its_entries_beyond_the_unfiltered_top_n(rng, encoder):
    entries = _world(rng, n=300)
    rare = [Entry(1000 + i, "t1", f"rare{i}", "S-rare", "user", f"zebra note number {i}", T0) for i in range(3)]
    index = _index(entries + rare, encoder)
    query = "dog garden cake"
    q = encoder.encode([query])[0]
    unfiltered = retrieve(index, query, q, k=30, config=RetrievalConfig(deep_threshold=None), reranker=None)
    assert not {h.entry_id for h in unfiltered.hits} & {1000, 1001, 1002}
    got = retrieve(index, query, q, k=30, reranker=FakeReranker(), outcome_id="o",
                   allowed=EntryFilter(session_ids={"S-rare"}))
    assert sorted(h.entry_id for h in got.hits) == [1000, 1001, 1002]
    assert {row.entry_id for row in got.outcome.pool} == {1000, 1001, 1002}


def test_a_filter_allowing_one_entry_returns_it_and_none_returns_nothing(rng, encoder):
    entries = _world(rng)
    index = _index(entries, encoder)
    first = min(entries, key=lambda e: (e.occurred_at, e.entry_id))
    only = [e for e in entries if e.occurred_at == first.occurred_at]
    q = encoder.encode(["something unrelated"])[0]
    reranker = FakeReranker()
    one = retrieve(index, "something unrelated", q, k=10, reranker=reranker, outcome_id="o",
                   allowed=EntryFilter(as_of=first.occurred_at))
    assert [h.entry_id for h in one.hits] == sorted(e.entry_id for e in only)  # dense always returns an allowed entry
    assert one.outcome is not None and one.pool_size == len(only)

    reranker = FakeReranker()
    for nothing in (EntryFilter(as_of=T0 - timedelta(seconds=1)), EntryFilter(session_ids={"no-such-session"}),
                    EntryFilter(roles={"narrator"})):
        empty = retrieve(index, "dog", encoder.encode(["dog"])[0], k=10, reranker=reranker, outcome_id="o",
                         allowed=nothing)
        assert (empty.hits, empty.outcome, empty.pool_size, empty.deep_pass) == ((), None, 0, False)
    assert reranker.calls == []


def test_a_canonical_entry_passes_when_one_of_its_aliases_does(encoder):
    entries = [Entry(1, "t1", "u1", "S1", "user", "my dog Rex loves the beach", T0 + timedelta(days=10)),
               Entry(2, "t1", "u2", "S1", "user", "dentist on friday", T0 + timedelta(days=10))]
    index = _index(entries, encoder)
    index.add_aliases(1, ["u9"], [TurnFacts("S2", "assistant", T0)])  # said earlier, elsewhere, by another speaker
    q = encoder.encode(["dog beach"])[0]

    def hits(entry_filter):
        result = retrieve(index, "dog beach", q, k=5, reranker=FakeReranker(), outcome_id="o", allowed=entry_filter)
        return [(h.entry_id, h.turn_id, h.session_id, h.role, h.occurred_at, h.aliases) for h in result.hits]

    # the hit is shown as the alias that let it through (its id, session, speaker and time), never as
    # nor naming a turn the filter refuses (break-it sessions: as_of February showed a May turn, then
    # listed it in aliases); the entry id and the text stay the canonical's
    through_alias = [(1, "u9", "S2", "assistant", T0, ())]
    assert hits(EntryFilter(session_ids={"S2"})) == through_alias
    assert hits(EntryFilter(as_of=T0 + timedelta(days=1))) == through_alias
    assert hits(EntryFilter(roles={"assistant"})) == through_alias
    assert hits(EntryFilter(session_ids={"S2"}, roles={"user"})) == []  # conditions hold on ONE turn
    assert [e for e, *_ in hits(EntryFilter(session_ids={"S1"}))] == [1, 2]
    assert hits(EntryFilter(session_ids={"S1", "S2"}))[0][1:3] == ("u1", "S1")  # the canonical when it passes too
    assert hits(EntryFilter(session_ids={"S1", "S2"}))[0][5] == ("u9",)
    assert hits(EntryFilter(session_ids={"S1"}))[0][5] == ()  # u9 is S2's: not named under an S1 filter
    assert index.shown(1, EntryFilter(session_ids={"S2"})).text == "my dog Rex loves the beach"
    assert index.shown(1) == index.entry(1) and index.entry(1).turn_id == "u1"  # the index itself is unchanged
    # an alias folded without facts is filtered by its canonical turn alone
    index.add_aliases(2, ["u10"])
    assert [e for e, *_ in hits(EntryFilter(as_of=T0 + timedelta(days=1)))] == [1]


def test_features_score_the_turn_a_filter_admitted(encoder):
    """A break-it session (round 2): under as_of, the temporal feature scored a hit shown as its
    January alias by its canonical May session, so it lost the bonus its shown date earns."""
    jan, may = datetime(2024, 1, 10, tzinfo=UTC), datetime(2024, 5, 10, tzinfo=UTC)
    entries = [Entry(1, "t1", "bike-may", "s-may", "user", "I bought a red bike", may),
               Entry(2, "t1", "rain-jan", "s-jan", "user", "it rained all week", jan),
               Entry(3, "t1", "shop-feb", "s-feb", "user", "I did not buy anything", jan + timedelta(days=31))]
    index = _index(entries, encoder)
    index.add_aliases(1, ["bike-jan"], [TurnFacts("s-jan", "user", jan + timedelta(hours=1))])
    config = RetrievalConfig(features=[FeatureSetting(Feature.TEMPORAL, {"slack_days": 3, "weight": 2.0})])
    query = "what did I buy in January"
    as_of = datetime(2024, 3, 1, tzinfo=UTC)
    result = retrieve(index, query, encoder.encode([query])[0], k=3, config=config, reranker=FakeReranker(),
                      outcome_id="o", reference_time=as_of, allowed=EntryFilter(as_of=as_of))
    bike = next(h for h in result.hits if h.entry_id == 1)
    assert (bike.turn_id, bike.session_id) == ("bike-jan", "s-jan")
    plain = retrieve(index, query, encoder.encode([query])[0], k=3, config=RetrievalConfig(), reranker=FakeReranker(),
                     outcome_id="o", reference_time=as_of, allowed=EntryFilter(as_of=as_of))
    logit = next(h.score for h in plain.hits if h.entry_id == 1)
    assert bike.score == pytest.approx(logit + 2.0)  # January's session earns the temporal bonus


def test_alias_facts_must_match_turn_ids(encoder):
    index = _index([Entry(1, "t1", "u1", "S1", "user", "dog", T0)], encoder)
    with pytest.raises(InvalidParameterError):
        index.add_aliases(1, ["a", "b"], [TurnFacts("S1", "user", T0)])
    assert index.entry(1).aliases == () and len(index.turns) == 1
    index.add_aliases(1, ["u1", "a", "a"], [TurnFacts("S1", "user", T0)] * 3)  # repeats are skipped
    assert index.entry(1).aliases == ("a",) and len(index.turns) == 2


def test_a_filter_never_reaches_another_tenant(encoder):
    a = _index([Entry(1, "A", "a1", "shared", "user", "my dog Rex", T0),
                Entry(2, "A", "a2", "only-A", "user", "my dog Rex again", T0)], encoder, "A")
    _index([Entry(11, "B", "b1", "shared", "user", "my dog Rex", T0),
            Entry(12, "B", "b2", "only-B", "user", "my dog Rex too", T0)], encoder, "B")
    q = encoder.encode(["dog Rex"])[0]
    for sessions, expected in (({"shared"}, [1]), ({"only-B"}, []), ({"only-B", "only-A"}, [2])):
        result = retrieve(a, "dog Rex", q, k=10, reranker=FakeReranker(), outcome_id="o",
                          allowed=EntryFilter(session_ids=sessions))
        assert sorted(h.entry_id for h in result.hits) == expected
        assert a.allowed_entries(EntryFilter(session_ids=sessions)).tolist() == expected
