"""``mnemos reranker pools-compare``: two rerankers on the same BM25 pools, question by question.

Reads the JSON reports of ``mnemos reranker pools`` (:mod:`bench.training.pools_cli`), whose ``rows``
hold one question each (``question_id``, ``question_type``, NDCG@10 of BM25's, the reranker's and the
interpolated order of the same pool). A side, treatment or control, is the union of one or more
reports: with one model per question fold, each of which scored only the questions it never trained
on, two reports cover every question once, each ranked by the model that never saw it (cross-fitting;
docs/reranker.md "Never grading a model on what it learned" and "Why the first LongMemEval model was weak").

Pairing is by ``question_id``, and refused unless it is like for like: the two sides must hold the
same questions, from the same data file at the same pool size, and BM25's NDCG@10 of each question
must be the same on both sides (else the pools differ). Per group (every question, then each
question type): n, BM25's mean, each side's mean in the chosen order, and three paired comparisons,
treatment minus control, control minus BM25 and treatment minus BM25 (:func:`bench.common.stats.compare_paired`:
percentile bootstrap CI and two-sided permutation p, seeded).

The comparison is pure (:func:`compare_pools`, :func:`markdown_table`); the click command reads and
writes the files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from bench.common.markdown import MarkdownTargetError, append_markdown, check_target, escape_cell
from bench.common.stats import DEFAULT_RESAMPLES, PairedComparison, compare_paired, format_p
from bench.training.pool_check import ALL

__all__ = [
    "ORDERS",
    "GroupComparison",
    "PoolsCompareError",
    "compare_pools",
    "load_side",
    "markdown_table",
    "pools_compare",
]

ORDERS = ("rerank", "interp")
"""The orders of a pool two rerankers can be compared in (``bm25`` is the same on both sides)."""

BM25_TOLERANCE = 1e-9
"""Largest difference of a question's BM25 NDCG@10 between the two sides that still counts as the same pool."""

_POOLS_COMMAND = "mnemos reranker pools"
_ORDER_TITLES = {"rerank": "rerank order", "interp": "interp order (z(logit) + z(BM25 score))"}


class PoolsCompareError(ValueError):
    """Raised when reports cannot be paired: not a pools report, a question in two reports of one side,
    different data files or pool sizes, different question sets, or a question whose BM25 pool differs."""


@dataclass(frozen=True)
class GroupComparison:
    """One group of questions: ``n`` of them, mean NDCG@10 of BM25 and of each side in the chosen order,
    and the paired comparisons treatment − control, control − BM25 and treatment − BM25."""

    name: str
    n: int
    bm25: float
    control: float
    treatment: float
    vs_control: PairedComparison
    control_vs_bm25: PairedComparison
    vs_bm25: PairedComparison


def _is_ndcg(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def _check_row(name: str, row: object) -> None:
    if not isinstance(row, dict) or not {"question_id", "question_type", "bm25", *ORDERS} <= row.keys():
        raise PoolsCompareError(f"{name}: a row lacks question_id, question_type, bm25, rerank or interp")
    qid, qtype = row["question_id"], row["question_type"]
    if not isinstance(qid, str) or not qid or not isinstance(qtype, str) or not qtype or qtype == ALL:
        raise PoolsCompareError(f"{name}: question {qid!r}: question_id and question_type must be non-empty "
                                f"strings, and the type not {ALL!r}")
    for metric in ("bm25", *ORDERS):
        if not _is_ndcg(row[metric]):
            raise PoolsCompareError(f"{name}: question {qid}: {metric} is {row[metric]!r}, not an NDCG@10 in [0, 1]")


def _rows_of(name: str, report: object) -> tuple[dict[str, object], list[dict[str, object]]]:
    if not isinstance(report, dict) or report.get("command") != _POOLS_COMMAND:
        raise PoolsCompareError(f"{name}: not a report of `{_POOLS_COMMAND} --json`")
    arguments, rows = report.get("arguments"), report.get("rows")
    if not isinstance(arguments, dict) or not isinstance(rows, list) or not rows:
        raise PoolsCompareError(f"{name}: no arguments or no rows")
    if arguments.get("on_training"):
        raise PoolsCompareError(f"{name}: a check of fit (--on-training): its model trained on these questions")
    for row in rows:
        _check_row(name, row)
    return arguments, rows


def load_side(reports: Sequence[tuple[str, object]]) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    """Join the rows of ``reports`` (``(file name, parsed JSON of mnemos reranker pools --json)`` pairs).

    Returns ``(rows by question_id, {"longmemeval": data file name, "pool_size": int, "chitchat": int})``.

    Raises:
        PoolsCompareError: if a report is not a pools report, is a check of fit (``--on-training``) or has
            no rows, if a row's id or type is not a non-empty string or an NDCG@10 is not a number in
            [0, 1], if two reports name different data files or pool sizes, or if a question appears
            twice (the same file given twice included).
    """
    if not reports:
        raise PoolsCompareError("no report given")
    joined: dict[str, dict[str, object]] = {}
    source: dict[str, object] = {}
    for name, report in reports:
        arguments, rows = _rows_of(name, report)
        here = {"longmemeval": arguments.get("longmemeval"), "pool_size": arguments.get("pool_size"),
                "chitchat": arguments.get("chitchat", 0)}
        if source and here != source:
            raise PoolsCompareError(f"{name}: {here} where the other reports have {source}")
        source = here
        for row in rows:
            qid = str(row["question_id"])
            if qid in joined:
                raise PoolsCompareError(f"{name}: question {qid} is already in another report of the same side")
            joined[qid] = row
    return joined, source


def _check_pairing(treatment: Mapping[str, Mapping[str, object]], control: Mapping[str, Mapping[str, object]]) -> None:
    only_t, only_c = sorted(treatment.keys() - control.keys()), sorted(control.keys() - treatment.keys())
    if only_t or only_c:
        raise PoolsCompareError(f"the sides hold different questions: {len(only_t)} only in the treatment "
                                f"(e.g. {only_t[:3]}), {len(only_c)} only in the control (e.g. {only_c[:3]})")
    for qid, row in treatment.items():
        if row["question_type"] != control[qid]["question_type"]:
            raise PoolsCompareError(f"question {qid}: type {row['question_type']} in the treatment and "
                                    f"{control[qid]['question_type']} in the control")
        if abs(float(row["bm25"]) - float(control[qid]["bm25"])) > BM25_TOLERANCE:
            raise PoolsCompareError(f"question {qid}: BM25's NDCG@10 is {row['bm25']} in the treatment and "
                                    f"{control[qid]['bm25']} in the control, so the pools differ")


def compare_pools(
    treatment: Mapping[str, Mapping[str, object]], control: Mapping[str, Mapping[str, object]], *,
    order: str = "rerank", n_resamples: int = DEFAULT_RESAMPLES,
) -> list[GroupComparison]:
    """Compare two sides (rows by question_id, as :func:`load_side` returns) in ``order``.

    Returns one :class:`GroupComparison` for every question, then one per question type (sorted).

    Raises:
        ValueError: if ``order`` is not one of :data:`ORDERS`.
        PoolsCompareError: if the sides hold different questions, or a question's type or BM25 NDCG@10 differs.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if not treatment:
        raise PoolsCompareError("no question to compare")
    _check_pairing(treatment, control)
    ids = sorted(treatment)
    types = sorted({str(treatment[q]["question_type"]) for q in ids})
    groups = [(ALL, ids)] + [(t, [q for q in ids if treatment[q]["question_type"] == t]) for t in types]
    out = []
    for name, members in groups:
        bm25 = [float(treatment[q]["bm25"]) for q in members]
        t = [float(treatment[q][order]) for q in members]
        c = [float(control[q][order]) for q in members]
        out.append(GroupComparison(
            name=name, n=len(members), bm25=sum(bm25) / len(members), control=sum(c) / len(members),
            treatment=sum(t) / len(members), vs_control=compare_paired(t, c, n_resamples=n_resamples),
            control_vs_bm25=compare_paired(c, bm25, n_resamples=n_resamples),
            vs_bm25=compare_paired(t, bm25, n_resamples=n_resamples)))
    return out


def markdown_table(groups: Sequence[GroupComparison], *, treatment: str, control: str, order: str) -> str:
    """A markdown section: a heading naming the sides and the order, then one line per group
    (a ``|`` in a label is escaped, so it cannot split a cell)."""
    treatment, control = escape_cell(treatment), escape_cell(control)
    lines = [f"## {treatment} vs {control}, {_ORDER_TITLES[order]}", "",
             f"| questions | n | bm25 | {control} | {treatment} | {treatment} − {control} [95% CI] | p "
             f"| {control} − bm25 | p | {treatment} − bm25 | p |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for g in groups:
        low, high = g.vs_control.delta_ci95
        lines.append(f"| {g.name} | {g.n} | {g.bm25:.3f} | {g.control:.3f} | {g.treatment:.3f} "
                     f"| {g.vs_control.delta:+.3f} [{low:+.3f}, {high:+.3f}] | {format_p(g.vs_control.p_value)} "
                     f"| {g.control_vs_bm25.delta:+.3f} | {format_p(g.control_vs_bm25.p_value)} "
                     f"| {g.vs_bm25.delta:+.3f} | {format_p(g.vs_bm25.p_value)} |")
    return "\n".join(lines) + "\n"


def _read(paths: Sequence[Path]) -> list[tuple[str, object]]:
    reports: list[tuple[str, object]] = []
    for path in paths:
        try:
            reports.append((path.name, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PoolsCompareError(f"{path.name}: unreadable ({exc.__class__.__name__}: {exc})") from exc
    return reports


_REPORT = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("pools-compare")
@click.option("--treatment", "treatment_files", type=_REPORT, multiple=True, required=True,
              help="A `mnemos reranker pools --json` report; repeat to join one report per question fold.")
@click.option("--control", "control_files", type=_REPORT, multiple=True, required=True,
              help="The report(s) of the reranker to compare with, covering the same questions.")
@click.option("--treatment-label", default="treatment", show_default=True, help="The treatment's name in the table.")
@click.option("--control-label", default="control", show_default=True, help="The control's name in the table.")
@click.option("--order", type=click.Choice(ORDERS), multiple=True, default=ORDERS, show_default=True,
              help="The order(s) to compare: the reranker's logits, or z(logit) + z(BM25 score).")
@click.option("--markdown", "markdown_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append the tables to this file (created if missing), after a blank line.")
def pools_compare(treatment_files: tuple[Path, ...], control_files: tuple[Path, ...], treatment_label: str,
                  control_label: str, order: tuple[str, ...], markdown_out: Path | None) -> None:
    """NDCG@10 of two rerankers on the same BM25 pools, paired per question, overall and per question type.

    Exits 2, with the reason on stderr, when the reports cannot be paired like for like.
    """
    try:
        if markdown_out is not None:
            check_target(markdown_out)
        treatment, source = load_side(_read(treatment_files))
        control, control_source = load_side(_read(control_files))
        if source != control_source:
            raise PoolsCompareError(f"the treatment has {source}, the control {control_source}")
        tables = [markdown_table(compare_pools(treatment, control, order=o), treatment=treatment_label,
                                 control=control_label, order=o) for o in order]
    except (PoolsCompareError, MarkdownTargetError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    text = "\n".join(tables)
    click.echo(f"{len(treatment)} questions of {source['longmemeval']}, BM25 top-{source['pool_size']} pools; "
               f"treatment {', '.join(p.name for p in treatment_files)}; control {', '.join(p.name for p in control_files)}")
    click.echo(text, nl=False)
    if markdown_out is not None:
        append_markdown(markdown_out, text)
