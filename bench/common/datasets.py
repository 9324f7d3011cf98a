"""Benchmark datasets as typed records: LoCoMo and LongMemEval.

Both loaders turn a JSON file into :class:`Conversation` records whose turns carry stable ids
(the ids a retrieval run returns) and whose questions name the turn ids that hold their
evidence. Nothing here ranks or scores; ``bench.quality.run`` and ``bench.training.pairs`` consume it.

Sources:
- LoCoMo: Maharana et al., ACL 2024 (arXiv:2402.17753), ``data/locomo10.json``; schema, counts and
  the evidence repair follow the dataset's own README ("JSON structure", "Evidence quality").
  CC BY-NC 4.0: never commit the data itself.
- LongMemEval: Wu et al., 2024 (arXiv:2410.10813); one item = one question with its own
  haystack of sessions, answer turns flagged ``has_answer``.
"""

from __future__ import annotations

import gzip
import json
import logging
import lzma
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "ABSTENTION_SUFFIX",
    "LOCOMO_CATEGORIES",
    "LONGMEMEVAL_CATEGORIES",
    "Conversation",
    "DatasetError",
    "DatasetFormatError",
    "Question",
    "Turn",
    "load_locomo",
    "load_longmemeval",
    "longmemeval_category",
    "parse_locomo_datetime",
    "parse_longmemeval_datetime",
    "repair_dia_ids",
]

logger = logging.getLogger(__name__)


class DatasetError(Exception):
    """Base class of every error raised while loading a benchmark dataset."""


class DatasetFormatError(DatasetError, ValueError):
    """Raised when a dataset file is not valid JSON or does not follow the expected schema.

    ``path`` is the file, ``where`` points inside it (for example ``"conv-26.qa[3].evidence"``).
    """

    def __init__(self, path: str | Path, where: str, problem: str) -> None:
        self.path = Path(path)
        self.where = where
        self.problem = problem
        super().__init__(f"{self.path}: {where}: {problem}")


@dataclass(frozen=True)
class Turn:
    """One utterance with its raw fields. ``occurred_at`` is tz-aware UTC (LoCoMo: the start time
    of its session); ``image_caption`` is LoCoMo's ``blip_caption`` of a shared image, or None.
    What models see is :func:`mnemos.rendering.render_turn` of role, text and caption."""

    turn_id: str
    session_id: str
    role: str
    text: str
    occurred_at: datetime
    image_caption: str | None = None


LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
"""LoCoMo's integer question categories."""

LONGMEMEVAL_CATEGORIES = {
    1: "single-session-user", 2: "single-session-assistant", 3: "single-session-preference",
    4: "multi-session", 5: "abstention", 6: "temporal-reasoning", 7: "knowledge-update",
}
"""Integer codes the benchmark gives LongMemEval's question types. Code 5 is, as LoCoMo's
adversarial category, the questions whose answer is not in memory (LongMemEval's ``_abs`` ids,
whatever their type): the reports keep category 5 out of the headline (:mod:`bench.quality.report`)."""

ABSTENTION_SUFFIX = "_abs"
"""LongMemEval marks an abstention question by this ending of its ``question_id``."""


def longmemeval_category(question_id: str, question_type: str | None) -> int | None:
    """The :data:`LONGMEMEVAL_CATEGORIES` code of a question: 5 for an abstention id, else its
    type's code (None for a type not in the table)."""
    if question_id.endswith(ABSTENTION_SUFFIX):
        return 5
    codes = {name: code for code, name in LONGMEMEVAL_CATEGORIES.items()}
    return codes.get(question_type) if question_type is not None else None


@dataclass(frozen=True)
class Question:
    """One evaluation question; ``relevant_turn_ids`` may be empty (nothing valid to retrieve).

    ``category`` is the dataset's integer code, named by ``category_name``: LoCoMo's own
    (:data:`LOCOMO_CATEGORIES`) or the benchmark's for LongMemEval's types
    (:data:`LONGMEMEVAL_CATEGORIES`); ``question_type`` is LongMemEval's label (e.g.
    ``"temporal-reasoning"``).
    """

    question_id: str
    conversation_id: str
    text: str
    relevant_turn_ids: frozenset[str]
    category: int | None
    question_date: datetime | None
    question_type: str | None = None
    category_name: str | None = None


@dataclass(frozen=True)
class Conversation:
    """All turns of one memory owner plus the questions asked about them.

    ``observations`` holds LoCoMo's generated ``(fact, turn_id)`` pairs, one pair per valid turn
    id, for training only: never feed them to an evaluated index. ``shared_turn_ids`` says that a
    turn id names the same turn in every conversation of the dataset (LongMemEval: haystack session
    id and position, sessions repeating across questions), so a pooled corpus holds each once
    (:func:`bench.common.corpora.build_tenants`); LoCoMo's ``D1:3`` is another turn in each conversation.
    """

    conversation_id: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    observations: tuple[tuple[str, str], ...] = ()
    shared_turn_ids: bool = False


# --------------------------------------------------------------------------------------------
# shared helpers

def _read_json(path: str | Path) -> Any:
    """The JSON document in ``path``; ``.xz`` and ``.gz`` files are decompressed first (LongMemEval
    is distributed as ``.json.xz``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
        if path.suffix == ".xz":
            data = lzma.decompress(data)
        elif path.suffix == ".gz":
            data = gzip.decompress(data)
        raw = data.decode("utf-8")
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as exc:
        raise DatasetFormatError(path, "file", f"not a valid {path.suffix} archive ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(path, "file", f"not UTF-8 text ({exc.reason})") from exc
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(path, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from exc


def _require(obj: Any, key: str, kind: type | tuple[type, ...], path: Path, where: str) -> Any:
    if not isinstance(obj, Mapping):
        raise DatasetFormatError(path, where, f"expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise DatasetFormatError(path, where, f"missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _as_tuple(kind):
        names = "/".join(k.__name__ for k in _as_tuple(kind))
        raise DatasetFormatError(path, f"{where}.{key}", f"expected {names}, got {type(value).__name__}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


# --------------------------------------------------------------------------------------------
# LoCoMo

_LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"
_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_ID_SEPARATORS = re.compile(r"[;,\s]+")


def parse_locomo_datetime(value: str) -> datetime:
    """Parse a LoCoMo session stamp such as ``"1:56 pm on 8 May, 2023"`` as UTC.

    Raises:
        ValueError: if ``value`` does not have that shape.
    """
    return datetime.strptime(value.strip(), _LOCOMO_DATE_FORMAT).replace(tzinfo=UTC)


def repair_dia_ids(raw: str | Sequence[str], valid: Iterable[str] | None = None) -> tuple[str, ...]:
    """Normalise LoCoMo dialogue-id references, as the data README's "Evidence quality" describes.

    Each string is split on ``;``, ``,`` and whitespace (``"D8:6; D9:17"`` gives two ids); each
    piece must look like ``D<session>:<turn>``, with an optional stray colon after the ``D`` and
    leading zeros dropped (``"D:11:26"`` -> ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``). Pieces of any
    other shape (``"D"``) are dropped, and so are ids not in ``valid`` when it is given (turns that
    do not exist). Order is kept; duplicates are removed. Commas appear only in observation ids.
    """
    pieces = [raw] if isinstance(raw, str) else list(raw)
    allowed = None if valid is None else set(valid)
    out: list[str] = []
    for piece in pieces:
        if not isinstance(piece, str):
            continue
        for token in _ID_SEPARATORS.split(piece.strip()):
            match = _DIA_ID.fullmatch(token)
            if match is None:
                if token:
                    logger.debug("dropping malformed dialogue id %r", token)
                continue
            turn_id = f"D{int(match.group(1))}:{int(match.group(2))}"
            if allowed is not None and turn_id not in allowed:
                logger.debug("dropping dialogue id %r: no such turn", turn_id)
                continue
            if turn_id not in out:
                out.append(turn_id)
    return tuple(out)


def _session_numbers(conversation: Mapping[str, Any]) -> list[int]:
    numbers = []
    for key, value in conversation.items():
        match = _SESSION_KEY.fullmatch(key)
        if match and isinstance(value, list):
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def _locomo_turns(conv_id: str, conversation: Mapping[str, Any], path: Path) -> list[Turn]:
    turns: list[Turn] = []
    seen: set[str] = set()
    for n in _session_numbers(conversation):
        # session_<N>_date_time keys without a session_<N> list (conv-26 has 16) are never read.
        where = f"{conv_id}.conversation.session_{n}"
        stamp = _require(conversation, f"session_{n}_date_time", str, path, f"{conv_id}.conversation")
        try:
            occurred_at = parse_locomo_datetime(stamp)
        except ValueError as exc:
            raise DatasetFormatError(path, f"{where}_date_time", f"unparseable date {stamp!r}") from exc
        for i, raw in enumerate(conversation[f"session_{n}"]):
            at = f"{where}[{i}]"
            turn_id = _require(raw, "dia_id", str, path, at)
            if turn_id in seen:
                raise DatasetFormatError(path, at, f"duplicate dia_id {turn_id!r}")
            seen.add(turn_id)
            text = _require(raw, "text", str, path, at)
            caption = raw.get("blip_caption")
            turns.append(
                Turn(
                    turn_id=turn_id,
                    session_id=f"S{n}",
                    role=_require(raw, "speaker", str, path, at),
                    text=text,
                    occurred_at=occurred_at,
                    image_caption=caption.strip() if isinstance(caption, str) and caption.strip() else None,
                )
            )
    return turns


def _locomo_questions(conv_id: str, sample: Mapping[str, Any], valid: set[str], path: Path) -> list[Question]:
    questions = []
    for i, raw in enumerate(_require(sample, "qa", list, path, conv_id)):
        at = f"{conv_id}.qa[{i}]"
        evidence = _require(raw, "evidence", list, path, at)
        category = raw.get("category")
        if category is not None and (not isinstance(category, int) or isinstance(category, bool)):
            raise DatasetFormatError(path, f"{at}.category", f"expected int, got {type(category).__name__}")
        questions.append(
            Question(
                question_id=f"{conv_id}:{i}",
                conversation_id=conv_id,
                text=_require(raw, "question", str, path, at),
                relevant_turn_ids=frozenset(repair_dia_ids(evidence, valid)),
                category=category,
                category_name=LOCOMO_CATEGORIES.get(category) if category is not None else None,
                question_date=None,
            )
        )
    return questions


def _locomo_observations(conv_id: str, sample: Mapping[str, Any], valid: set[str]) -> list[tuple[str, str]]:
    observations = sample.get("observation")
    if not isinstance(observations, Mapping):
        return []
    pairs: list[tuple[str, str]] = []
    for per_session in observations.values():
        if not isinstance(per_session, Mapping):
            continue
        for facts in per_session.values():
            for item in facts if isinstance(facts, list) else ():
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    logger.debug("%s: skipping malformed observation %r", conv_id, item)
                    continue
                fact, ids = item
                pairs.extend((fact, turn_id) for turn_id in repair_dia_ids(ids, valid))
    return pairs


def load_locomo(path: str | Path) -> list[Conversation]:
    """Load LoCoMo's ``locomo10.json`` into conversations, in file order.

    Turn ids are the ``dia_id`` strings (``"D1:3"``), session ids ``"S<N>"``, roles the speaker
    names; a turn's ``occurred_at`` is its session's ``session_<N>_date_time`` read as UTC, and
    an image caption (``blip_caption``) is kept in ``image_caption`` (the rendering appends it). Question ids are
    ``"<sample_id>:<index in qa>"``; their evidence goes through :func:`repair_dia_ids` against
    the conversation's turn ids. On the published file this gives 10 conversations, 5,882 turns
    and 1,986 questions, 1,982 of them with at least one evidence turn.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        DatasetFormatError: if the file is not JSON, or a required key is missing or mistyped.
    """
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, list):
        raise DatasetFormatError(path, "top level", f"expected a list of conversations, got {type(data).__name__}")
    conversations = []
    seen: set[str] = set()
    for i, sample in enumerate(data):
        conv_id = _require(sample, "sample_id", str, path, f"[{i}]")
        if conv_id in seen:
            raise DatasetFormatError(path, f"[{i}]", f"duplicate sample_id {conv_id!r}")
        seen.add(conv_id)
        turns = _locomo_turns(conv_id, _require(sample, "conversation", dict, path, conv_id), path)
        valid = {t.turn_id for t in turns}
        conversations.append(
            Conversation(
                conversation_id=conv_id,
                turns=tuple(turns),
                questions=tuple(_locomo_questions(conv_id, sample, valid, path)),
                observations=tuple(_locomo_observations(conv_id, sample, valid)),
            )
        )
    return conversations


# --------------------------------------------------------------------------------------------
# LongMemEval

_LME_DATE = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\(\w+\))?\s+(\d{1,2}):(\d{2})")


def parse_longmemeval_datetime(value: str) -> datetime:
    """Parse a LongMemEval stamp such as ``"2023/05/20 (Sat) 02:21"`` as UTC.

    Raises:
        ValueError: if ``value`` does not have that shape.
    """
    match = _LME_DATE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"not a LongMemEval date: {value!r}")
    year, month, day, hour, minute = (int(g) for g in match.groups())
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def _lme_date(value: str, path: Path, where: str) -> datetime:
    try:
        return parse_longmemeval_datetime(value)
    except ValueError as exc:
        raise DatasetFormatError(path, where, str(exc)) from exc


def _lme_conversation(item: Any, index: int, path: Path) -> Conversation:
    at = f"[{index}]"
    qid = _require(item, "question_id", (str, int), path, at)
    qid = str(qid)
    at = f"[{index}]({qid})"
    session_ids = _require(item, "haystack_session_ids", list, path, at)
    dates = _require(item, "haystack_dates", list, path, at)
    sessions = _require(item, "haystack_sessions", list, path, at)
    if not len(session_ids) == len(dates) == len(sessions):
        raise DatasetFormatError(
            path, at, f"haystack lengths differ: {len(session_ids)} ids, {len(dates)} dates, {len(sessions)} sessions"
        )
    turns: list[Turn] = []
    answers: list[str] = []
    seen: set[str] = set()
    first_seen: dict[str, Any] = {}
    for s, (session_id, date, session) in enumerate(zip(session_ids, dates, sessions, strict=True)):
        where = f"{at}.haystack_sessions[{s}]"
        if not isinstance(session, list):
            raise DatasetFormatError(path, where, f"expected a list of turns, got {type(session).__name__}")
        if first_seen.get(str(session_id)) == session:  # the same session again (another date): read once
            logger.debug("%s: session %s repeats with the same turns; kept at its first date", at, session_id)
            continue
        first_seen.setdefault(str(session_id), session)
        if not isinstance(date, str):
            raise DatasetFormatError(path, f"{at}.haystack_dates[{s}]", "expected str")
        occurred_at = _lme_date(date, path, f"{at}.haystack_dates[{s}]")
        session_id = str(session_id)
        for i, raw in enumerate(session):
            turn_id = f"{session_id}:{i}"
            if turn_id in seen:
                raise DatasetFormatError(path, where, f"duplicate turn id {turn_id!r} (repeated session id)")
            seen.add(turn_id)
            turns.append(
                Turn(
                    turn_id=turn_id,
                    session_id=session_id,
                    role=_require(raw, "role", str, path, f"{where}[{i}]"),
                    text=_require(raw, "content", str, path, f"{where}[{i}]"),
                    occurred_at=occurred_at,
                )
            )
            if raw.get("has_answer") is True:
                answers.append(turn_id)
    question_date = item.get("question_date")
    question_type = item.get("question_type")
    question_type = question_type if isinstance(question_type, str) else None
    category = longmemeval_category(qid, question_type)
    question = Question(
        question_id=qid,
        conversation_id=qid,
        text=_require(item, "question", str, path, at),
        relevant_turn_ids=frozenset(answers),
        category=category,
        question_date=_lme_date(question_date, path, f"{at}.question_date") if isinstance(question_date, str) else None,
        question_type=question_type,
        category_name=LONGMEMEVAL_CATEGORIES.get(category) if category is not None else None,
    )
    return Conversation(conversation_id=qid, turns=tuple(turns), questions=(question,), shared_turn_ids=True)


def load_longmemeval(path: str | Path) -> list[Conversation]:
    """Load a LongMemEval JSON file (``longmemeval_s``/``_m``/``_oracle`` shape), one conversation per item.

    Each item's haystack becomes its own conversation (id = ``question_id``), so items never see
    each other's sessions. Turn ids are ``"<haystack session id>:<index in session>"``, session
    ids are the haystack ids, ``occurred_at`` the session's ``haystack_dates`` entry (UTC). The
    single question's relevant turns are those with ``has_answer: true`` (some items have none);
    its category is :func:`longmemeval_category` (abstention ids apart), and the conversation's
    ``shared_turn_ids`` is set (sessions repeat across items). A session whose id repeats within one haystack with the same turns is read once, at
    its first date (13 items of LongMemEval-S repeat one session so, under another date); a
    repeated id with other turns is an error.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        DatasetFormatError: if the file is not JSON, a required key is missing or mistyped, a date
            is unparseable, the haystack lists differ in length, or a session id repeats with other
            turns.
    """
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, list):
        raise DatasetFormatError(path, "top level", f"expected a list of items, got {type(data).__name__}")
    conversations = [_lme_conversation(item, i, path) for i, item in enumerate(data)]
    ids = [c.conversation_id for c in conversations]
    if len(set(ids)) != len(ids):
        raise DatasetFormatError(path, "top level", "question_id values are not unique")
    return conversations
