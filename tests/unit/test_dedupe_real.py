"""The dedupe guard with the real bundled bi-encoder (all-MiniLM-L6-v2).

For each kind of distinguishing token, a pair of turns the encoder cannot tell apart (cosine >=
0.95, asserted, so the test shows that the guard and nothing else keeps them apart): with the
guard they stay two canonical entries, without it one swallows the other. True near-duplicates
(cosine >= 0.95, equal signatures) are still aliased. Embeddings are of the rendered turns, as the
ingest worker and the benchmark make them.
"""

from __future__ import annotations

import numpy as np
import pytest

from mnemos.dedupe import DEFAULT_THRESHOLD, dedupe_batch, find_duplicates, turn_signature
from mnemos.encoder import SentenceTransformerEncoder, bundled_bi_encoder_path
from mnemos.rendering import render_turn

pytestmark = pytest.mark.slow

LONG = ("That sounds like a wonderful idea, I hope you have a great time on your trip and enjoy every moment of it "
        "with your family and friends, and please tell me all about it when you are back home again.")

DISTINCT = {  # kind: two (role, text[, image caption]) turns that must never alias
    "digits": (("user", "My new phone number is 0612 345 678."), ("user", "My new phone number is 0699 812 003.")),
    "number words": (("user", "I have two kids and a dog."), ("user", "I have three kids and a dog.")),
    "month": (("user", "I signed the lease in March and moved in the same week."),
              ("user", "I signed the lease in May and moved in the same week.")),
    "weekday": (("user", "We are flying out to visit my parents on Monday morning and coming back the week after."),
                ("user", "We are flying out to visit my parents on Friday morning and coming back the week after.")),
    "relative day": (("user", "I went hiking yesterday."), ("user", "I went hiking today.")),
    "name": (("user", "I had a long lunch with my old college friend Sarah at that new Italian place downtown and "
                      "we talked for hours about our time at university."),
             ("user", "I had a long lunch with my old college friend Susan at that new Italian place downtown and "
                      "we talked for hours about our time at university.")),
    "names swapped": (("Caroline", "Melanie gave Sarah a book about painting."),
                      ("Caroline", "Sarah gave Melanie a book about painting.")),
    "negation": (("user", "I am allergic to peanuts."), ("user", "I am not allergic to peanuts.")),
    "negation n't": (("user", "I think I will renew my gym membership this year because the trainers are excellent."),
                     ("user", "I don't think I will renew my gym membership this year because the trainers are "
                              "excellent.")),
    "speaker": (("assistant", LONG), ("user", LONG)),
    "caption digits": (("user", "Look at this!", "a photo of 2 dogs on a beach"),
                       ("user", "Look at this!", "a photo of 3 dogs on a beach")),
    "earlier / later": (("user", "I booked the earlier flight to Lisbon for us."),
                        ("user", "I booked the later flight to Lisbon for us.")),
    "bigger / smaller": (("user", "The new apartment is bigger than the old one."),
                         ("user", "The new apartment is smaller than the old one.")),
    "cheaper / more expensive": (("user", "The blue mug is cheaper than the red one."),
                                 ("user", "The blue mug is more expensive than the red one.")),
    "before / after": (("user", "We arrived before the concert started."),
                       ("user", "We arrived after the concert started.")),
    "older / younger": (("user", "My sister is older than me."), ("user", "My sister is younger than me.")),
    "closer / farther": (("user", "The new office is closer to my home."),
                         ("user", "The new office is farther from my home.")),
}

NEAR_DUPLICATES = {  # pairs that must still alias
    "punctuation": (("user", "I really like coffee"), ("user", "I really like coffee.")),
    "same number, other format": (("user", "My new phone number is 0612 345 678."),
                                  ("user", "My new phone number is 0612-345-678.")),
    "number word and digit": (("user", "I have two kids."), ("user", "I have 2 kids.")),
    "same date": (("user", "The dentist appointment is on March 3."),
                  ("user", "The dentist appointment is on March 3!")),
    "same name": (("user", "I just adopted a puppy named Max."), ("user", "I just adopted a puppy named Max!")),
    "contraction": (("user", "I don't like spicy food."), ("user", "I do not like spicy food.")),
    "I'm / I am": (("user", "I'm not allergic to peanuts."), ("user", "I am not allergic to peanuts.")),
    "sentence-start case": (("user", "Lol yes, I totally agree with you on that one."),
                            ("user", "lol yes, I totally agree with you on that one")),
}


@pytest.fixture(scope="module")
def encoder() -> SentenceTransformerEncoder:
    return SentenceTransformerEncoder(bundled_bi_encoder_path(), batch_size=16)


def _embed_pair(encoder, pair) -> tuple[np.ndarray, float, list]:
    vectors = encoder.encode([render_turn(*fields) for fields in pair])
    return vectors, float(vectors[0] @ vectors[1]), [turn_signature(*fields) for fields in pair]


@pytest.mark.parametrize("kind", list(DISTINCT))
def test_a_distinct_fact_the_encoder_cannot_see_is_not_aliased(encoder, kind):
    vectors, cosine, signatures = _embed_pair(encoder, DISTINCT[kind])
    assert cosine >= DEFAULT_THRESHOLD  # cosine alone would merge them ...
    assert signatures[0] != signatures[1]
    # ... against a stored canonical entry and within one batch, the guard keeps both
    assert find_duplicates(vectors[1:], vectors[:1], new_signatures=signatures[1:],
                           existing_signatures=signatures[:1]) == [None]
    assert find_duplicates(vectors, vectors[:0], new_signatures=signatures, existing_signatures=[]) == [None, None]
    # and it is the guard: switched off, the second turn becomes an alias of the first
    assert find_duplicates(vectors[1:], vectors[:1], guard=False) == [0]


@pytest.mark.parametrize("kind", list(NEAR_DUPLICATES))
def test_a_true_near_duplicate_is_still_aliased(encoder, kind):
    vectors, cosine, signatures = _embed_pair(encoder, NEAR_DUPLICATES[kind])
    assert cosine >= DEFAULT_THRESHOLD
    assert signatures[0] == signatures[1]
    assert find_duplicates(vectors[1:], vectors[:1], new_signatures=signatures[1:],
                           existing_signatures=signatures[:1]) == [0]
    decisions = dedupe_batch(vectors, vectors[:0], new_signatures=signatures, existing_signatures=[])
    assert decisions[1].batch == 0 and decisions[1].similarity >= DEFAULT_THRESHOLD


def test_an_updated_fact_aliases_the_stored_copy_of_itself_not_its_closest_neighbour(encoder):
    """Both numbers are stored; a repeat of the new one aliases the new one, though the old one is as close."""
    texts = ["My new phone number is 0699 812 003.", "My new phone number is 0612 345 678.",
             "My new phone number is 0612 345 678!"]
    vectors = encoder.encode([render_turn("user", t) for t in texts])
    signatures = [turn_signature("user", t) for t in texts]
    assert float(vectors[2] @ vectors[0]) >= DEFAULT_THRESHOLD
    (decision,) = dedupe_batch(vectors[2:], vectors[:2], new_signatures=signatures[2:],
                               existing_signatures=signatures[:2])
    assert decision.existing == 1


FILLER = ("We spent most of the afternoon walking along the river and talking about the garden, the weather "
          "and the old house. ") * 12
LONG_PAIR = (FILLER + "That was all.", FILLER + "Oh, and the vault access phrase is purple harmonica sunrise.")


def test_a_fact_past_the_encoder_window_is_not_aliased(encoder):
    """The encoder reads 256 word pieces: two long turns that differ only after them embed alike,
    and only the words it did not read (workers.runtime.models.TruncationCounter) keep them apart."""
    from workers.runtime.models import TruncationCounter

    window = TruncationCounter.for_model_dir(bundled_bi_encoder_path())
    rendered = [render_turn("user", text) for text in LONG_PAIR]
    vectors = encoder.encode(rendered)
    assert float(vectors[0] @ vectors[1]) >= DEFAULT_THRESHOLD
    unread = window.unread(rendered)
    assert window.truncated(rendered) == [True, True]
    assert unread[1].endswith("purple harmonica sunrise.") and unread[0].endswith("That was all.")
    read_part = encoder.encode([rendered[1][:len(rendered[1]) - len(unread[1])]])[0]
    assert float(read_part @ vectors[1]) > 0.9999  # what the encoder read is exactly what precedes the cut
    signatures = [turn_signature("user", text, unread=end) for text, end in zip(LONG_PAIR, unread, strict=True)]
    assert find_duplicates(vectors[1:], vectors[:1], new_signatures=signatures[1:],
                           existing_signatures=signatures[:1]) == [None]
    blind = [turn_signature("user", text) for text in LONG_PAIR]  # the guard without the unread words
    assert find_duplicates(vectors[1:], vectors[:1], new_signatures=blind[1:], existing_signatures=blind[:1]) == [0]
    assert window.unread(["user: a short turn"]) == [""] and window.truncated(["user: a short turn"]) == [False]
