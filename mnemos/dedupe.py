"""Near-duplicate detection at write time: a turn that repeats one already stored becomes an alias.

Rule (docs/architecture.md, "Dedupe"): within one tenant, a turn is aliased to a canonical entry
only when the cosine of their embeddings (of the rendered texts, :mod:`mnemos.rendering`) is at
least the threshold (0.95) **and** their :class:`Signature` s are equal. The signature is the
speaker, the turn's *distinguishing tokens* (:func:`distinguishing_tokens`: numbers, dates,
names, negation, words with an opposite (:mod:`mnemos.antonyms`), in order of appearance) and
what the bi-encoder did not read of a long turn (:func:`unread_digest`). Sentence embeddings
barely register these tokens: "My new phone number is 0612 345 678." and "... 0699 812 003."
have a cosine of 0.98 with the bundled all-MiniLM-L6-v2, and so do "I am allergic to peanuts." /
"I am not allergic to peanuts.", "Melanie gave Sarah a book." / "Sarah gave Melanie a book." and
"I booked the earlier flight." / "I booked the later flight."; on cosine alone one fact would
swallow the other. And a bi-encoder reads a text only up to its window (256 word pieces for the
bundled model): two long turns that share their first 256 pieces get the same embedding (cosine
1.0) however they end, so a fact said at the end of the second one would be folded into the first
and never shown. The caller passes the part of each rendering the encoder did not read, and the
signature carries a digest of its words: such turns alias only when their unread parts have equal
words too (nothing unread counts as empty). An alias row keeps its own turn and its text stays
searchable through its canonical entry (:meth:`mnemos.tenant_index.TenantIndex.add_aliases`), but
a hit shows the canonical entry's text: the guard decides what a caller gets to read. The guard
can be switched off (``guard=False``) for the benchmark's ablation.

Decision, for each row i of an incoming batch, in order:

1. its best match among the tenant's existing canonical entries with an equal signature, if
   cosine >= threshold;
2. otherwise its best match among the *earlier canonical* rows of the same batch with an equal
   signature, if cosine >= threshold;
3. otherwise row i is itself canonical.

Ties go to the lowest index. Rows that became aliases are never match targets, so alias chains
cannot form: every alias points straight at a canonical.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, TypedDict, Unpack

import numpy as np

from mnemos.antonyms import OPPOSITE_WORDS
from mnemos.errors import DimensionMismatchError, InvalidParameterError
from mnemos.tokenizer import tokenize

DEFAULT_THRESHOLD = 0.95
"""Cosine at or above which two turns of one tenant may be the same memory (docs/architecture.md, "Dedupe")."""


# ---- distinguishing tokens -------------------------------------------------------------------


class TokenKind(StrEnum):
    """What makes a token distinguishing (:func:`distinguishing_tokens`)."""

    NUMBER = "number"
    """A word with a digit (``0612``, ``7``, ``3rd``, ``b12``) or a number word (``two`` -> ``2``)."""
    DATE = "date"
    """A month, weekday, season, relative day or time-unit word (``march``, ``friday``, ``yesterday``)."""
    NAME = "name"
    """A word with an upper-case letter that does not start a sentence (``Lisbon``, ``iPhone``)."""
    NEGATION = "negation"
    """``not`` (also every ``n't`` form and ``cannot``), ``no``, ``never``, ``nothing``, ``without`` ..."""
    OPPOSITE = "opposite"
    """A word with an opposite, or a comparative or superlative of one (``earlier``, ``bigger``,
    ``best``, ``after``, ``more``): :data:`mnemos.antonyms.OPPOSITE_WORDS`."""


class Token(NamedTuple):
    """One distinguishing token: its kind and its normalised value (case-folded)."""

    kind: TokenKind
    value: str


@dataclass(frozen=True)
class Signature:
    """What two turns must share to be aliased: the speaker, the distinguishing tokens in order, and
    the words the bi-encoder did not read.

    Attributes:
        speaker: the role or speaker name, whitespace-collapsed and case-folded (``"caroline"``).
        tokens: :func:`distinguishing_tokens` of the text, then of the image caption.
        unread: :func:`unread_digest` of the part of the rendering past the bi-encoder's window
            (``""`` when the encoder read the whole rendering).
    """

    speaker: str
    tokens: tuple[Token, ...]
    unread: str = ""


_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'"})
_SENTENCE_END = re.compile(r"[!?\u2026\n]")
_NOT_A_SENTENCE_END = frozenset({"mr", "mrs", "ms", "mx", "dr", "prof", "st", "mt", "jr", "sr", "rev", "vs"})
"""Words after which a full stop does not end the sentence (a title before a name); so do single letters."""

_CARDINALS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)
_TENS = {"twenty": "20", "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70",
         "eighty": "80", "ninety": "90"}
_ORDINALS = {"first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th", "sixth": "6th",
             "seventh": "7th", "eighth": "8th", "ninth": "9th", "tenth": "10th", "eleventh": "11th",
             "twelfth": "12th"}
NUMBER_WORDS: dict[str, str] = {
    **{word: str(value) for value, word in enumerate(_CARDINALS)}, **_TENS, **_ORDINALS,
    "dozen": "12", "hundred": "hundred", "thousand": "thousand", "million": "million", "billion": "billion",
    "once": "once", "twice": "twice", "half": "half",
}
"""Number words and the value they stand for, so ``two`` and ``2`` (``third`` and ``3rd``) agree."""

DATE_WORDS: frozenset[str] = frozenset({
    # months (``may`` only capitalised, see _classify) and unambiguous abbreviations
    "january", "february", "march", "april", "june", "july", "august", "september", "october", "november",
    "december", "jan", "feb", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    # weekdays and unambiguous abbreviations ("wed", "sat", "sun" are words)
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "tue", "tues", "thu", "thur",
    "thurs", "fri",
    # relative days and anchors
    "today", "tonight", "tomorrow", "yesterday", "weekend", "weekends", "weekday", "weekdays", "last", "next", "ago",
    # seasons and parts of the day
    "spring", "summer", "autumn", "winter", "morning", "afternoon", "evening", "night", "noon", "midnight",
    # time units
    "hour", "hours", "day", "days", "week", "weeks", "fortnight", "month", "months", "year", "years", "decade",
    "decades",
})
"""Date words, case-insensitive. ``may`` counts only capitalised (the month, not the verb)."""

_NOT_FORMS = (
    "not", "cannot", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "cant", "couldnt", "wouldnt",
    "shouldnt", "havent", "hasnt", "hadnt", "wont", "aint", "mustnt", "neednt", "shant", "mightnt",
)
_NEGATION_WORDS = ("no", "never", "none", "nothing", "nobody", "noone", "nowhere", "neither", "nor", "without")
NEGATIONS: dict[str, str] = {
    **dict.fromkeys(_NOT_FORMS, "not"), **{word: word for word in _NEGATION_WORDS}, "nope": "no", "nah": "no",
}
"""Negation words and their value; every ``n't`` form is ``not`` too (``don't`` = ``do not``)."""


def _is_pronoun_i(word: str) -> bool:
    return word == "i" or word.startswith("i'")


def _classify(word: str, sentence_start: bool) -> Token | None:
    low = word.translate(_APOSTROPHES).casefold()
    if any(ch.isdigit() for ch in low):
        return Token(TokenKind.NUMBER, low)
    if low in NUMBER_WORDS:
        return Token(TokenKind.NUMBER, NUMBER_WORDS[low])
    if low in NEGATIONS:
        return Token(TokenKind.NEGATION, NEGATIONS[low])
    if low.endswith("n't"):
        return Token(TokenKind.NEGATION, "not")
    if low in DATE_WORDS or (low == "may" and word[0].isupper()):
        return Token(TokenKind.DATE, low)
    if low in OPPOSITE_WORDS:
        return Token(TokenKind.OPPOSITE, low)
    if not sentence_start and not _is_pronoun_i(low) and any(ch.isupper() for ch in word):
        return Token(TokenKind.NAME, low.removesuffix("'s"))
    return None


def distinguishing_tokens(text: str) -> tuple[Token, ...]:
    """The tokens of ``text`` that a sentence embedding may not register, in order of appearance.

    Words are runs of letters and digits, with inner apostrophes (``don't``, ``Caroline's``); text
    is NFC-normalised and curly apostrophes are straight. A word is, in this order of precedence:

    * ``NUMBER`` when it has a digit (kept case-folded: ``0612``, ``7``, ``3rd``, ``5pm``), or is a
      number word (:data:`NUMBER_WORDS`, mapped to its value: ``two`` -> ``2``, ``third`` -> ``3rd``).
      Punctuation splits numbers: ``0612-345-678``, ``0612 345 678`` both give three tokens.
    * ``NEGATION`` when it is in :data:`NEGATIONS` or ends in ``n't`` (``don't``, ``can't``,
      ``cannot``, ``not`` all give ``not``; ``never``, ``no``, ``nothing`` ... keep their word).
    * ``DATE`` when it is in :data:`DATE_WORDS` (any case), or is ``May`` capitalised.
      Date-like tokens (``2024-05-01``, ``5/3``, ``1990s``) are ``NUMBER`` tokens.
    * ``OPPOSITE`` when it is in :data:`mnemos.antonyms.OPPOSITE_WORDS` (any case): a word with an
      opposite, or a degree of one; the value is the word, so ``earlier`` / ``later``, ``bigger`` /
      ``smaller`` and ``big`` / ``bigger`` all differ.
    * ``NAME`` when it has an upper-case letter and does not start a sentence, and is not the
      pronoun ``I`` (``I'm``, ``I've`` ...); the value is case-folded without a trailing ``'s``.
      A sentence starts at the beginning of ``text`` and after ``!``, ``?``, ``…``, a line break,
      or a ``.`` that does not follow a single letter or a title (``Dr. Smith``: ``smith`` is a name).

    Everything else is dropped. Order and repetition are kept, so "Melanie gave Sarah a book" and
    "Sarah gave Melanie a book" differ.

    Known limits (each errs towards *not* merging, except the first): a name that starts a
    sentence is not seen ("Paris is lovely." / "Rome is lovely."; such pairs score far below 0.95
    with the bundled encoder); a name written in lower case is not a name ("lisbon" and "Lisbon"
    differ); a reordered paraphrase ("On Monday I saw Sarah." / "I saw Sarah on Monday.") differs.

    Raises:
        TypeError: if ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"distinguishing_tokens expects str, got {type(text).__name__}")
    text = unicodedata.normalize("NFC", text)
    tokens: list[Token] = []
    previous_end = 0
    previous_word = ""
    for match in _WORD.finditer(text):
        gap = text[previous_end:match.start()]
        sentence_start = previous_end == 0 or bool(_SENTENCE_END.search(gap)) or (
            "." in gap and len(previous_word) > 1 and previous_word.casefold() not in _NOT_A_SENTENCE_END)
        word = match.group()
        token = _classify(word, sentence_start)
        if token is not None:
            tokens.append(token)
        previous_end, previous_word = match.end(), word
    return tuple(tokens)


def unread_digest(unread: str) -> str:
    """A digest of the words of ``unread``, the part of a rendering the bi-encoder did not read.

    ``""`` when it has no word (:func:`mnemos.tokenizer.tokenize`: nothing was cut, or only
    punctuation and spaces were), else 32 hex digits of a BLAKE2b over its word tokens: equal
    exactly when the words, case-folded and in order, are equal (up to a 128-bit collision).
    A digest rather than the words keeps a long turn's signature small in the ingest worker's cache.

    Raises:
        TypeError: if ``unread`` is not a ``str``.
    """
    words = tokenize(unread)
    if not words:
        return ""
    return hashlib.blake2b("\x1f".join(words).encode("utf-8"), digest_size=16).hexdigest()


def turn_signature(role: str, text: str, image_caption: str | None = None, *, unread: str = "") -> Signature:
    """The :class:`Signature` of one turn: the fields :func:`mnemos.rendering.render_turn` renders.

    The speaker is part of it under every rendering version: turns of different speakers are
    different memories even when their texts are equal. The caption is read as its own text (its
    first word starts a sentence). ``unread`` is the end of the turn's rendering that the
    bi-encoder cut off (``workers.runtime.models.TruncationCounter.unread``; ``""`` when it read it all):
    a turn whose embedding did not see its end aliases only a turn with the same unread words.

    Raises:
        TypeError: if ``text``, ``unread`` or a non-None ``image_caption`` is not a ``str``.
    """
    tokens = distinguishing_tokens(text)
    if image_caption:
        tokens += distinguishing_tokens(image_caption)
    return Signature(" ".join((role or "").split()).casefold(), tokens, unread_digest(unread))


# ---- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DedupeDecision:
    """What to do with one incoming row.

    Exactly one of ``existing`` / ``batch`` is set for a duplicate, neither for a canonical row.

    Attributes:
        row: index of the row in the incoming batch.
        existing: index into the ``existing`` matrix of the canonical it aliases, or None.
        batch: index of the earlier canonical row of the same batch it aliases, or None.
        similarity: cosine to that canonical (NaN for a canonical row).
    """

    row: int
    existing: int | None
    batch: int | None
    similarity: float

    @property
    def is_duplicate(self) -> bool:
        """True when the row becomes an alias of an existing entry or of an earlier batch row."""
        return self.existing is not None or self.batch is not None


def _check(new: np.ndarray, existing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    new = np.asarray(new, dtype=np.float32)
    if new.ndim != 2:
        raise DimensionMismatchError("new embeddings", "(n, dim)", tuple(new.shape))
    dim = new.shape[1]
    existing = np.asarray(existing, dtype=np.float32)
    if existing.size == 0:
        existing = existing.reshape(0, dim)
    if existing.ndim != 2 or existing.shape[1] != dim:
        raise DimensionMismatchError("existing embeddings", f"(m, {dim})", tuple(existing.shape))
    return new, existing


def _signature_codes(
    new_signatures: Sequence[Hashable] | None, existing_signatures: Sequence[Hashable] | None, n: int, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Equal signatures get equal integer codes: ``(n,)`` and ``(m,)`` int64."""
    if new_signatures is None or existing_signatures is None:
        raise InvalidParameterError(
            "the dedupe guard needs new_signatures and existing_signatures (or guard=False)")
    if len(new_signatures) != n or len(existing_signatures) != m:
        raise InvalidParameterError(
            f"{n} new and {m} existing embeddings but {len(new_signatures)} new and "
            f"{len(existing_signatures)} existing signatures")
    codes: dict[Hashable, int] = {}
    new_codes = np.fromiter((codes.setdefault(s, len(codes)) for s in new_signatures), np.int64, n)
    existing_codes = np.fromiter((codes.setdefault(s, len(codes)) for s in existing_signatures), np.int64, m)
    return new_codes, existing_codes


def dedupe_batch(
    new: np.ndarray,
    existing: np.ndarray,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    new_signatures: Sequence[Signature] | None = None,
    existing_signatures: Sequence[Signature] | None = None,
    guard: bool = True,
) -> list[DedupeDecision]:
    """Decide, for each row of ``new``, whether it is canonical or an alias (module docstring).

    Args:
        new: ``(n, dim)`` float32 unit embeddings of the incoming turns, in arrival order.
        existing: ``(m, dim)`` float32 unit embeddings of the tenant's canonical entries (m may be 0).
        threshold: cosine at or above which a row may be a duplicate.
        new_signatures: ``n`` :func:`turn_signature` s of the incoming turns (row order).
        existing_signatures: ``m`` signatures of the canonical entries (row order).
        guard: when True (the default), a row may only alias a canonical with an equal signature;
            when False, cosine alone decides and the signatures are not read (the ablation).

    Returns:
        ``n`` decisions, in row order.

    Raises:
        DimensionMismatchError: if the matrices are not 2-D with the same number of columns.
        InvalidParameterError: if ``guard`` is on and a signature list is missing or its length
            differs from its matrix's rows.
    """
    new, existing = _check(new, existing)
    if not guard:
        return decide(new, existing, threshold)
    new_codes, existing_codes = _signature_codes(new_signatures, existing_signatures, new.shape[0], existing.shape[0])
    return decide(new, existing, threshold, new_codes, existing_codes)


def _best_existing(
    new: np.ndarray, existing: np.ndarray, threshold: float, new_codes: np.ndarray | None,
    existing_codes: np.ndarray | None,
) -> list[tuple[int, float] | None]:
    """Per row of ``new``, ``(j, cosine)`` of its best existing match under the rule, or None.

    The best match with an equal code is the row's overall best when their codes agree (ties go
    to the lowest index either way); only a row whose overall best reaches ``threshold`` with
    another code (the guard refuses it) is scanned again, for the best equal-code column at or
    above ``threshold``. So the cost is the ``(n, m)`` product and its row maxima, plus ``O(m)``
    per refused row: no ``(n, m)`` mask, no pass over the existing signatures.
    """
    n, m = new.shape[0], existing.shape[0]
    if m == 0:
        return [None] * n
    sims = new @ existing.T
    best = sims.argmax(axis=1)
    best_sims = sims[np.arange(n), best]
    out: list[tuple[int, float] | None] = []
    for i in range(n):
        j, sim = int(best[i]), float(best_sims[i])
        if not sim >= threshold:
            out.append(None)
        elif new_codes is None or existing_codes is None or existing_codes[j] == new_codes[i]:
            out.append((j, sim))
        else:
            above = np.flatnonzero(sims[i] >= threshold)  # ascending, so argmax keeps the lowest index
            above = above[existing_codes[above] == new_codes[i]]
            k = int(above[int(np.argmax(sims[i, above]))]) if above.size else -1
            out.append((k, float(sims[i, k])) if k >= 0 else None)
    return out


def decide(
    new: np.ndarray,
    existing: np.ndarray,
    threshold: float = DEFAULT_THRESHOLD,
    new_codes: np.ndarray | None = None,
    existing_codes: np.ndarray | None = None,
) -> list[DedupeDecision]:
    """The decision of the module docstring on checked matrices, signatures given as codes.

    :func:`dedupe_batch` and :meth:`mnemos.canonical_set.CanonicalSet.dedupe` both decide here.

    Args:
        new: ``(n, dim)`` float32 unit embeddings of the incoming turns, in arrival order.
        existing: ``(m, dim)`` float32 unit embeddings of the canonical entries (m may be 0).
        threshold: cosine at or above which a row may be a duplicate.
        new_codes: ``(n,)`` int64, equal exactly where the incoming rows' signatures are equal.
        existing_codes: ``(m,)`` int64 in the same code space. Both None: the guard is off.

    Returns:
        ``n`` decisions, in row order. Cost: one ``(n, m)`` and one ``(n, n)`` product, their
        row maxima, and ``O(m)`` more per row the guard refuses its best match (docs/scaling.md,
        "Ingest of a large tenant").
    """
    n = new.shape[0]
    matches = _best_existing(new, existing, threshold, new_codes, existing_codes)
    sims_batch = new @ new.T
    if new_codes is not None:
        sims_batch = np.where(new_codes[:, None] == new_codes[None, :], sims_batch, -np.inf)
    canonical_rows: list[int] = []
    decisions: list[DedupeDecision] = []
    for i in range(n):
        match = matches[i]
        if match is not None:
            decisions.append(DedupeDecision(i, existing=match[0], batch=None, similarity=match[1]))
            continue
        if canonical_rows:
            candidates = sims_batch[i, canonical_rows]
            best = int(np.argmax(candidates))
            sim = float(candidates[best])
            if sim >= threshold:
                decisions.append(DedupeDecision(i, existing=None, batch=canonical_rows[best], similarity=sim))
                continue
        canonical_rows.append(i)
        decisions.append(DedupeDecision(i, existing=None, batch=None, similarity=float("nan")))
    return decisions


class GuardOptions(TypedDict, total=False):
    """:func:`dedupe_batch`'s keyword arguments, as :func:`find_duplicates` passes them on."""

    new_signatures: Sequence[Signature] | None
    existing_signatures: Sequence[Signature] | None
    guard: bool


def find_duplicates(
    new: np.ndarray, existing: np.ndarray, threshold: float = DEFAULT_THRESHOLD, **options: Unpack[GuardOptions]
) -> list[int | None]:
    """Compact form of :func:`dedupe_batch` (same arguments): one int or None per row of ``new``.

    ``j >= 0`` means "alias of ``existing[j]``"; ``-(j + 1)`` means "alias of the earlier
    canonical row ``j`` of ``new``"; ``None`` means "canonical". Prefer :func:`dedupe_batch`
    in new code; this encoding exists because the shared spec names it.

    Raises:
        DimensionMismatchError, InvalidParameterError: as :func:`dedupe_batch`.
    """
    out: list[int | None] = []
    decisions = dedupe_batch(new, existing, threshold, **options)
    for decision in decisions:
        if decision.existing is not None:
            out.append(decision.existing)
        elif decision.batch is not None:
            out.append(-(decision.batch + 1))
        else:
            out.append(None)
    return out
