"""Word tokenizer shared by BM25 indexing and querying (the service and the benchmarks alike).

Source: the post-submission tokenizer note of *Clustered Retrieval-Induced Forgetting* (a regex word tokenizer replaced
``str.split``) and the tokenizer sweep in the lethe research journal (no stopword removal and
no stemming were Pareto-best). We widen the ASCII class to Unicode word characters so that
"café" stays one token, and handle the scripts a split on spaces gets wrong (docs/architecture.md
"Retrieval"):

* **Chinese, Japanese, Korean** write no spaces between words (Korean attaches particles to the
  word before them): a run of Han, kana or Hangul becomes its overlapping character bigrams
  ("我的猫叫小花" -> "我的", "的猫", "猫叫", ...; a single character stays a unigram), the rule of
  Lucene's CJK analyzer. A query word inside a sentence then shares its bigrams with it, with no
  dictionary to ship. Letters and digits next to such a run are a token of their own
  ("iphone手机" -> "iphone", "手机").
* **Hebrew and Arabic** may carry vowel points and cantillation (niqqud, harakat): combining marks,
  which ``\\w`` does not match, so "שָׁלוֹם" fell apart into one-letter tokens that matched every
  other pointed text and outranked real matches. These optional marks and the Arabic tatweel
  (a stretching stroke) are removed, so pointed and plain spellings are the same token.
* Other combining marks (Devanagari vowel signs, a Latin letter with a mark NFC cannot compose)
  stay inside their word instead of splitting it.

ASCII text takes the plain ``\\w+`` path; text without CJK and without combining marks gives the
tokens it gave before these rules (a unit test holds the two equal on LoCoMo-style text).
Not handled: Thai, Lao, Khmer and Burmese also write no spaces, and stay one token per run.
"""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"\w+", re.UNICODE)
_PIECE = re.compile(r"(\w+)|(\S)", re.UNICODE)
"""A run of word characters, or one other non-space character (a mark, punctuation, an emoji)."""

_OPTIONAL_MARKS = dict.fromkeys([
    *range(0x0591, 0x05BE), 0x05BF, 0x05C1, 0x05C2, 0x05C4, 0x05C5, 0x05C7,  # Hebrew cantillation and points
    *range(0x0610, 0x061B), *range(0x064B, 0x0660), 0x0670, 0x0640,  # Arabic harakat, superscript alef, tatweel
    *range(0x06D6, 0x06DD), *range(0x06DF, 0x06E5), 0x06E7, 0x06E8, *range(0x06EA, 0x06EE),  # Quranic marks
])
"""Code points deleted before splitting: vowel points and cantillation of Hebrew and Arabic, which
writers add or leave out freely, and the Arabic tatweel."""

_NOT_IN_WORDS = frozenset(range(0xFE00, 0xFE10)) | frozenset(range(0xE0100, 0xE01F0))
"""Variation selectors (emoji presentation): combining marks that never join a word."""

CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x3005, 0x3007),  # 々 〆 〇
    (0x3040, 0x30FF),  # Hiragana, Katakana (with ー)
    (0x3130, 0x318F),  # Hangul Compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana Phonetic Extensions
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7FF),  # Hangul Syllables, Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),  # halfwidth Katakana
    (0xFFA0, 0xFFDC),  # halfwidth Hangul
    (0x20000, 0x3FFFF),  # CJK Unified Ideographs Extensions B and later
)
"""Code points written without spaces between words, tokenized as character bigrams."""

_CJK_RUN = re.compile("([" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES) + "]+)")


def _words(text: str) -> list[str]:
    """Runs of word characters, each with the combining marks that follow its characters (a mark
    directly after a space or a symbol starts nothing and is dropped, as before)."""
    words: list[str] = []
    current: list[str] = []
    end = -1
    for piece in _PIECE.finditer(text):
        word, other = piece.group(1), piece.group(2)
        joined = piece.start() == end and bool(current)
        if word is not None:
            if not joined and current:
                words.append("".join(current))
                current = []
            current.append(word)
        elif joined and ord(other) not in _NOT_IN_WORDS and unicodedata.category(other) in ("Mn", "Mc"):
            current.append(other)
        else:
            if current:
                words.append("".join(current))
            current = []
        end = piece.end()
    if current:
        words.append("".join(current))
    return words


def _split_cjk(word: str) -> list[str]:
    """``word`` with each CJK run replaced by its character bigrams (a one-character run: itself)."""
    tokens: list[str] = []
    for i, part in enumerate(_CJK_RUN.split(word)):
        if not part:
            continue
        if i % 2 == 0 or len(part) == 1:  # between runs (other letters, digits), or a one-character run
            tokens.append(part)
        else:
            tokens.extend(part[j:j + 2] for j in range(len(part) - 1))
    return tokens


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-cased word tokens (module docstring for the scripts without spaces).

    Text is NFC-normalised (so a decomposed "café" matches a composed one) and case-folded (then
    composed again where folding decomposed a letter);
    punctuation and whitespace separate tokens and are dropped. No stopwords are removed and
    nothing is stemmed. ``"MongoDB?"`` gives ``["mongodb"]``; ``"INV-2024-0042"`` gives ``["inv",
    "2024", "0042"]``; ``"我的猫"`` gives ``["我的", "的猫"]``; ``"שָׁלוֹם"`` gives ``["שלום"]``; text
    of only punctuation or emoji gives ``[]``.

    Raises:
        TypeError: if ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects str, got {type(text).__name__}")
    text = unicodedata.normalize("NFC", text).casefold()
    if text.isascii():
        return _WORD.findall(text)
    # case folding may decompose (Greek "ΰ", Turkish "İ" -> "i" + a combining dot): compose again, and
    # read the dotted capital I as i ("İstanbul" = "istanbul")
    text = unicodedata.normalize("NFC", text.replace("i\u0307", "i"))
    if text.isascii():
        return _WORD.findall(text)
    tokens: list[str] = []
    for word in _words(text.translate(_OPTIONAL_MARKS)):
        if _CJK_RUN.search(word):
            tokens.extend(_split_cjk(word))
        else:
            tokens.append(word)
    return tokens
