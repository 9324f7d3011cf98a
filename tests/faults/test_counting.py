"""The fault suite's counting is an oracle that can fail: seeded losses and doubles are caught."""

from __future__ import annotations

import pytest

from bench.faults.run import PhaseReport, count_across_restart, count_scores, count_turns

pytestmark = pytest.mark.faults

ACCEPTED = [("a", "1"), ("a", "2"), ("b", "1")]


def test_nothing_lost_nothing_doubled() -> None:
    assert count_turns(ACCEPTED, ACCEPTED, []) == (0, 0)


def test_a_missing_turn_is_lost() -> None:
    assert count_turns(ACCEPTED, ACCEPTED[:2], []) == (1, 0)


def test_a_second_row_a_phantom_and_a_dead_lettered_good_turn_are_duplicates() -> None:
    assert count_turns(ACCEPTED, [*ACCEPTED, ("a", "1")], []) == (0, 1)
    assert count_turns(ACCEPTED, [*ACCEPTED, ("c", "9")], []) == (0, 1)
    assert count_turns(ACCEPTED, ACCEPTED, [("b", "1")]) == (0, 1)
    assert count_turns(ACCEPTED, ACCEPTED[1:], [("a", "1")]) == (1, 1)  # dead-lettered instead of stored


def test_across_an_empty_restart_redis_losses_are_counted_apart_from_mnemos_losses() -> None:
    before, after = [("a", "1"), ("a", "2")], [("a", "3"), ("b", "1")]
    assert count_across_restart(before, after, [*before, *after], []) == (0, 0, 0)
    assert count_across_restart(before, after, [("a", "1"), *after], []) == (1, 0, 0)  # Redis took a 2
    assert count_across_restart(before, after, [*before, ("a", "3")], []) == (0, 1, 0)  # Mnemos lost b 1
    assert count_across_restart(before, after, [*before, *after, ("a", "1")], []) == (0, 0, 1)
    assert count_across_restart(before, after, [*after], [("a", "3")]) == (2, 0, 1)  # stored and dead-lettered


def test_a_score_applied_twice_is_a_mismatch() -> None:
    expected = {("a", 1, 0): 0.25, ("a", 2, 1): 0.125}
    assert count_scores(dict(expected), expected) == 0
    assert count_scores({("a", 1, 0): 0.5, ("a", 2, 1): 0.125}, expected) == 1
    assert count_scores({("a", 1, 0): 0.25}, expected) == 1
    assert count_scores({**expected, ("b", 3, 0): 1e-3}, expected) == 1
    assert count_scores({("a", 1, 0): 0.25 + 1e-17, ("a", 2, 1): 0.125}, expected) == 0  # summation order


def test_a_report_is_ok_only_when_every_figure_is() -> None:
    good = PhaseReport("turns", settled=True, dead_letters_expected=2, dead_letters_found=2)
    assert good.ok
    for change in ({"lost": 1}, {"duplicated": 1}, {"settled": False}, {"dead_letters_found": 1},
                   {"dedupe_violations": 1}, {"score_mismatches": 1}, {"buffer_violations": 1}):
        assert not PhaseReport(**{**good.__dict__, **change}).ok, change
    assert "lost=0 duplicated=0" in good.line()
    empty = PhaseReport("redis_empty", settled=True, unacked_at_restart=5, upstream_lost=5)
    assert empty.ok and "upstream_lost=5" in empty.line()
    assert not PhaseReport(**{**empty.__dict__, "upstream_lost": 6}).ok  # more than Redis held: Mnemos lost it
