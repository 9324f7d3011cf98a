"""Dedupe: the cosine rule against a brute-force oracle, the guard, and the distinguishing-token rules.

The cosine-rule tests run twice: with the guard off, and with the guard on and every signature
equal (the guard must then change nothing).
"""

import math

import numpy as np
import pytest

from mnemos.antonyms import GRADABLE_PAIRS, OPPOSITE_WORDS, PLAIN_PAIRS, degrees
from mnemos.dedupe import (
    DEFAULT_THRESHOLD,
    Signature,
    Token,
    TokenKind,
    dedupe_batch,
    distinguishing_tokens,
    find_duplicates,
    turn_signature,
    unread_digest,
)
from mnemos.errors import DimensionMismatchError, InvalidParameterError

from .conftest import unit_rows

SAME = Signature("user", ())


def _at_cos(base: np.ndarray, other: np.ndarray, cos: float) -> np.ndarray:
    """A unit vector at exactly ``cos`` to unit ``base``, in the plane of base and other."""
    ortho = other - (other @ base) * base
    ortho /= np.linalg.norm(ortho)
    return (cos * base + math.sqrt(1 - cos * cos) * ortho).astype(np.float32)


def _oracle(new, existing, threshold, new_sigs=None, existing_sigs=None):
    """Pairwise cosine loops over the rows with an equal signature (all rows without signatures):
    existing canonicals first, then earlier canonical batch rows."""
    new_sigs = new_sigs or [SAME] * len(new)
    existing_sigs = existing_sigs or [SAME] * len(existing)
    out, canon = [], []
    for i, row in enumerate(new):
        cos_e = [float(sum(float(a) * float(b) for a, b in zip(row, e, strict=True)))
                 if existing_sigs[j] == new_sigs[i] else -math.inf for j, e in enumerate(existing)]
        if cos_e and max(cos_e) >= threshold:
            out.append(cos_e.index(max(cos_e)))
            continue
        cos_b = [float(sum(float(a) * float(b) for a, b in zip(row, new[j], strict=True)))
                 if new_sigs[j] == new_sigs[i] else -math.inf for j in canon]
        if cos_b and max(cos_b) >= threshold:
            out.append(-(canon[cos_b.index(max(cos_b))] + 1))
            continue
        canon.append(i)
        out.append(None)
    return out


@pytest.fixture(params=["guard_off", "guard_on_equal_signatures"])
def kw(request):
    """Keyword arguments of dedupe_batch for ``n`` new and ``m`` existing rows."""
    if request.param == "guard_off":
        return lambda n, m: {"guard": False}
    return lambda n, m: {"new_signatures": [SAME] * n, "existing_signatures": [SAME] * m}


# ---- the cosine rule (unchanged by the guard when signatures are equal) -------------------------


def test_matches_bruteforce_oracle_on_planted_duplicates(rng, kw):
    existing = unit_rows(rng, 30, 12)
    fresh = unit_rows(rng, 10, 12)
    planted = [_at_cos(existing[3], fresh[0], 0.97), _at_cos(fresh[1], fresh[2], 0.99),
               _at_cos(existing[7], fresh[3], 0.93)]
    new = np.vstack([fresh[1:2], planted[0][None], fresh[4:8], planted[1][None], planted[2][None]])
    got = find_duplicates(new, existing, **kw(len(new), len(existing)))
    assert got == _oracle(new, existing, DEFAULT_THRESHOLD)
    assert got[1] == 3       # planted near copy of existing[3]
    assert got[6] == -1      # near copy of batch row 0 (fresh[1])
    assert got[7] is None    # 0.93 is below the threshold
    assert len(got) == len(new)  # nothing dropped


def test_threshold_is_inclusive_and_best_match_wins(rng, kw):
    base, other = unit_rows(rng, 2, 6)
    at_096 = _at_cos(base, other, 0.96)
    at_099 = _at_cos(base, other, 0.99)
    existing = np.vstack([at_096, at_099])
    (decision,) = dedupe_batch(base[None], existing, **kw(1, 2))
    assert decision.existing == 1 and decision.similarity == pytest.approx(0.99, abs=1e-5)
    assert dedupe_batch(base[None], existing, threshold=0.995, **kw(1, 2))[0].is_duplicate is False
    exact = _at_cos(base, other, 0.96)
    assert find_duplicates(exact[None], base[None], threshold=0.96 - 1e-6, **kw(1, 1)) == [0]


def test_within_batch_aliases_point_at_canonicals_only(rng, kw):
    a, helper = unit_rows(rng, 2, 8)
    b = _at_cos(a, helper, 0.96)
    c = _at_cos(b, -a + helper, 0.96)  # close to b, less close to a
    assert float(a @ c) < 0.95
    decisions = dedupe_batch(np.vstack([a, b, c]), np.zeros((0, 8), np.float32), **kw(3, 0))
    assert [d.batch for d in decisions] == [None, 0, None]  # b aliases a; c does not chain through b
    assert [d.existing for d in decisions] == [None, None, None]


def test_existing_match_beats_batch_match(rng, kw):
    a, helper = unit_rows(rng, 2, 8)
    twin = _at_cos(a, helper, 0.98)
    decisions = dedupe_batch(np.vstack([a, twin]), a[None], **kw(2, 1))
    assert [d.existing for d in decisions] == [0, 0]


def test_empty_inputs_and_shape_errors(rng, kw):
    assert find_duplicates(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), **kw(0, 0)) == []
    assert find_duplicates(unit_rows(rng, 2, 4), np.zeros((0,), np.float32), **kw(2, 0)) == [None, None]
    with pytest.raises(DimensionMismatchError):
        find_duplicates(unit_rows(rng, 2, 4), unit_rows(rng, 2, 5), **kw(2, 2))
    with pytest.raises(DimensionMismatchError):
        find_duplicates(np.zeros(4, np.float32), unit_rows(rng, 2, 4), **kw(1, 2))


def test_cosine_exactly_at_threshold_is_a_duplicate(kw):
    t = np.float32(0.96)
    threshold = float(t)  # the float32 value itself, so the cosine below equals it bit for bit
    e1 = np.array([1.0, 0.0], np.float32)
    at_t = np.array([t, np.sqrt(np.float32(1) - t * t)], np.float32)  # e1 . at_t == t exactly
    assert float(e1 @ at_t) == threshold
    assert find_duplicates(e1[None], at_t[None], threshold=threshold, **kw(1, 1)) == [0]
    assert find_duplicates(np.vstack([e1, at_t]), np.zeros((0, 2), np.float32), threshold=threshold,
                           **kw(2, 0)) == [None, -1]


# ---- the guard -------------------------------------------------------------------------------


def test_guard_matches_the_oracle_on_random_signatures(rng):
    existing = unit_rows(rng, 20, 10)
    fresh = unit_rows(rng, 6, 10)
    new = np.vstack([_at_cos(existing[i % 20], fresh[i % 6], 0.96 + 0.001 * i) for i in range(24)] + [fresh])
    kinds = [Signature("a", ()), Signature("b", ()), Signature("a", (Token(TokenKind.NUMBER, "1"),))]
    new_sigs = [kinds[i] for i in rng.integers(0, 3, len(new))]
    existing_sigs = [kinds[i] for i in rng.integers(0, 3, len(existing))]
    got = find_duplicates(new, existing, new_signatures=new_sigs, existing_signatures=existing_sigs)
    assert got == _oracle(new, existing, DEFAULT_THRESHOLD, new_sigs, existing_sigs)
    unguarded = find_duplicates(new, existing, guard=False)
    assert unguarded == _oracle(new, existing, DEFAULT_THRESHOLD)
    assert got != unguarded  # the signatures changed some decisions
    for row, target in enumerate(got):  # and every alias shares its canonical's signature
        if target is not None:
            assert new_sigs[row] == (existing_sigs[target] if target >= 0 else new_sigs[-target - 1])


def test_guard_blocks_a_close_match_with_another_signature_and_takes_the_next_best(rng):
    base, other = unit_rows(rng, 2, 6)
    old_number, new_number = Signature("user", (Token(TokenKind.NUMBER, "0699"),)), \
        Signature("user", (Token(TokenKind.NUMBER, "0612"),))
    existing = np.vstack([_at_cos(base, other, 0.99), _at_cos(base, other, 0.97)])
    (blocked,) = dedupe_batch(base[None], existing[:1], new_signatures=[new_number], existing_signatures=[old_number])
    assert not blocked.is_duplicate
    (decision,) = dedupe_batch(base[None], existing, new_signatures=[new_number],
                               existing_signatures=[old_number, new_number])
    assert decision.existing == 1 and decision.similarity == pytest.approx(0.97, abs=1e-5)


def test_guard_applies_within_a_batch_and_keeps_the_no_chain_rule(rng):
    a, helper = unit_rows(rng, 2, 8)
    near = _at_cos(a, helper, 0.99)
    x, y = Signature("user", (Token(TokenKind.NAME, "sarah"),)), Signature("user", (Token(TokenKind.NAME, "emily"),))
    decisions = dedupe_batch(np.vstack([a, near, near]), np.zeros((0, 8), np.float32),
                             new_signatures=[x, y, y], existing_signatures=[])
    assert [d.batch for d in decisions] == [None, None, 1]  # row 1 is blocked, so it is canonical for row 2


def test_guard_needs_signatures_of_matching_length(rng):
    rows = unit_rows(rng, 2, 4)
    with pytest.raises(InvalidParameterError):
        dedupe_batch(rows, rows)  # on by default: cosine alone is never used silently
    with pytest.raises(InvalidParameterError):
        dedupe_batch(rows, rows, new_signatures=[SAME, SAME], existing_signatures=None)
    with pytest.raises(InvalidParameterError):
        find_duplicates(rows, rows, new_signatures=[SAME], existing_signatures=[SAME, SAME])
    assert find_duplicates(rows, rows, guard=False) == [0, 1]  # off: the signatures are not read


# ---- distinguishing tokens -------------------------------------------------------------------


def _values(text: str) -> list[tuple[str, str]]:
    return [(t.kind.value, t.value) for t in distinguishing_tokens(text)]


def _same(a: str, b: str, role_a: str = "user", role_b: str = "user") -> bool:
    return turn_signature(role_a, a) == turn_signature(role_b, b)


def test_digits_are_kept_in_order():
    assert _values("My new phone number is 0612 345 678.") == [("opposite", "new"), ("number", "0612"),
                                                                 ("number", "345"), ("number", "678")]
    assert _values("Flight KL1234 at 7:45, gate B12, 5PM") == [
        ("number", "kl1234"), ("number", "7"), ("number", "45"),
        ("number", "b12"), ("number", "5pm")]
    assert not _same("My new phone number is 0612 345 678.", "My new phone number is 0699 812 003.")
    assert not _same("My number is 0612 345 678.", "My number is 0612 678 345.")  # order matters
    assert not _same("I have 2 cats and 3 dogs.", "I have 3 cats and 2 dogs.")
    assert _same("My new phone number is 0612 345 678.", "my new phone number is 0612-345-678!")


def test_number_words_agree_with_digits():
    assert _values("I have two kids and it is my third try") == [("number", "2"), ("number", "3rd")]
    assert _same("I have two kids.", "I have 2 kids.")
    assert _same("It is my third try.", "It is my 3rd try.")
    assert not _same("I have two kids.", "I have three kids.")


def test_dates_months_weekdays_and_relative_days():
    assert _values("We fly on Monday, back in March; the 2024-05-01 flight") == [
        ("date", "monday"), ("date", "march"), ("number", "2024"), ("number", "05"), ("number", "01")]
    assert _values("I may go in May") == [("date", "may")]  # the verb is not a month
    assert _values("Yesterday was fine, today too, next week maybe") == [
        ("date", "yesterday"), ("date", "today"), ("date", "next"), ("date", "week")]
    assert not _same("I signed the lease in March.", "I signed the lease in May.")
    assert not _same("My yoga class moved to Tuesday evenings.", "My yoga class moved to Thursday evenings.")
    assert not _same("I went hiking yesterday.", "I went hiking today.")
    assert _same("I went hiking yesterday.", "I went hiking yesterday!!")


def test_names_are_capitalised_words_that_do_not_start_a_sentence():
    assert _values("Yesterday I had lunch with my friend Sarah. Then I called Tomás's sister!") == [
        ("date", "yesterday"), ("name", "sarah"), ("name", "tomás")]
    assert _values("Lol I'm in NYC with my iPhone. Great!") == [("name", "nyc"), ("name", "iphone")]
    assert _values("I saw Dr. Smith and J. K. Rowling") == [("name", "dr"), ("name", "smith"), ("name", "j"),
                                                           ("name", "k"), ("name", "rowling")]
    assert _values("The cat sleeps. My dog barks? Oh well") == []  # sentence starts are not names
    assert not _same("I had lunch with my friend Sarah.", "I had lunch with my friend Emily.")
    assert not _same("Melanie gave Sarah a book.", "Sarah gave Melanie a book.")
    assert _same("Lol yes, I agree with Sarah", "lol yes I agree with Sarah!")


def test_negation_i_do_and_i_dont():
    assert _values("I do.") == []
    assert _values("I don't.") == [("negation", "not")]
    assert not _same("I do.", "I don't.")
    assert not _same("I am allergic to peanuts.", "I am not allergic to peanuts.")
    assert not _same("I eat meat.", "I never eat meat.")
    assert not _same("I can swim.", "I cannot swim.")
    for negated in ("I don't like it", "I do not like it", "I dont like it", "I don\u2019t like it"):
        assert _values(negated) == [("negation", "not"), ("opposite", "like")], negated
    assert _values("No, nobody, nothing, none, neither nor, without") == [
        ("negation", w) for w in ("no", "nobody", "nothing", "none", "neither", "nor", "without")]


@pytest.mark.parametrize(("a", "b"), [
    ("I booked the earlier flight to Lisbon.", "I booked the later flight to Lisbon."),
    ("The new apartment is bigger than the old one.", "The new apartment is smaller than the old one."),
    ("The new apartment is big.", "The new apartment is bigger."),  # a degree is another fact
    ("This is the best pizza in town.", "This is the worst pizza in town."),
    ("It was the earliest train.", "It was the latest train."),
    ("The blue mug is cheaper.", "The blue mug is more expensive."),
    ("We arrived before the concert.", "We arrived after the concert."),
    ("Our team won the final.", "Our team lost the final."),
    ("I love jazz.", "I hate jazz."),
])
def test_opposites_and_their_degrees_keep_turns_apart(a, b):
    assert not _same(a, b)
    assert _same(a, a.replace(".", "!"))  # the same words are still a duplicate


def test_opposite_words_are_listed_once_with_their_degrees():
    assert degrees("big") == ("big", "bigger", "biggest")
    assert degrees("early") == ("early", "earlier", "earliest")
    assert degrees("late") == ("late", "later", "latest")
    assert degrees("good") == ("good", "better", "best")
    assert degrees("cool") == ("cool", "cooler", "coolest") and degrees("new") == ("new", "newer", "newest")
    assert {"earlier", "later", "bigger", "smaller", "worst", "fewer", "after", "more"} <= OPPOSITE_WORDS
    assert {"much", "little", "in", "out", "up", "down", "first", "last"}.isdisjoint(OPPOSITE_WORDS)
    for first, second in GRADABLE_PAIRS + PLAIN_PAIRS:
        assert first != second and first in OPPOSITE_WORDS and second in OPPOSITE_WORDS
    assert _values("Earlier I said the later train, not the Bigger bus") == [
        ("opposite", "earlier"), ("opposite", "later"), ("negation", "not"), ("opposite", "bigger")]


def test_speaker_and_caption_are_part_of_the_signature():
    assert not _same("I really like coffee.", "I really like coffee.", "Caroline", "Melanie")
    assert not _same("I really like coffee.", "I really like coffee.", "user", "assistant")
    assert _same("I really like coffee.", "I really like coffee.", " Caroline ", "caroline")
    assert turn_signature("user", "Look!", "a photo of 2 dogs") != turn_signature("user", "Look!", "a photo of 3 dogs")
    assert turn_signature("user", "Look!", "a photo of a dog") == turn_signature("user", "Look!", None)
    assert turn_signature("user", "Look at Max", "a dog") == Signature("user", (Token(TokenKind.NAME, "max"),))


@pytest.mark.parametrize(("a", "b"), [
    ("I really like coffee", "I really like coffee."),
    ("I really like coffee.", "I really, really like coffee!"),
    ("I moved to Lisbon in March.", "i moved to Lisbon in March!"),
    ("I don't like spicy food.", "I do not like spicy food at all."),
    ("I'm not allergic to peanuts.", "I am not allergic to peanuts."),
    ("I just adopted a puppy named Max.", "I just adopted a puppy named Max!"),
    ("Thanks, that sounds great!", "Thanks so much, that sounds great."),
])
def test_paraphrases_keep_equal_signatures(a, b):
    assert _same(a, b)


FILLER = ("We spent most of the afternoon walking along the river and talking about the garden, the weather "
          "and the old house. ") * 12


def test_the_words_the_encoder_did_not_read_are_part_of_the_signature():
    """Two long turns that share everything the encoder read (their embeddings are equal) differ in
    what it cut: the signature tells them apart, and the guard keeps them two memories."""
    first, second = FILLER + "That was all.", FILLER + "Oh, and the vault access phrase is purple harmonica sunrise."
    a = turn_signature("user", first, unread="That was all.")
    b = turn_signature("user", second, unread="Oh, and the vault access phrase is purple harmonica sunrise.")
    assert a.tokens == b.tokens and a != b  # no distinguishing token sees the difference
    same_vector = unit_rows(np.random.default_rng(0), 1, 16)
    assert find_duplicates(same_vector, same_vector, new_signatures=[b], existing_signatures=[a]) == [None]
    both = np.vstack([same_vector, same_vector])
    assert find_duplicates(both, both[:0], new_signatures=[a, b], existing_signatures=[]) == [None, None]
    # the same long turn again (or with other punctuation or case past the window) is still a duplicate
    again = turn_signature("user", first, unread="that was ALL!")
    assert find_duplicates(same_vector, same_vector, new_signatures=[again], existing_signatures=[a]) == [0]
    # an end that was cut is not the end of a turn read whole
    assert turn_signature("user", first) != a


def test_the_unread_digest_compares_words_only():
    assert unread_digest("") == unread_digest("  ...!  ") == ""  # nothing, or no word: as if read whole
    assert unread_digest("purple harmonica sunrise") == unread_digest("Purple, harmonica -- sunrise!")
    assert unread_digest("purple harmonica sunrise") != unread_digest("sunrise harmonica purple")
    assert len(unread_digest("x")) == 32 and unread_digest("x") != unread_digest("y")
    with pytest.raises(TypeError):
        unread_digest(None)  # type: ignore[arg-type]


def test_text_must_be_a_string():
    with pytest.raises(TypeError):
        distinguishing_tokens(None)  # type: ignore[arg-type]
