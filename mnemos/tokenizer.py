"""Word tokenizer shared by BM25 indexing and querying.

Source: the post-submission tokenizer note of *Clustered Retrieval-Induced Forgetting* (a regex word tokenizer replaced
``str.split``) and the tokenizer sweep in the lethe research journal (no stopword removal and
no stemming were Pareto-best). We
widen the ASCII class to Unicode word characters so that "café" stays one token.
"""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-cased Unicode word tokens.

    Text is NFC-normalised (so a decomposed "café" matches a composed one) and case-folded;
    punctuation and whitespace separate tokens and are dropped. No stopwords are removed and
    nothing is stemmed. ``"MongoDB?"`` gives ``["mongodb"]``; text of only punctuation or emoji
    gives ``[]``.

    Raises:
        TypeError: if ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects str, got {type(text).__name__}")
    return _WORD.findall(unicodedata.normalize("NFC", text).casefold())
