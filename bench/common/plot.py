"""PNG chart of NDCG@10 per arm with 95% bootstrap intervals, one panel per corpus mode.

Uses matplotlib's non-interactive Agg backend through an explicit ``Figure`` (no pyplot state),
so it is safe in a headless benchmark process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_ndcg"]

_PROTOCOL_STYLE = {"heldout": ("tab:blue", "o"), "transductive": ("tab:orange", "s"),
                   "service": ("tab:blue", "o"), "in process": ("tab:green", "s")}


def plot_ndcg(runs: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "", metric: str = "ndcg@10") -> Path:
    """Draw ``metric`` (a run key such as ``"ndcg@10"``; its CI under ``metric + "_ci95"``) per arm.

    ``runs`` are the JSON run rows of ``bench.quality.run`` (keys ``corpus``, ``protocol``, ``arm``,
    ``metric``, ``metric_ci95``). Arms keep their first-seen order, top to bottom; each protocol
    gets its own marker, slightly offset. Returns the written path (parent directories are made).

    Raises:
        ValueError: if ``runs`` is empty.
    """
    if not runs:
        raise ValueError("no runs to plot")
    corpora = list(dict.fromkeys(str(r["corpus"]) for r in runs))
    arms = list(dict.fromkeys(str(r["arm"]) for r in runs))
    protocols = list(dict.fromkeys(str(r["protocol"]) for r in runs))
    figure = Figure(figsize=(6.0 * len(corpora), 0.45 * len(arms) + 1.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(corpora), sharex=True, squeeze=False)[0]
    for ax, corpus in zip(axes, corpora, strict=True):
        for j, protocol in enumerate(protocols):
            color, marker = _PROTOCOL_STYLE.get(protocol, ("tab:gray", "^"))
            offset = (j - (len(protocols) - 1) / 2) * 0.22
            labelled = False
            for i, arm in enumerate(arms):
                row = next(
                    (r for r in runs if r["corpus"] == corpus and r["protocol"] == protocol and r["arm"] == arm), None
                )
                if row is None or row.get(metric) is None:
                    continue
                value = float(row[metric])
                lo, hi = row.get(f"{metric}_ci95") or (value, value)
                ax.errorbar(
                    value, i + offset, xerr=[[value - lo], [hi - value]], fmt=marker, color=color, capsize=3,
                    label=None if labelled else protocol,
                )
                labelled = True
        ax.set_yticks(range(len(arms)), arms)
        ax.invert_yaxis()
        ax.set_title(corpus)
        ax.set_xlabel(f"{metric} (95% bootstrap CI)")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    if title:
        figure.suptitle(title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    return out
