"""``mnemos bench pair``: one arm of two quality runs, paired per question (two configurations, one set of pools).

``mnemos bench quality --per-question F`` writes, per run (``corpus/protocol/arm``), every question's
NDCG@10, Recall@10 and Recall@30. Two runs of the bench that differ in one thing only (the service's
features set through ``MNEMOS_*``, say) score the same questions on the same pools; this command
pairs one run of each file question by question on NDCG@10, over the questions the bench headlines
(:func:`bench.common.questions.overall_question`), their dev and test splits and each category.

Like for like or nothing: the two runs must hold the same question keys, every key must be a
question of ``--data`` (so the categories and splits are the bench's own,
:func:`bench.common.questions.prepare_questions` with the runs' ``--seed``), and every ``--same``
run (``hybrid_rerank``, say) must be identical in both files, which shows that the pools the
compared arm reorders are the same. Statistics: :func:`bench.common.stats.compare_paired` (percentile
bootstrap CI, two-sided paired permutation p, 10,000 resamples, seeded).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from bench.common.markdown import MarkdownTargetError, append_markdown, check_target, escape_cell
from bench.common.questions import BenchQuestion, overall_question
from bench.common.stats import DEFAULT_RESAMPLES, PairedComparison, compare_paired, format_p
from bench.quality.question_metrics import PER_QUESTION_METRICS

__all__ = ["PairError", "PairGroup", "check_same", "pair_runs", "pair", "markdown_table", "read_per_question"]

SAME_TOLERANCE = 1e-9
"""Largest per-question NDCG@10 difference of a ``--same`` run between the files that still counts as equal."""


class PairError(ValueError):
    """Raised when two runs cannot be paired: an unreadable file, a missing run, other questions, a key
    that is not a question of the data, or a ``--same`` run that differs between the files."""


@dataclass(frozen=True)
class PairGroup:
    """One group of questions: ``n``, the two means of NDCG@10 and treatment − control, paired."""

    name: str
    n: int
    control: float
    treatment: float
    comparison: PairedComparison


def read_per_question(path: Path) -> Mapping[str, Mapping[str, Sequence[float]]]:
    """The ``runs`` of a ``--per-question`` file (gzip-compressed JSON, whatever its suffix).

    Raises:
        PairError: if the file cannot be read as one.
    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PairError(f"{path.name}: not a --per-question file ({exc.__class__.__name__}: {exc})") from exc
    runs = document.get("runs") if isinstance(document, dict) else None
    if not isinstance(runs, dict) or document.get("metrics", [None])[0] != PER_QUESTION_METRICS[0]:
        raise PairError(f"{path.name}: not a --per-question file (no runs, or NDCG@10 not the first metric)")
    return runs


def _ndcg(name: str, runs: Mapping[str, Mapping[str, Sequence[float]]], run: str) -> dict[str, float]:
    if run not in runs:
        raise PairError(f"{name}: no run {run} (it has {', '.join(sorted(runs))})")
    try:
        return {key: float(values[0]) for key, values in runs[run].items()}
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise PairError(f"{name}: run {run} holds a value that is no list of metrics") from exc


def check_same(treatment: Mapping[str, Mapping[str, Sequence[float]]],
               control: Mapping[str, Mapping[str, Sequence[float]]], runs: Sequence[str]) -> None:
    """Refuse unless each of ``runs`` gives every question the same NDCG@10 in both files.

    Raises:
        PairError: naming the run and the first question that differs (or the missing run).
    """
    for run in runs:
        t, c = _ndcg("treatment", treatment, run), _ndcg("control", control, run)
        if t.keys() != c.keys():
            raise PairError(f"--same {run}: the files hold different questions")
        for key in sorted(t):
            if abs(t[key] - c[key]) > SAME_TOLERANCE:
                raise PairError(f"--same {run}: question {key} has NDCG@10 {t[key]} in the treatment and "
                                f"{c[key]} in the control, so the runs did not rank the same pools")


def pair_runs(treatment: Mapping[str, float], control: Mapping[str, float],
              questions: Mapping[str, BenchQuestion], *, n_resamples: int = DEFAULT_RESAMPLES) -> list[PairGroup]:
    """Treatment − control NDCG@10 per group: the headline questions, their dev and test splits, each category.

    Args:
        treatment, control: NDCG@10 by question key, one run each.
        questions: the bench's questions by key (:func:`bench.common.questions.prepare_questions`).

    Raises:
        PairError: if the runs hold different keys, a key is not in ``questions``, or no headline
            question is left.
    """
    if treatment.keys() != control.keys():
        only_t, only_c = sorted(treatment.keys() - control.keys()), sorted(control.keys() - treatment.keys())
        raise PairError(f"the runs hold different questions: {len(only_t)} only in the treatment (e.g. {only_t[:3]}), "
                        f"{len(only_c)} only in the control (e.g. {only_c[:3]})")
    unknown = sorted(treatment.keys() - questions.keys())
    if unknown:
        raise PairError(f"{len(unknown)} keys are no question of the data (e.g. {unknown[:3]}): another data file?")
    headline = [k for k in sorted(treatment) if overall_question(questions[k].category)]
    if not headline:
        raise PairError("no question of the headline set (categories 1-4) in the runs")
    category = {k: questions[k].category_name or str(questions[k].category) for k in headline}
    groups = [("all", headline), ("dev split", [k for k in headline if questions[k].dev]),
              ("test split", [k for k in headline if not questions[k].dev])]
    groups += [(c, [k for k in headline if category[k] == c]) for c in sorted(set(category.values()))]
    out = []
    for name, keys in groups:
        if not keys:
            continue
        t, c = [treatment[k] for k in keys], [control[k] for k in keys]
        out.append(PairGroup(name=name, n=len(keys), control=sum(c) / len(keys), treatment=sum(t) / len(keys),
                             comparison=compare_paired(t, c, n_resamples=n_resamples)))
    return out


def markdown_table(groups: Sequence[PairGroup], *, treatment: str, control: str) -> str:
    """One line per group: n, both means, treatment − control with its 95% CI and p (``|`` in a label escaped)."""
    treatment, control = escape_cell(treatment), escape_cell(control)
    lines = [f"| questions | n | {control} | {treatment} | {treatment} − {control} [95% CI] | p |",
             "|---|---:|---:|---:|---|---:|"]
    for g in groups:
        low, high = g.comparison.delta_ci95
        lines.append(f"| {g.name} | {g.n} | {g.control:.3f} | {g.treatment:.3f} "
                     f"| {g.comparison.delta:+.3f} [{low:+.3f}, {high:+.3f}] | {format_p(g.comparison.p_value)} |")
    return "\n".join(lines) + "\n"


_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("pair")
@click.option("--data", required=True, type=_FILE, help="The dataset both runs scored (for categories and splits).")
@click.option("--format", "data_format", type=click.Choice(["locomo", "longmemeval"]), default="locomo",
              show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="The runs' --seed (it draws the dev split).")
@click.option("--treatment", "treatment_file", required=True, type=_FILE, help="A --per-question file.")
@click.option("--control", "control_file", required=True, type=_FILE, help="The other run's --per-question file.")
@click.option("--run", required=True, help="corpus/protocol/arm compared, e.g. per_tenant/heldout/service_defaults.")
@click.option("--control-run", default=None, help="The control's run, when it is not --run.")
@click.option("--same", multiple=True, help="A run that must be identical in both files (repeatable).")
@click.option("--treatment-label", default="treatment", show_default=True)
@click.option("--control-label", default="control", show_default=True)
@click.option("--markdown", "markdown_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append the heading line and the table to this file (created if missing), after a blank line.")
def pair(data: Path, data_format: str, seed: int, treatment_file: Path, control_file: Path, run: str,
         control_run: str | None, same: tuple[str, ...], treatment_label: str, control_label: str,
         markdown_out: Path | None) -> None:
    """NDCG@10 of one arm in two quality runs, paired per question. Exits 2 when they cannot be paired."""
    from bench.common.datasets import DatasetError, load_locomo, load_longmemeval
    from bench.common.questions import prepare_questions

    try:
        if markdown_out is not None:
            check_target(markdown_out)
        treatment, control = read_per_question(treatment_file), read_per_question(control_file)
        check_same(treatment, control, same)
        conversations = load_locomo(data) if data_format == "locomo" else load_longmemeval(data)
        questions = {q.key: q for q in prepare_questions(conversations, seed=seed)}
        groups = pair_runs(_ndcg(treatment_file.name, treatment, run),
                           _ndcg(control_file.name, control, control_run or run), questions)
    except (PairError, DatasetError, MarkdownTargetError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    heading = (f"{run} of {treatment_file.name} against {control_run or run} of {control_file.name} on "
               f"{data.name}" + (f"; identical in both: {', '.join(same)}" if same else ""))
    table = markdown_table(groups, treatment=treatment_label, control=control_label)
    click.echo(heading)
    click.echo(table, nl=False)
    if markdown_out is not None:
        append_markdown(markdown_out, f"{heading}\n\n{table}")
