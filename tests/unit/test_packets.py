"""Evidence packets (mnemos.packets): budget, redundancy, session cap, supersession, as_of, order,
omission reasons, and a property test of the budget and of determinism."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemos.encoder import HashingEncoder
from mnemos.errors import InvalidParameterError
from mnemos.filters import EntryFilter
from mnemos.fusion import reciprocal_rank_fusion
from mnemos.packets import (
    Candidate,
    Omission,
    PacketConfig,
    Qualifiers,
    Relevance,
    build_packet,
    hidden_candidates,
    packet_from_index,
    prompt_text,
    render_header,
    render_item,
    render_line,
    select,
    token_counter,
    whitespace_tokens,
)
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Entry
from mnemos.rerank import CachedReranker, FakeReranker
from mnemos.supersession import SupersessionTable
from mnemos.tenant_index import TenantIndex

T0 = datetime(2024, 1, 1, 9, 0, tzinfo=UTC)


def cand(entry_id: int, score: float, tokens: int = 10, session: str = "s1", minutes: int = 0,
         aliases: tuple[str, ...] = (), session_day: int = 0, header: bool = False) -> Candidate:
    """A candidate whose text has ``tokens`` words; ``header``: grouped under its session's header."""
    when = T0 + timedelta(days=session_day, minutes=minutes)
    qualifiers = Qualifiers(session, "user", when, aliases, T0 + timedelta(days=session_day))
    words = " ".join(["w"] * max(0, tokens - 1 - len(render_line("", qualifiers).split())))
    text = f"text{entry_id} {words}".strip()
    if not header:
        return Candidate(entry_id, f"t{entry_id}", text, score, tokens, qualifiers)
    line_tokens = whitespace_tokens(render_line(text, qualifiers))
    title = render_header(qualifiers)
    return Candidate(entry_id, f"t{entry_id}", text, score, line_tokens, qualifiers, title, whitespace_tokens(title))


def orthogonal(n: int, dim: int = 16) -> np.ndarray:
    return np.eye(n, dim, dtype=np.float32)


def test_the_budget_is_never_exceeded_and_what_no_longer_fits_is_over_budget() -> None:
    pool = [cand(1, 3.0, 40), cand(2, 2.0, 40), cand(3, 1.0, 40)]
    packet = build_packet(pool, orthogonal(3), 100, PacketConfig(session_share=1.0))
    assert [i.entry_id for i in packet.items] == [1, 2] and packet.used_tokens == 80 <= 100
    assert [(o.entry_id, o.reason) for o in packet.omitted] == [(3, Omission.OVER_BUDGET)]


def test_a_near_duplicate_of_a_kept_item_is_redundant_and_names_it() -> None:
    vectors = orthogonal(3)
    vectors[1] = vectors[0] + 0.05 * vectors[2]  # cosine ~0.999 with entry 1
    packet = build_packet([cand(1, 3.0), cand(2, 2.9), cand(3, 0.0)], vectors, 1000,
                          PacketConfig(session_share=1.0))
    assert [i.entry_id for i in packet.items] == [1, 3]
    (omitted,) = packet.omitted
    assert (omitted.entry_id, omitted.reason, omitted.because_of) == (2, Omission.REDUNDANT, "t1")


def test_redundancy_penalty_prefers_a_diverse_item_over_a_similar_better_one() -> None:
    vectors = orthogonal(3)
    vectors[1] = vectors[0] + 0.9 * vectors[2]  # cosine ~0.74 with entry 1: below the threshold
    config = PacketConfig(mmr_lambda=0.5, session_share=1.0)
    kept, _ = select([cand(1, 4.0), cand(2, 3.0), cand(3, 2.0)], vectors, 20, config)
    assert [c.entry_id for c in kept] == [1, 3]  # 3 is less relevant but not redundant


def test_value_per_token_prefers_a_short_item_of_similar_relevance() -> None:
    kept, omitted = select([cand(1, 2.0, 50), cand(2, 1.9, 10)], orthogonal(2), 50,
                           PacketConfig(session_share=1.0, token_exponent=1.0))
    assert [c.entry_id for c in kept] == [2] and omitted[0].reason is Omission.OVER_BUDGET
    # relevance alone (the default exponent 0) keeps the better, longer one
    kept, omitted = select([cand(1, 2.0, 50), cand(2, 1.9, 10)], orthogonal(2), 50, PacketConfig(session_share=1.0))
    assert [c.entry_id for c in kept] == [1] and omitted[0].reason is Omission.OVER_BUDGET


def test_one_session_cannot_fill_the_budget() -> None:
    pool = [cand(1, 5.0, 30), cand(2, 4.0, 30), cand(3, 3.0, 30, session="s2", session_day=1)]
    packet = build_packet(pool, orthogonal(3), 100, PacketConfig(session_share=0.5))
    assert {i.entry_id for i in packet.items} == {1, 3}
    assert [(o.entry_id, o.reason) for o in packet.omitted] == [(2, Omission.SESSION_CAP)]


def test_items_come_in_reading_order_session_start_then_turn_time() -> None:
    pool = [cand(1, 5.0, session="late", session_day=3, minutes=2), cand(2, 4.0, session="early", minutes=9),
            cand(3, 3.0, session="late", session_day=3, minutes=1), cand(4, 2.0, session="early", minutes=1)]
    packet = build_packet(pool, orthogonal(4), 1000, PacketConfig(session_share=1.0))
    assert [i.entry_id for i in packet.items] == [4, 2, 3, 1]


def test_superseded_turns_leave_current_packets_but_stay_visible_before_the_correction() -> None:
    table = SupersessionTable()
    table.add("t2", T0 + timedelta(days=5), ["t1"])
    pool = [cand(1, 3.0), cand(2, 2.0, session="s2", session_day=5)]
    now = build_packet(pool, orthogonal(2), 1000, supersessions=table)
    assert [i.entry_id for i in now.items] == [2]
    assert [(o.entry_id, o.reason, o.because_of) for o in now.omitted] == [(1, Omission.SUPERSEDED, "t2")]
    before = build_packet(pool, orthogonal(2), 1000, supersessions=table, as_of=T0 + timedelta(days=1))
    assert [i.entry_id for i in before.items] == [1, 2] and before.omitted == ()


def test_a_correction_of_an_alias_supersedes_the_entry_but_not_by_its_own_turns() -> None:
    table = SupersessionTable()
    table.add("t9", T0 + timedelta(days=1), ["dup"])
    table.add("dup", T0, ["t1"])  # an entry's own alias cannot supersede it
    packet = build_packet([cand(1, 3.0, aliases=("dup",))], orthogonal(1), 1000, supersessions=table)
    assert packet.items == () and packet.omitted[0].because_of == "t9"
    assert table.superseding(["t1"], exclude=("t1", "dup")) is None


def test_only_a_later_turn_corrects_and_a_cycle_hides_only_the_older_turn() -> None:
    # found by a break-it session: two turns naming each other hid both, and an older turn hid a newer one
    table = SupersessionTable()
    table.add("t1", T0 + timedelta(days=1), ["t2"])  # t1 (day 1) names t2 (day 2): an older turn
    table.add("t2", T0 + timedelta(days=2), ["t1"])  # t2 (day 2) names t1: a real correction
    table.add("t3", T0 + timedelta(days=3), ["t4"])  # t3 (day 3) names t4 (day 4): ignored
    pool = [cand(1, 4.0, session_day=1), cand(2, 3.0, session="s2", session_day=2),
            cand(3, 2.0, session="s3", session_day=3), cand(4, 1.0, session="s4", session_day=4)]
    packet = build_packet(pool, orthogonal(4), 1000, supersessions=table)
    assert sorted(i.entry_id for i in packet.items) == [2, 3, 4]
    assert [(o.entry_id, o.because_of) for o in packet.omitted] == [(1, "t2")]
    same_time = SupersessionTable()
    same_time.add("t2", T0, ["t1"])  # said at the same instant: not later, corrects nothing
    assert build_packet([cand(1, 2.0), cand(2, 1.0)], orthogonal(2), 1000, supersessions=same_time).omitted == ()


def test_the_packet_is_deterministic_and_ties_keep_pool_order() -> None:
    pool = [cand(i, 1.0, 10) for i in range(1, 7)]
    packets = {build_packet(pool, orthogonal(6), 35, PacketConfig(session_share=1.0)) for _ in range(3)}
    assert len(packets) == 1
    (packet,) = packets
    assert [i.entry_id for i in packet.items] == [1, 2, 3]
    assert [o.reason for o in packet.omitted] == [Omission.OVER_BUDGET] * 3


def test_config_and_budget_are_checked() -> None:
    with pytest.raises(InvalidParameterError):
        PacketConfig(mmr_lambda=0.0)
    with pytest.raises(InvalidParameterError):
        PacketConfig(session_share=1.5)
    with pytest.raises(InvalidParameterError):
        select([cand(1, 1.0)], orthogonal(1), 0)


def test_minmax_relevance_serves_fused_scores() -> None:
    kept, _ = select([cand(1, 0.03), cand(2, 0.01)], orthogonal(2), 10,
                     PacketConfig(relevance=Relevance.MINMAX, session_share=1.0))
    assert [c.entry_id for c in kept] == [1]


def test_token_counter_finds_a_wrapped_tokenizer_or_falls_back_to_words() -> None:
    class Counting(FakeReranker):
        def count_tokens(self, text: str) -> int:
            return 2 * len(text.split())

    assert token_counter(CachedReranker(Counting()))("a b c") == 6
    assert token_counter(FakeReranker()) is whitespace_tokens and token_counter(None) is whitespace_tokens


def _index() -> TenantIndex:
    encoder = HashingEncoder(dim=64)
    texts = [("s1", "I live in Paris near the river", 0), ("s1", "The weather was grey", 1),
             ("s2", "I moved to Berlin last month", 60 * 24 * 30), ("s2", "Berlin has good bakeries", 60 * 24 * 30 + 1)]
    entries = [Entry(i + 1, "ten", f"t{i + 1}", s, "user", text, T0 + timedelta(minutes=m))
               for i, (s, text, m) in enumerate(texts)]
    index = TenantIndex("ten", 64)
    index.add(entries, encoder.encode([e.text for e in entries]))
    index.supersessions.add("t3", entries[2].occurred_at, ["t1"])
    return index


def test_packet_from_index_counts_rendered_items_and_reads_supersessions() -> None:
    index = _index()
    ranking = [(1, 2.0), (3, 1.5), (2, -1.0), (4, 0.5)]
    packet = packet_from_index(index, ranking, 1000, whitespace_tokens)
    assert [i.entry_id for i in packet.items] == [2, 3, 4]  # session s1 first, then s2
    assert packet.omitted[0].reason is Omission.SUPERSEDED
    item = packet.items[0]
    assert item.tokens == whitespace_tokens(render_line(item.text, item.qualifiers))
    assert item.header == render_header(item.qualifiers) == "[session s1, 2024-01-01 09:00 UTC]"
    assert render_line(item.text, item.qualifiers).startswith("[09:01] user: ")  # a minute after the session start
    assert render_item(item.text, item.qualifiers).startswith("[2024-01-01 09:01 UTC, session s1] user: ")
    text = prompt_text(packet.items)
    assert text.splitlines()[0] == "[session s1, 2024-01-01 09:00 UTC]" and text.count("[session s2,") == 1
    assert whitespace_tokens(text) == packet.used_tokens
    old = packet_from_index(index, ranking, 1000, whitespace_tokens, as_of=T0 + timedelta(days=1))
    assert 1 in {i.entry_id for i in old.items}


def _hidden(index: TenantIndex, query: str, entry_filter: EntryFilter | None, *, depth: int = 10,
            limit: int = 10) -> list:
    """The hidden candidates of one filtered retrieval, from the unfiltered lists it kept."""
    vector = HashingEncoder(dim=64).encode([query])[0]
    core = retrieve(index, query, vector, k=2, config=RetrievalConfig(rerank=False), allowed=entry_filter,
                    unfiltered=True)
    return hidden_candidates(index, core.unfiltered, entry_filter, depth=depth, limit=limit)


def _hidden_by_a_second_search(index: TenantIndex, query: str, entry_filter: EntryFilter, *, depth: int,
                               limit: int) -> list[int]:
    """The oracle: what an unfiltered BM25 + dense search of their own, fused by RRF, ranks and the filter keeps out."""
    vector = HashingEncoder(dim=64).encode([query])[0]
    lists = [[e for e, _ in index.bm25.search(query, depth)], [e for e, _ in index.dense.search(vector, depth)[0]]]
    allowed = set(index.allowed_entries(entry_filter).tolist())
    return [e for e, _ in reciprocal_rank_fusion(lists) if e not in allowed][:limit]


def test_hidden_candidates_name_what_the_filter_and_as_of_kept_out() -> None:
    index = _index()
    hidden = _hidden(index, "Berlin Paris", EntryFilter(as_of=T0 + timedelta(days=1), session_ids=frozenset({"s1"})))
    assert {(o.entry_id, o.reason) for o in hidden} >= {(3, Omission.NOT_VISIBLE)}
    assert all(o.entry_id in (3, 4) for o in hidden)
    filtered = _hidden(index, "Berlin Paris", EntryFilter(session_ids=frozenset({"s2"})))
    assert {o.reason for o in filtered} == {Omission.FILTERED} and all(o.entry_id in (1, 2) for o in filtered)
    assert _hidden(index, "Berlin", None) == []
    assert hidden_candidates(index, None, EntryFilter(session_ids=frozenset({"s2"})), depth=10, limit=10) == []


@pytest.mark.parametrize("entry_filter", [EntryFilter(session_ids=frozenset({"s2"})),
                                          EntryFilter(as_of=T0 + timedelta(days=1)),
                                          EntryFilter(session_ids=frozenset({"nowhere"})),
                                          EntryFilter(roles=frozenset({"user"}), occurred_after=T0 + timedelta(days=2))])
@pytest.mark.parametrize(("depth", "limit"), [(10, 10), (2, 10), (10, 1)])
def test_hidden_candidates_are_those_a_second_unfiltered_search_found(entry_filter: EntryFilter, depth: int,
                                                                      limit: int) -> None:
    """The same hidden turns, in the same order, as when the packet searched the tenant again without the filter."""
    index = _index()
    for query in ("Berlin Paris", "grey weather river", "bakeries"):
        assert [o.entry_id for o in _hidden(index, query, entry_filter, depth=depth, limit=limit)] == \
            _hidden_by_a_second_search(index, query, entry_filter, depth=depth, limit=limit)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-8, 8), st.integers(1, 60), st.integers(0, 3)), min_size=1, max_size=25),
       st.integers(1, 300), st.floats(0.1, 1.0), st.integers(0, 2**16))
def test_property_budget_and_partition_and_determinism(rows: list, budget: int, lam: float, seed: int) -> None:
    pool = [cand(i + 1, s, t, session=f"s{g}", session_day=g, minutes=i, header=True)
            for i, (s, t, g) in enumerate(rows)]
    vectors = np.random.default_rng(seed).normal(size=(len(pool), 8)).astype(np.float32)
    config = PacketConfig(mmr_lambda=lam)
    packet = build_packet(pool, vectors, budget, config)
    assert packet.used_tokens <= budget
    assert whitespace_tokens(prompt_text(packet.items)) == packet.used_tokens  # lines plus one header per session
    kept = [i.entry_id for i in packet.items]
    left = [o.entry_id for o in packet.omitted]
    assert sorted(kept + left) == [c.entry_id for c in pool]  # every candidate is kept or reported once
    for session in {c.qualifiers.session_id for c in pool}:
        ours = [i for i in packet.items if i.qualifiers.session_id == session]
        headers = {i.header: i.header_tokens for i in ours}
        assert sum(i.tokens for i in ours) + sum(headers.values()) <= config.session_share * budget
    assert build_packet(list(pool), vectors.copy(), budget, config) == packet
    for o in packet.omitted:
        if o.reason is Omission.OVER_BUDGET:
            assert o.tokens is not None and o.tokens > budget - packet.used_tokens
        if o.because_of is not None:
            assert o.because_of in {f"t{k}" for k in kept}


def test_a_session_header_is_paid_once_so_a_second_item_of_that_session_fits_where_a_new_session_does_not() -> None:
    first, same, other = cand(1, 3.0, 8, header=True), cand(2, 2.0, 8, minutes=5, header=True), \
        cand(3, 2.5, 8, session="s2", session_day=1, header=True)
    header = first.header_tokens
    assert header > 0 and first.header == same.header != other.header
    budget = 2 * 8 + header + 1  # room for one more line, not for a line and a new header
    packet = build_packet([first, other, same], orthogonal(3), budget, PacketConfig(session_share=1.0))
    assert [i.entry_id for i in packet.items] == [1, 2] and packet.used_tokens == 2 * 8 + header
    assert [(o.entry_id, o.reason, o.tokens) for o in packet.omitted] == [(3, Omission.OVER_BUDGET, 8 + header)]
    assert prompt_text(packet.items).splitlines()[0] == first.header
