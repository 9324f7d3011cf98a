"""Training pairs from a JSONL file (``mnemos reranker train --pairs``): one row per positive.

Each row is ``{"query": str, "positive": str, "negatives"?: [str]}``; all rows form one mining
group (:func:`bench.training.pairs.mine_examples`), so the other rows' positives are the candidate
negatives. The file's licence is the operator's to state (``--pairs-licence``).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.training.errors import TrainingDataError
from bench.training.pairs import PairSource, PositivePair

__all__ = ["read_pairs_jsonl"]


def read_pairs_jsonl(path: str | Path) -> list[PositivePair]:
    """Read ``{"query": str, "positive": str, "negatives"?: [str]}`` lines (blank lines skipped).

    All rows form one mining group: the other rows' positives are the candidate negatives.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        TrainingDataError: on a line that is not a JSON object with non-empty string ``query``
            and ``positive`` and, if present, a list of strings ``negatives``; or an empty file.
    """
    path = Path(path)
    pairs: list[PositivePair] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainingDataError(where, f"invalid JSON: {exc.msg}") from exc
            if not isinstance(row, dict):
                raise TrainingDataError(where, "expected a JSON object")
            query, positive = row.get("query"), row.get("positive")
            if not (isinstance(query, str) and query.strip() and isinstance(positive, str) and positive.strip()):
                raise TrainingDataError(where, "'query' and 'positive' must be non-empty strings")
            negatives = row.get("negatives", [])
            if not isinstance(negatives, list) or not all(isinstance(n, str) for n in negatives):
                raise TrainingDataError(where, "'negatives' must be a list of strings")
            pairs.append(PositivePair(query, positive, str(path), PairSource.JSONL, None, tuple(negatives)))
    if not pairs:
        raise TrainingDataError(str(path), "no pairs")
    return pairs
