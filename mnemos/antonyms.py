"""Words with an opposite: the dedupe guard's list (docs/architecture.md "Dedupe").

A sentence embedding places "I booked the earlier flight." and "I booked the later flight." at
cosine 0.99, and "The new apartment is bigger than the old one." against "... smaller ..." at
0.98 (bundled all-MiniLM-L6-v2): on cosine alone one fact would become an alias of its opposite.
Every word listed here, and every comparative and superlative of a gradable one, is a
distinguishing token of :func:`mnemos.dedupe.distinguishing_tokens` (kind ``opposite``, the word
itself as value), so two turns alias only when they use the same such words in the same order.

This module is the one place the list lives. :data:`GRADABLE_PAIRS` are adjectives (and adverbs)
that take comparatives and superlatives, spelled out by :func:`degrees` (``big`` -> ``bigger``,
``biggest``; ``early`` -> ``earlier``, ``earliest``; ``late`` -> ``later``, ``latest``;
:data:`IRREGULAR` for ``good``, ``bad``, ``far``, ``many``); :data:`PLAIN_PAIRS` are words whose
opposite flips a fact without degrees (``before``/``after``, ``more``/``less``, ``won``/``lost``).
A pair documents why a word is here; the guard itself only asks whether a word is in
:data:`OPPOSITE_WORDS`, so ``bigger`` / ``larger`` (not opposites) block a merge too: the guard
errs towards keeping two memories. Very common words whose opposite is rarely the point (``much``,
``little``, ``in``/``out``, ``up``/``down``, ``on``/``off``) are left out, so small talk that
repeats itself still dedupes. Words already distinguishing as dates or numbers (``first``,
``last``, ``morning``/``evening``) are not repeated here.
"""

from __future__ import annotations

import re

GRADABLE_PAIRS: tuple[tuple[str, str], ...] = (
    ("early", "late"), ("big", "small"), ("large", "small"), ("long", "short"), ("tall", "short"),
    ("high", "low"), ("hot", "cold"), ("warm", "cool"), ("old", "new"), ("old", "young"), ("fast", "slow"),
    ("quick", "slow"), ("cheap", "expensive"), ("good", "bad"), ("easy", "hard"), ("easy", "difficult"),
    ("heavy", "light"), ("light", "dark"), ("strong", "weak"), ("rich", "poor"), ("happy", "sad"),
    ("near", "far"), ("close", "far"), ("wide", "narrow"), ("thick", "thin"), ("loud", "quiet"),
    ("wet", "dry"), ("clean", "dirty"), ("full", "empty"), ("safe", "dangerous"), ("deep", "shallow"),
    ("soft", "hard"), ("sweet", "sour"), ("bright", "dim"), ("tight", "loose"), ("healthy", "sick"),
    ("busy", "free"), ("rare", "common"), ("simple", "complex"), ("calm", "nervous"), ("fat", "thin"),
    ("many", "few"),
)
"""Adjectives and adverbs with an opposite, taken with their comparatives and superlatives."""

PLAIN_PAIRS: tuple[tuple[str, str], ...] = (
    ("before", "after"), ("above", "below"), ("over", "under"), ("inside", "outside"), ("more", "less"),
    ("most", "least"), ("always", "rarely"), ("often", "rarely"), ("open", "closed"), ("true", "false"),
    ("right", "wrong"), ("correct", "incorrect"), ("possible", "impossible"), ("likely", "unlikely"),
    ("same", "different"), ("win", "lose"), ("won", "lost"), ("wins", "loses"), ("pass", "fail"),
    ("passed", "failed"), ("accept", "reject"), ("accepted", "rejected"), ("like", "dislike"),
    ("liked", "disliked"), ("love", "hate"), ("loved", "hated"), ("increase", "decrease"),
    ("increased", "decreased"), ("buy", "sell"), ("bought", "sold"), ("remember", "forget"),
    ("remembered", "forgot"), ("agree", "disagree"), ("agreed", "disagreed"), ("arrive", "leave"),
    ("arrived", "left"), ("start", "stop"), ("started", "stopped"), ("include", "exclude"),
    ("included", "excluded"),
)
"""Words whose opposite flips a fact, taken as written (no degrees)."""

IRREGULAR: dict[str, tuple[str, ...]] = {
    "good": ("better", "best"), "bad": ("worse", "worst"), "far": ("farther", "farthest", "further", "furthest"),
    "many": ("more", "most"), "few": ("fewer", "fewest"),
}
"""Comparatives and superlatives that the spelling rules of :func:`degrees` do not produce."""

_DOUBLES = re.compile(r"^[^aeiou]*[aeiou][^aeiouwxy]$")
"""One vowel then one final consonant (not w, x, y): the consonant doubles (big -> bigger)."""


def degrees(adjective: str) -> tuple[str, ...]:
    """``adjective`` with its comparative and superlative, by English spelling rules.

    Irregular forms come from :data:`IRREGULAR`; a final ``e`` takes ``r``/``st`` (late -> later,
    latest); consonant plus ``y`` becomes ``ier``/``iest`` (early -> earlier, earliest); one vowel
    before one final consonant doubles it (big -> bigger, biggest); anything else takes ``er``/``est``.
    Long adjectives get forms nobody writes (``expensiver``), which never match and cost nothing:
    their degrees are ``more``/``most`` and ``less``/``least``, listed in :data:`PLAIN_PAIRS`.
    """
    if adjective in IRREGULAR:
        return (adjective, *IRREGULAR[adjective])
    if adjective.endswith("e"):
        stem, er, est = adjective, "r", "st"
    elif len(adjective) > 2 and adjective.endswith("y") and adjective[-2] not in "aeiou":
        stem, er, est = adjective[:-1], "ier", "iest"
    elif _DOUBLES.match(adjective):
        stem, er, est = adjective + adjective[-1], "er", "est"
    else:
        stem, er, est = adjective, "er", "est"
    return adjective, stem + er, stem + est


OPPOSITE_WORDS: frozenset[str] = frozenset(
    {form for pair in GRADABLE_PAIRS for word in pair for form in degrees(word)}
    | {word for pair in PLAIN_PAIRS for word in pair}
)
"""Every lower-case word of :data:`GRADABLE_PAIRS` (with its degrees) and :data:`PLAIN_PAIRS`."""
