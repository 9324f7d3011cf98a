"""The rerank sweep: quality and time of each reranker configuration, read together.

``mnemos bench quality --compare-rerankers NAME=DIR,DIR[@MAX_LENGTH]`` measures other rerankers
beside the main run's on the same held-out questions, and times each one on the same real pools
in the same process (``rerank_time`` of each variant block; see :mod:`bench.quality.variants`). This module
turns those blocks into the ``rerank_sweep`` rows of ``bench/results/speed.json`` (layers ×
max_length × NDCG@10 × ms per pool) and writes ``speed.md`` beside it, so that the choice of the
default reranker (docs/architecture.md, "Reranker") is read from one table. Numbers only, no assertions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["rerank_sweep", "speed_markdown", "write_speed_report"]

_RERANK_ARM = "hybrid_rerank"
_FULL_ARM = "mnemos_full"


def rerank_sweep(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of the sweep from one ``bench quality`` JSON document: every variant that names a
    reranker (``layers``, ``max_length``) and was timed, in the document's order.

    Each row: ``dataset``, ``name``, ``layers``, ``max_length``, ``precision``, ``epochs``, ``max_pairs``,
    ``learning_rate`` (``precision`` and ``learning_rate`` absent in documents written before they were recorded),
    ``p50_ms`` / ``p95_ms`` (cross-encoder time per pool), and per corpus mode
    ``{mode: {"hybrid_rerank": {"ndcg@10", "delta", "ci95", "p"}, "mnemos_full": ...}}`` where
    ``delta`` is the paired NDCG@10 difference from the main run's rerankers (0 for the main ones).
    """
    dataset = (document.get("dataset") or {}).get("path", "")
    rows = []
    for block in document.get("variants") or []:
        reranker, timing = block.get("reranker"), block.get("rerank_time")
        if not reranker or not timing:
            continue
        modes: dict[str, Any] = {}
        for mode, arms in block.get("modes", {}).items():
            modes[mode] = {}
            for arm in (_RERANK_ARM, _FULL_ARM):
                entry = arms.get(arm)
                if not entry or entry.get("ndcg@10") is None:
                    continue
                vs = entry.get("vs_main") or {}
                modes[mode][arm] = {"ndcg@10": entry["ndcg@10"], "delta": vs.get("delta"),
                                    "ci95": vs.get("ci95"), "p": vs.get("p")}
        rows.append({"dataset": dataset, "name": block["name"], **reranker,
                     "p50_ms": timing["p50_ms"], "p95_ms": timing["p95_ms"], "modes": modes})
    return rows


def _cell(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "–"
    delta, ci = entry.get("delta"), entry.get("ci95")
    if delta is None or not ci:
        return f"{entry['ndcg@10']:.3f}"
    return f"{entry['ndcg@10']:.3f} ({delta:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}])"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def speed_markdown(speed: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """``speed.md``: the service's query and ingest figures, then the rerank sweep table."""
    lines = ["# Speed", "", f"Command: `{speed.get('command', '')}`", "",
             f"Machine: {speed.get('machine', {})}; reranker: `{speed.get('reranker')}`"
             f" computing in {(speed.get('settings') or {}).get('rerank_precision') or 'fp32'}", "",
             "| figure | value |", "|---|---|"]
    for key in ("query_p50_s", "query_p95_s", "worker_rerank_p50_s", "outside_rerank_p50_s",
                "ingest_turns_per_s", "encoder_turns_per_s", "freshness_p50_s"):
        value = speed.get(key)
        lines.append(f"| {key} | {value:.3f} |" if isinstance(value, int | float) else f"| {key} | – |")
    if rows:
        modes = list(dict.fromkeys(m for row in rows for m in row["modes"]))
        head = " | ".join(f"{m} {arm}" for m in modes for arm in (_RERANK_ARM, _FULL_ARM))
        lines += ["", "## rerank_sweep", "",
                  "Held-out NDCG@10 (Δ vs the main rerankers of the same run, paired 95% CI) and the "
                  "cross-encoder's time per real 30-turn pool, measured in that run. Compare rows within one run "
                  "(`run`: the `bench quality` JSON they come from): runs differ in questions and machine. `lr`: the "
                  "peak learning rate of the reranker's training (–: not recorded by that run; before "
                  "`reranker train --learning-rate` existed every model was trained at 5e-05). `precision`: what the "
                  "cross-encoder computed in (runs written before it was recorded computed in fp32).", "",
                  f"| run | dataset | reranker | layers | max_length | precision | epochs | max_pairs | lr | {head} "
                  "| ms/pool p50 (p95) |",
                  "|---|---|---|---|---|---|---|---|---|" + "---|" * (2 * len(modes) + 1)]
        for row in rows:
            cells = [_cell(row["modes"].get(m, {}).get(arm)) for m in modes for arm in (_RERANK_ARM, _FULL_ARM)]
            lines.append(f"| {row.get('run', '–')} | {row['dataset']} | {row['name']} | {row.get('layers')} | {row.get('max_length')} | "
                         f"{row.get('precision') or 'fp32'} | {row.get('epochs')} | {row.get('max_pairs') or 'all'} | {_rate(row.get('learning_rate'))} | "
                         + " | ".join(cells)
                         + f" | {row['p50_ms']:.0f} ({row['p95_ms']:.0f}) |")
    return "\n".join(lines) + "\n"


def write_speed_report(speed_json: Path, sweep_sources: Sequence[Path], markdown: Path | None) -> list[dict]:
    """Add ``rerank_sweep`` (from the ``bench quality`` JSON files ``sweep_sources``) to the speed
    JSON at ``speed_json`` in place and write ``markdown``; returns the sweep rows, each with
    ``run``: the file name of the source it came from.

    Raises:
        OSError: if a file cannot be read or written; json.JSONDecodeError on a malformed file.
    """
    speed = json.loads(speed_json.read_text())
    rows = [{"run": source.name, **row} for source in sweep_sources
            for row in rerank_sweep(json.loads(source.read_text()))]
    if sweep_sources:
        speed["rerank_sweep"] = rows
        speed_json.write_text(json.dumps(speed, indent=2) + "\n")
    if markdown is not None:
        markdown.write_text(speed_markdown(speed, speed.get("rerank_sweep", rows)))
    return rows
