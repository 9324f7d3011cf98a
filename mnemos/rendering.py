"""Rendering of a memory: the one text that every model and index sees for a stored turn.

A turn is stored with its raw fields (speaker/role, text, an optional image caption). What BM25
indexes, what the bi-encoder embeds (and dedupe compares), what the cross-encoder reranks and
what reranker training reads is the *rendering* of those fields, made here and nowhere else, so
the benchmark, the training data and the service measure the same product.

Versions (stored per tenant by the service, so embeddings made under one version are never mixed
with another's; ``mnemos reindex`` re-embeds a tenant):

* ``TEXT`` (0): the text alone, with `` [image: <caption>]`` appended when the turn carries an
  image caption. What Mnemos indexed before speakers were rendered.
* ``SPEAKER`` (1, the default): ``"<speaker>: <text>"`` plus the caption as above. Most questions
  about a conversation name a person ("What did Melanie paint?"); on LoCoMo this lifted the fused
  first stage (hybrid RRF, per tenant) from 0.299 to 0.401 NDCG@10 (docs/architecture.md,
  "Rendering").
"""

from __future__ import annotations

from enum import IntEnum

from mnemos.errors import InvalidParameterError

__all__ = ["RENDERING_VERSION", "Rendering", "render_turn", "rendered_speaker"]


class Rendering(IntEnum):
    """Rendering versions (module docstring); the integer is what the service stores."""

    TEXT = 0
    SPEAKER = 1


RENDERING_VERSION = Rendering.SPEAKER
"""The rendering the product uses by default (indexes, embeddings, reranker, training)."""


def render_turn(
    role: str, text: str, image_caption: str | None = None, *, version: Rendering | int = RENDERING_VERSION
) -> str:
    """The text models see for one turn.

    Args:
        role: the speaker's name or role (``"Caroline"``, ``"user"``); blank means no speaker prefix.
        text: the turn's own text, unchanged.
        image_caption: a caption of an image shared with the turn (LoCoMo's ``blip_caption``, or
            ``metadata.image_caption`` of a published turn); blank or None adds nothing.
        version: a :class:`Rendering` (or its integer).

    Returns:
        ``"<role>: <text> [image: <caption>]"`` for ``SPEAKER``; without the ``"<role>: "`` prefix
        for ``TEXT``. Surrounding whitespace of the caption and role is stripped.

    Raises:
        InvalidParameterError: if ``version`` is not a known rendering.
    """
    try:
        version = Rendering(version)
    except ValueError:
        raise InvalidParameterError(
            f"unknown rendering version {version!r}; known: {[int(v) for v in Rendering]}") from None
    body = text
    caption = (image_caption or "").strip()
    if caption:
        body = f"{body} [image: {caption}]"
    speaker = (role or "").strip()
    if version is Rendering.SPEAKER and speaker:
        return f"{speaker}: {body}"
    return body


def rendered_speaker(rendered: str) -> str | None:
    """The speaker of a ``SPEAKER`` rendering: ``"user"`` for ``"user: I moved to Oslo"``.

    The inverse of :func:`render_turn`'s prefix, for code that holds only rendered texts (reranker
    training matches a positive's hard negatives to its speaker, docs/reranker.md "Why the first
    LongMemEval model was weak"). Returns None when the text has no ``"<speaker>: "`` prefix (a ``TEXT``
    rendering, or a turn stored without a speaker). A ``TEXT`` rendering whose own text starts
    with ``"word: "`` reads as that speaker: call this on ``SPEAKER`` renderings only.
    """
    speaker, sep, _ = rendered.partition(": ")
    if not sep or not speaker.strip() or "\n" in speaker:
        return None
    return speaker
