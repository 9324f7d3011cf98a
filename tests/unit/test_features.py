"""mnemos.features: post-rerank features (AssoMem §4.2 session-then-turn, §3.2.3 temporal match and
PPR importance), moved from bench.quality.arms with their tests; plus setting validation."""

from __future__ import annotations

from datetime import UTC, date, datetime

import numpy as np
import pytest

from mnemos.errors import InvalidParameterError
from mnemos.features import (
    DateSpan,
    Feature,
    FeatureSetting,
    PoolView,
    QueryContext,
    apply_features,
    feature_scores,
    importance_adjustment,
    parse_time_expressions,
    session_adjustment,
    session_matches,
    temporal_adjustment,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What did Maria do on 7 May, 2023?", DateSpan(date(2023, 5, 7), date(2023, 5, 7))),
        ("What did Gina find on May 23, 2023?", DateSpan(date(2023, 5, 23), date(2023, 5, 23))),
        ("What happened in July 2023?", DateSpan(date(2023, 7, 1), date(2023, 7, 31))),
        ("How often in 2022?", DateSpan(date(2022, 1, 1), date(2022, 12, 31))),
        ("When did she go camping in June?", DateSpan(None, None, 6)),
        ("What did he do the week before August 3, 2023?", DateSpan(date(2023, 7, 20), date(2023, 8, 3))),
    ],
)
def test_parse_time_expressions(text: str, expected: DateSpan) -> None:
    assert parse_time_expressions(text) == (expected,)


def test_relative_expressions_need_a_reference_date() -> None:
    assert parse_time_expressions("What did I buy yesterday?") == ()
    ref = datetime(2023, 5, 10, tzinfo=UTC)
    assert parse_time_expressions("What did I buy yesterday?", ref) == (DateSpan(date(2023, 5, 9), date(2023, 5, 9)),)
    assert parse_time_expressions("Where is the camping gear?") == ()


def test_relative_expressions_that_leave_the_calendar_give_no_span() -> None:
    # found by a break-it session: these raised OverflowError and failed the whole retrieval
    ref = datetime(2025, 6, 1, tzinfo=UTC)
    assert parse_time_expressions("What did I say 2100 years ago?", ref) == ()
    assert parse_time_expressions("what happened 99999999999999999999 days ago", ref) == ()
    first = datetime(1, 1, 1, tzinfo=UTC)
    assert parse_time_expressions("what happened yesterday", first) == ()
    assert parse_time_expressions("what happened last week", first) == ()
    near = parse_time_expressions("what did I do 3 months ago", datetime(1, 4, 1, tzinfo=UTC))
    assert near == (DateSpan(date.min, date(1, 1, 23)),)  # centre 1 January, year 1: cut there, not dropped
    assert parse_time_expressions("the week before January 7, 0001") == ()  # not a year the forms read
    assert session_matches(datetime(9999, 12, 31, tzinfo=UTC), (DateSpan(date(9999, 12, 30), date.max),),
                           slack_days=7)
    assert session_matches(datetime(1, 1, 2, tzinfo=UTC), (DateSpan(None, None, 1),), slack_days=31)


def _pool(scores, sessions, dates=None, emb=None) -> PoolView:
    n = len(scores)
    dates = dates or [datetime(2023, 1, 1, tzinfo=UTC)] * n
    emb = emb if emb is not None else np.eye(n, 4, dtype=np.float32)
    return PoolView(np.asarray(scores, float), tuple(sessions), tuple(dates), emb)


def test_session_matches_extends_forward_only() -> None:
    span = (DateSpan(date(2023, 5, 1), date(2023, 5, 31)),)
    assert session_matches(datetime(2023, 6, 5, tzinfo=UTC), span, slack_days=7)
    assert not session_matches(datetime(2023, 6, 15, tzinfo=UTC), span, slack_days=7)
    assert not session_matches(datetime(2023, 4, 28, tzinfo=UTC), span, slack_days=7)
    assert session_matches(datetime(2024, 6, 3, tzinfo=UTC), (DateSpan(None, None, 5),), slack_days=7)


def test_temporal_adjustment_boosts_matching_sessions_only_when_informative() -> None:
    may, june = datetime(2023, 5, 8, tzinfo=UTC), datetime(2023, 6, 20, tzinfo=UTC)
    pool = _pool([1.0, 0.5], ["s1", "s2"], [june, may])
    context = QueryContext(time_spans=parse_time_expressions("What happened on 8 May, 2023?"))
    assert temporal_adjustment(pool, context, slack_days=7, weight=2.0).tolist() == [0.0, 2.0]
    assert temporal_adjustment(pool, QueryContext(), slack_days=7, weight=2.0).tolist() == [0.0, 0.0]
    both = _pool([1.0, 0.5], ["s1", "s2"], [may, may])
    assert temporal_adjustment(both, context, slack_days=7, weight=2.0).tolist() == [0.0, 0.0]


def test_session_adjustment_and_apply_features_reorder() -> None:
    pool = _pool([3.0, 2.0, 1.0], ["a", "b", "c"])
    context = QueryContext(session_ranking=("c", "a", "b"))
    assert session_adjustment(pool, context, top=1, weight=5.0).tolist() == [0.0, 0.0, 5.0]
    assert apply_features(pool, context, []).tolist() == [0, 1, 2]
    setting = FeatureSetting(Feature.SESSION, {"top": 1, "weight": 5.0})
    assert apply_features(pool, context, [setting]).tolist() == [2, 0, 1]
    assert setting.label() == "session(top=1,weight=5)"


def test_apply_features_keeps_rerank_order_on_ties() -> None:
    pool = _pool([1.0, 1.0, 1.0], ["a", "a", "a"])
    assert apply_features(pool, QueryContext(), [FeatureSetting(Feature.TEMPORAL, {"slack_days": 7, "weight": 1})]
                          ).tolist() == [0, 1, 2]


def test_importance_is_zero_mean_and_favours_the_hub() -> None:
    # rows 0..3 are near each other (row 0 is their centre); row 4 is far away
    emb = np.array([[1, 0, 0], [0.9, 0.43, 0], [0.9, -0.43, 0], [0.9, 0, 0.43], [0, 0, 1]], dtype=np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    pool = _pool([1.0, 1.0, 1.0, 1.0, 1.0], list("abcde"), emb=emb)
    adj = importance_adjustment(pool, QueryContext(), weight=1.0, neighbours=2)
    assert np.isfinite(adj).all()
    assert adj.mean() == pytest.approx(0.0, abs=1e-9)
    assert int(np.argmax(adj)) == 0 and int(np.argmin(adj)) == 4
    assert importance_adjustment(_pool([1.0, 0.0], "ab"), QueryContext(), weight=1.0).tolist() == [0.0, 0.0]


def test_feature_scores_are_logits_plus_adjustments() -> None:
    pool = _pool([3.0, 2.0, 1.0], ["a", "b", "c"])
    context = QueryContext(session_ranking=("c", "a", "b"))
    setting = FeatureSetting(Feature.SESSION, {"top": 2, "weight": 1.5})
    assert feature_scores(pool, context, [setting]).tolist() == [4.5, 2.0, 2.5]
    assert feature_scores(pool, context, []).tolist() == [3.0, 2.0, 1.0]


@pytest.mark.parametrize(
    ("feature", "params"),
    [
        ("nope", {"weight": 1.0}),
        (Feature.SESSION, {"weight": 1.0}),
        (Feature.SESSION, {"top": 3, "weight": 1.0, "slack_days": 2}),
        (Feature.SESSION, {"top": 0, "weight": 1.0}),
        (Feature.TEMPORAL, {"slack_days": -1, "weight": 1.0}),
        (Feature.TEMPORAL, {"slack_days": 7, "weight": float("nan")}),
        (Feature.BM25_SCORE, {"weight": 0.5, "floor": -1.0}),
        (Feature.SESSION, {"top": 1, "weight": 1.0, "floor": 1.0}),  # floors belong to evidence features
    ],
)
def test_bad_settings_are_refused(feature, params) -> None:
    with pytest.raises(InvalidParameterError):
        FeatureSetting(feature, params)


def test_settings_are_hashable_values() -> None:
    a = FeatureSetting("session", {"top": 3, "weight": 2.0})
    b = FeatureSetting(Feature.SESSION, {"weight": 2.0, "top": 3})
    assert a == b and hash(a) == hash(b) and a.feature is Feature.SESSION
    assert len({a, b, FeatureSetting(Feature.IMPORTANCE, {"weight": 1.0, "neighbours": 3})}) == 2


def test_first_stage_adjustment_is_the_z_scored_fused_rank_in_logit_units() -> None:
    from mnemos.features import first_stage_adjustment

    logits = [4.0, 1.0, 0.0, -1.0]
    pool = PoolView(np.asarray(logits), ("s",) * 4, (datetime(2023, 1, 1, tzinfo=UTC),) * 4, np.zeros((4, 0)),
                    initial_ranks=np.asarray([4, 1, 2, 3]))
    adjustment = first_stage_adjustment(pool, QueryContext(), weight=0.5)
    first = -np.asarray([4.0, 1.0, 2.0, 3.0])
    expected = 0.5 * np.std(logits) * (first - first.mean()) / first.std()
    np.testing.assert_allclose(adjustment, expected)
    assert adjustment[1] > adjustment[2] > adjustment[3] > adjustment[0]  # fused rank 1 gains most
    # z(logit) + w * z(first stage) orders the pool as logit + adjustment does
    z_logits = (np.asarray(logits) - np.mean(logits)) / np.std(logits)
    mixed = z_logits + 0.5 * (first - first.mean()) / first.std()
    assert list(np.argsort(-mixed)) == list(np.argsort(-(np.asarray(logits) + adjustment)))


def test_first_stage_adjustment_is_zero_without_an_order_to_keep() -> None:
    from mnemos.features import first_stage_adjustment

    date0 = datetime(2023, 1, 1, tzinfo=UTC)
    for ranks in ([], [1], [2, 2, 2]):
        n = max(len(ranks), 1) if ranks else 3
        pool = PoolView(np.arange(n, dtype=float), ("s",) * n, (date0,) * n, np.zeros((n, 0)),
                        initial_ranks=np.asarray(ranks, dtype=np.int64))
        assert not first_stage_adjustment(pool, QueryContext(), weight=1.0).any()
    flat = PoolView(np.zeros(3), ("s",) * 3, (date0,) * 3, np.zeros((3, 0)), initial_ranks=np.asarray([1, 2, 3]))
    assert not first_stage_adjustment(flat, QueryContext(), weight=1.0).any()  # an unsure model: no logit spread


def test_first_stage_setting_needs_a_weight() -> None:
    from mnemos.errors import InvalidParameterError

    assert FeatureSetting(Feature.FIRST_STAGE, {"weight": 1.0}).label() == "first_stage(weight=1)"
    with pytest.raises(InvalidParameterError):
        FeatureSetting(Feature.FIRST_STAGE, {})


def test_bm25_adjustment_is_the_first_stage_form_on_bm25_ranks() -> None:
    from mnemos.features import bm25_adjustment, first_stage_adjustment

    date0 = datetime(2023, 1, 1, tzinfo=UTC)
    logits = np.asarray([3.0, 2.0, 0.5, -1.0])
    pool = PoolView(logits, ("s",) * 4, (date0,) * 4, np.zeros((4, 0)),
                    initial_ranks=np.asarray([1, 2, 3, 4]), bm25_ranks=np.asarray([31, 2, 1, 31]))
    adjustment = bm25_adjustment(pool, QueryContext(), weight=2.0)
    lexical = -np.asarray([31.0, 2.0, 1.0, 31.0])
    np.testing.assert_allclose(adjustment, 2.0 * logits.std() * (lexical - lexical.mean()) / lexical.std())
    assert adjustment[2] > adjustment[1] > adjustment[0] == adjustment[3]  # BM25's best gains most
    # it reads the BM25 ranks, not the fused ones
    assert not np.allclose(adjustment, first_stage_adjustment(pool, QueryContext(), weight=2.0))
    missing = PoolView(logits, ("s",) * 4, (date0,) * 4, np.zeros((4, 0)), initial_ranks=np.asarray([1, 2, 3, 4]))
    assert not bm25_adjustment(missing, QueryContext(), weight=2.0).any()
    assert FeatureSetting(Feature.BM25, {"weight": 0.5}).label() == "bm25(weight=0.5)"


def test_bm25_score_adjustment_keeps_the_margin_a_rank_loses() -> None:
    from mnemos.features import bm25_adjustment, bm25_score_adjustment

    date0 = datetime(2023, 1, 1, tzinfo=UTC)
    logits = np.asarray([3.0, 2.0, 0.5, -1.0])
    scores = np.asarray([1.0, 2.0, 20.0, 1.0])  # one turn matches far better than the rest
    pool = PoolView(logits, ("s",) * 4, (date0,) * 4, np.zeros((4, 0)),
                    bm25_ranks=np.asarray([3, 2, 1, 4]), bm25_scores=scores)
    adjustment = bm25_score_adjustment(pool, QueryContext(), weight=2.0)
    np.testing.assert_allclose(adjustment, 2.0 * logits.std() * (scores - scores.mean()) / scores.std())
    assert adjustment[0] == adjustment[3]  # equal scores, equal evidence, whatever their ranks
    # the standout's lead over the runner-up is larger by score than by rank
    by_rank = bm25_adjustment(pool, QueryContext(), weight=2.0)
    assert adjustment[2] - adjustment[1] > by_rank[2] - by_rank[1]
    flat = PoolView(logits, ("s",) * 4, (date0,) * 4, np.zeros((4, 0)), bm25_scores=np.full(4, 3.0))
    assert not bm25_score_adjustment(flat, QueryContext(), weight=2.0).any()
    missing = PoolView(logits, ("s",) * 4, (date0,) * 4, np.zeros((4, 0)))
    assert not bm25_score_adjustment(missing, QueryContext(), weight=2.0).any()
    assert FeatureSetting(Feature.BM25_SCORE, {"weight": 1}).label() == "bm25_score(weight=1)"


def test_retriever_scores_give_unlisted_turns_the_lowest_listed_score() -> None:
    from mnemos.errors import InvalidParameterError
    from mnemos.features import retriever_scores

    candidates = [(7, 9.0), (3, 5.0), (5, 1.0)]
    assert retriever_scores([5, 3, 7, 8], candidates, depth=3).tolist() == [1.0, 5.0, 9.0, 1.0]
    assert retriever_scores([5, 3, 7, 8], candidates, depth=2).tolist() == [5.0, 5.0, 9.0, 5.0]  # 5 past the cut
    assert retriever_scores([1, 2], [], depth=30).tolist() == [0.0, 0.0]
    with pytest.raises(InvalidParameterError):
        retriever_scores([1], candidates, depth=0)


def test_retriever_ranks_cut_the_list_at_its_depth() -> None:
    from mnemos.errors import InvalidParameterError
    from mnemos.features import retriever_ranks

    candidates = [(7, 9.0), (3, 5.0), (5, 1.0)]
    assert retriever_ranks([5, 3, 7, 8], candidates, depth=3).tolist() == [3, 2, 1, 4]
    assert retriever_ranks([5, 3, 7, 8], candidates, depth=2).tolist() == [3, 2, 1, 3]  # 5 is past the cut
    assert retriever_ranks([1], [], depth=30).tolist() == [31]
    with pytest.raises(InvalidParameterError):
        retriever_ranks([1], candidates, depth=0)


def test_a_floor_keeps_evidence_when_the_cross_encoder_cannot_tell_the_pool_apart() -> None:
    # "Where do I live now?" over "user: hi", "user: ok", "user: I live in Lisbon." in a small tenant: the
    # shipped cross-encoder rated all three within 0.2 logits, greetings first, and z-scoring weighed that
    # noise as fully as a confident ranking, so BM25's match of "live" could not lift the answer
    from mnemos.features import bm25_score_adjustment, first_stage_adjustment

    date0 = datetime(2023, 1, 1, tzinfo=UTC)
    logits = np.asarray([-3.656, -3.609, -3.781])
    pool = PoolView(logits, ("s",) * 3, (date0,) * 3, np.zeros((3, 0)), initial_ranks=np.asarray([2, 3, 1]),
                    bm25_scores=np.asarray([0.0, 0.0, 1.2]))
    settings = [FeatureSetting(Feature.FIRST_STAGE, {"weight": 0.5}), FeatureSetting(Feature.BM25_SCORE, {"weight": 0.5})]
    floored = [FeatureSetting(s.feature, {**s.params, "floor": 1.0}) for s in settings]
    assert apply_features(pool, QueryContext(), settings)[0] != 2  # without a floor: a greeting first
    assert apply_features(pool, QueryContext(), floored)[0] == 2  # with it: the answer
    # a confident cross-encoder (spread above the floor) is left exactly as it was
    sharp = PoolView(np.asarray([4.0, -2.0, 1.0]), ("s",) * 3, (date0,) * 3, np.zeros((3, 0)),
                     initial_ranks=np.asarray([2, 3, 1]), bm25_scores=np.asarray([0.0, 0.0, 1.2]))
    np.testing.assert_array_equal(feature_scores(sharp, QueryContext(), settings),
                                  feature_scores(sharp, QueryContext(), floored))
    low = bm25_score_adjustment(pool, QueryContext(), weight=0.5)
    high = bm25_score_adjustment(pool, QueryContext(), weight=0.5, floor=1.0)
    np.testing.assert_allclose(high, low * 1.0 / logits.std())
    np.testing.assert_allclose(first_stage_adjustment(pool, QueryContext(), weight=0.5, floor=1.0),
                               first_stage_adjustment(pool, QueryContext(), weight=0.5) / logits.std())
