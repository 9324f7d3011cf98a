"""Builders of hand-written LongMemEval items for the tests of the miner and of ``reranker pools``.

The shape is the one :func:`bench.common.datasets.load_longmemeval` reads (``longmemeval_s`` /
``_oracle``): a question with its haystack of dated sessions, evidence turns marked ``has_answer``.
"""

from __future__ import annotations

import json
from pathlib import Path


def lme_turn(role: str, content: str, answer: bool = False) -> dict[str, object]:
    """One haystack turn; ``answer`` marks it as evidence (``has_answer``)."""
    return {"role": role, "content": content, **({"has_answer": True} if answer else {})}


def lme_item(qid: str, question: str, qtype: str, sessions: list[tuple[str, list[dict[str, object]]]]) -> dict:
    """One item: ``sessions`` as ``(session id, turns)`` in haystack order, dated a day apart from 2023-05-10."""
    return {
        "question_id": qid, "question_type": qtype, "question": question, "answer": "x",
        "question_date": "2023/06/01 (Thu) 10:00",
        "haystack_session_ids": [s for s, _ in sessions],
        "haystack_dates": [f"2023/05/{10 + i:02d} (Wed) 09:00" for i in range(len(sessions))],
        "haystack_sessions": [turns for _, turns in sessions],
        "answer_session_ids": [],
    }


def write_items(path: Path, items: list[dict]) -> Path:
    """``items`` written to ``path`` as a LongMemEval JSON file; returns ``path``."""
    path.write_text(json.dumps(items), encoding="utf-8")
    return path
