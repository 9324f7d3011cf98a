"""Short chit-chat turns as negatives, and a held-out set to check a model with (docs/reranker.md
"Chit-chat and an unsure cross-encoder").

A cross-encoder trained only on LongMemEval's haystacks has hardly ever seen a turn such as "ok"
or "hi": its turns are long requests and long answers. Asked a question that no turn answers well,
the shipped model rated ``user: ok`` above ``user: I live in Lisbon.``, and in a small tenant, where
every turn is in the pool, the greeting then came first. Pairing each question with a few such turns
of the positive's own speaker, labelled 0, shows the model that a turn saying nothing answers nothing.

The phrases are written for Mnemos (no dataset's text). :data:`TRAINING_PHRASES` are drawn for
training; :data:`HELD_OUT_PHRASES`, which share no phrase with them, are only ever added to pools to
check a model (``mnemos reranker pools --chitchat``), so a check never grades a phrase a model
learned.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from mnemos.rendering import render_turn

__all__ = ["HELD_OUT_PHRASES", "TRAINING_PHRASES", "chitchat_negatives", "chitchat_turns"]

TRAINING_PHRASES: tuple[str, ...] = (
    "hi", "hello", "hey", "hey there", "good morning", "good evening", "ok", "okay", "ok thanks",
    "thanks", "thank you", "thanks a lot", "cool", "nice", "great", "awesome", "sure", "yes", "no",
    "yeah", "nope", "hmm", "lol", "haha", "bye", "see you", "talk later", "got it", "makes sense",
    "sounds good", "alright", "I see", "right", "exactly", "fair enough", "no worries", "sorry",
    "my bad", "one sec", "never mind", "go on", "tell me more", "interesting", "wow", "oh really?",
    "can you repeat that?", "what do you mean?", "that's all for now", "perfect, thanks!",
    "ok let me think", "good to know", "I'll try that", "that helps, thanks", "you're welcome",
    "how are you?", "I'm fine", "not bad", "same here", "me too", "anything else?",
)
"""Greetings, acknowledgements and fillers drawn as training negatives."""

HELD_OUT_PHRASES: tuple[str, ...] = (
    "hiya", "morning!", "yo", "okie", "k", "thx", "ty", "cheers", "neat", "sweet", "yep", "nah",
    "uh huh", "ha", "gtg", "later!", "noted", "understood", "agreed", "totally", "indeed", "oops",
    "hang on", "whatever", "continue", "really?", "huh?", "that's it", "thanks so much!",
    "good night", "how's it going?", "all good", "brb", "got it, cheers",
)
"""Phrases that are never trained on: added to pools to check how a model ranks chit-chat."""


def chitchat_turns(phrases: Sequence[str], speaker: str | None) -> list[str]:
    """``phrases`` rendered as turns of ``speaker`` (:func:`mnemos.rendering.render_turn`; None or blank:
    no speaker prefix), as the index renders a stored turn."""
    return [render_turn(speaker or "", phrase) for phrase in phrases]


def chitchat_negatives(rng: random.Random, speaker: str | None, exclude: Collection[str], k: int) -> list[str]:
    """``k`` distinct :data:`TRAINING_PHRASES` drawn by ``rng``, rendered as ``speaker``'s turns and
    not in ``exclude`` (the query's positives and the negatives already chosen); fewer when too few remain.

    Raises:
        ValueError: if ``k`` is negative.
    """
    if k < 0:
        raise ValueError(f"chit-chat negatives must be >= 0, got {k}")
    candidates = [turn for turn in chitchat_turns(TRAINING_PHRASES, speaker) if turn not in exclude]
    return rng.sample(candidates, min(k, len(candidates)))
