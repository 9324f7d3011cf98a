"""NDCG@k / Recall@k on hand-computed examples; the behaviour metrics of Clustered Retrieval-Induced Forgetting §5.3."""

import math

import pytest

from mnemos import evaluation


def test_ndcg_hand_computed():
    # ranked a x b y c, relevant {a, b, c, d}, k = 5
    # DCG  = 1/log2(2) + 1/log2(4) + 1/log2(6)            = 1 + 0.5 + 0.3868528     = 1.8868528
    # IDCG = 1/log2(2) + 1/log2(3) + 1/log2(4) + 1/log2(5) = 1 + 0.6309298 + 0.5 + 0.4306766 = 2.5616063
    # NDCG = 1.8868528 / 2.5616063 = 0.7365897
    assert evaluation.ndcg_at_k(["a", "x", "b", "y", "c"], {"a", "b", "c", "d"}, k=5) == pytest.approx(0.7365897, abs=1e-7)


def test_ndcg_edges():
    assert evaluation.ndcg_at_k(["a", "b"], {"a", "b"}, k=10) == pytest.approx(1.0)
    assert evaluation.ndcg_at_k(["x", "a"], {"a"}, k=1) == 0.0
    # rel at rank 2 only: (1/log2 3) / 1 = 0.6309298
    assert evaluation.ndcg_at_k(["x", "a"], {"a"}, k=2) == pytest.approx(0.6309298, abs=1e-7)
    assert evaluation.ndcg_at_k(["a"], set(), k=10) == 0.0
    assert evaluation.ndcg_at_k([], {"a"}, k=10) == 0.0
    assert evaluation.ndcg_at_k(["a", "a", "b"], {"a", "b"}, k=2) == pytest.approx(1.0)  # repeats count once
    assert evaluation.ndcg_at_k([3, 1, 2], {1}, k=3) == pytest.approx(0.6309298, abs=1e-7)  # int ids work too
    with pytest.raises(ValueError):
        evaluation.ndcg_at_k(["a"], {"a"}, k=0)


def test_recall_hand_computed():
    ranked = ["a", "x", "b", "y", "c"]
    relevant = {"a", "b", "c", "d"}
    assert evaluation.recall_at_k(ranked, relevant, 3) == 0.5      # a, b of 4
    assert evaluation.recall_at_k(ranked, relevant, 5) == 0.75     # a, b, c of 4
    assert evaluation.recall_at_k(ranked, set(), 5) == 0.0
    assert evaluation.recall_at_k(["a", "a", "x"], {"a", "x"}, 2) == 1.0


def test_remap_relevant_through_aliases():
    alias_map = {"u7": "u3", "u3": "u3"}
    assert evaluation.remap_relevant({"u7", "u9"}, alias_map) == frozenset({"u3", "u9"})
    assert evaluation.ndcg_at_k(["u3"], evaluation.remap_relevant({"u7"}, alias_map), k=10) == 1.0


def test_top1_behaviour_cases():
    rel_turns, rel_sessions = {"u1"}, {"S1"}
    exact = evaluation.top1_behaviour(("u1",), "S1", rel_turns, rel_sessions, 3.0, 2.0)
    assert exact == evaluation.Top1Behaviour(True, False, False, False)
    sibling = evaluation.top1_behaviour(("u2",), "S1", rel_turns, rel_sessions, 1.0, 2.0)
    assert sibling == evaluation.Top1Behaviour(False, False, True, True)
    wrong = evaluation.top1_behaviour(("u9",), "S4", rel_turns, rel_sessions, 2.0, 2.0)
    assert wrong == evaluation.Top1Behaviour(False, True, False, False)  # 2.0 is not below T = 2.0
    via_alias = evaluation.top1_behaviour(("u5", "u1"), "S3", rel_turns, rel_sessions)
    assert via_alias.exact_episode and not via_alias.wrong_family and not via_alias.abstain
    nothing = evaluation.top1_behaviour(None, None, rel_turns, rel_sessions, None, 2.0)
    assert nothing == evaluation.Top1Behaviour(False, False, False, True)


def test_abstain_and_rates():
    assert evaluation.abstains(1.9, 2.0) and not evaluation.abstains(2.0, 2.0) and evaluation.abstains(None, 2.0)
    flags = [
        evaluation.Top1Behaviour(True, False, False, False),
        evaluation.Top1Behaviour(False, True, False, True),
        evaluation.Top1Behaviour(False, True, False, True),
        evaluation.Top1Behaviour(False, False, True, False),
    ]
    rates = evaluation.behaviour_rates(flags)
    assert (rates.n_queries, rates.exact_episode, rates.wrong_family, rates.sibling_confusion, rates.abstain) == (
        4, 0.25, 0.5, 0.25, 0.5)
    assert evaluation.behaviour_rates([]).n_queries == 0


def test_session_metrics_rank_sessions_by_their_best_turn() -> None:
    session_of = {1: "s1", 2: "s1", 3: "s2", 4: "s3", 5: "s4", 6: "s5", 7: "s6"}
    # sessions by best turn: s1 (turns 1, 2), s2, s3, s4, s5, s6
    assert evaluation.session_ranking([1, 2, 3, 4, 5, 6, 7], session_of) == ["s1", "s2", "s3", "s4", "s5", "s6"]
    m = evaluation.session_metrics([1, 2, 3, 4, 5, 6, 7], {3, 7}, session_of)  # relevant sessions s2 and s6
    assert m.hit1 == 0.0
    assert m.recall5 == 0.5  # s2 at session rank 2 is in the top 5, s6 at rank 6 is not
    assert m.ndcg5 == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    best = evaluation.session_metrics([2, 5], {1}, session_of)  # turn 2 shares session s1 with the relevant turn 1
    assert (best.hit1, best.recall5, best.ndcg5) == (1.0, 1.0, 1.0)
    assert evaluation.session_metrics([1], set(), session_of) == evaluation.SessionMetrics(0.0, 0.0, 0.0)
