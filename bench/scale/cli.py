"""``mnemos bench scale``: the command, its JSON document and its Markdown report.

The phases are :func:`bench.scale.run.large_phase`, :func:`bench.scale.tenants.many_phase`,
:func:`bench.scale.tenants.shards_phase` and :func:`bench.scale.reshard.reshard_phase`; ``--phases``
picks some. Each phase block records the
command, machine and time it ran with. Writing ``--json`` over an existing file keeps that file's
blocks of the phases not run this time, so the phases can be run one at a time (one per session)
into one result; the top-level figures are recomputed from the blocks.

Example (the full run, phase by phase)::

    mnemos bench scale --data ../shared/data/longmemeval/longmemeval_s_498.json.xz --phases large \\
        --json bench/results/scale.json --markdown bench/results/scale.md
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from bench.common.datasets import Conversation, load_longmemeval
from bench.common.harness import machine, write_json
from bench.scale.report import write_scale_markdown
from bench.scale.reshard import reshard_phase
from bench.scale.run import PHASES, ScaleOptions, headline, large_phase, scale_settings
from bench.scale.tenants import many_phase, shards_phase
from mnemos.encoder import bundled_bi_encoder_path
from mnemos.errors import ModelLoadError
from workers.settings import FAKE_MODEL, Settings

Runner = Callable[[Settings, ScaleOptions, Sequence[Conversation]], dict[str, Any]]
RUNNERS: dict[str, Runner] = {"large": large_phase, "many": many_phase, "shards": shards_phase,
                               "reshard": reshard_phase}
RECORDED_SETTINGS = ("bi_encoder", "fake_encoder_dim", "cross_encoder", "rerank_precision", "encoder_precision", "device", "pool_size", "n_candidates", "deep_threshold",
                     "suppression", "session_weight", "temporal_weight", "encoder_batch_size", "ingest_batch_size",
                     "rerank_batch_size", "rerank_cache_pairs", "index_memory_mb", "max_cached_tenants",
                     "job_timeout_s", "db_statement_timeout_s", "blas_threads")


def parse_phases(text: str) -> tuple[str, ...]:
    """``"large,many"`` as phase names in run order; raises click.BadParameter for an unknown one."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [n for n in names if n not in PHASES]
    if unknown or not names:
        raise click.BadParameter(f"phases are a comma-separated subset of {','.join(PHASES)}, got {text!r}")
    return tuple(p for p in PHASES if p in names)


def kept_phases(json_path: Path | None) -> dict[str, Any]:
    """The phase blocks of an earlier result at ``json_path`` ({} when there is none)."""
    if json_path is None or not json_path.is_file():
        return {}
    try:
        return dict(json.loads(json_path.read_text(encoding="utf-8")).get("phases") or {})
    except (json.JSONDecodeError, AttributeError) as exc:
        raise click.ClickException(f"{json_path} is not a scale result to add phases to: {exc}") from exc


def sizes(phases: dict[str, Any]) -> dict[str, Any]:
    """The sizes each phase actually used."""
    large, many, shards = phases.get("large") or {}, phases.get("many") or {}, phases.get("shards") or {}
    return {"large_turns": large.get("large_turns"), "small_turns": large.get("small_turns"),
            "queries": (large.get("queries") or {}).get("large", {}).get("n"),
            "refresh_probes": (large.get("refresh") or {}).get("probes"),
            "refresh_probe_turns": (large.get("refresh") or {}).get("turns_per_probe"),
            "tenants": many.get("tenants"), "tenant_turns": many.get("turns"), "requests": many.get("requests"),
            "memory_mb": many.get("memory_mb"), "zipf_s": many.get("zipf_s"), "shards": shards.get("shards"),
            "shard_tenants": shards.get("tenants"), "shard_requests": shards.get("requests")}


def with_bi_encoder(settings: Settings, choice: str) -> Settings:
    """``settings`` with the scale run's bi-encoder: ``settings`` (the configured one, unchanged) or
    ``hashing``: the fake :class:`mnemos.encoder.HashingEncoder` at the bundled bi-encoder's
    dimension (its ``config.json`` ``hidden_size``), so that stored vectors, the dense search and
    the memory per turn have the product's sizes while ingest does not pay the transformer.

    Raises click.ClickException when the bundled model's dimension cannot be read.
    """
    if choice == "settings":
        return settings
    try:
        config = json.loads((bundled_bi_encoder_path() / "config.json").read_text(encoding="utf-8"))
        dim = int(config["hidden_size"])
    except (OSError, KeyError, ValueError, ModelLoadError) as exc:
        raise click.ClickException(f"cannot read the bundled bi-encoder's dimension: {exc}") from exc
    return settings.replace(bi_encoder=FAKE_MODEL, fake_encoder_dim=dim)


def bi_encoder_name(settings: Settings) -> str:
    """``"hashing-<dim>"`` for the fake bi-encoder, else the ``bi_encoder`` setting."""
    return f"hashing-{settings.fake_encoder_dim}" if settings.bi_encoder == FAKE_MODEL else settings.bi_encoder


def run_scale_bench(settings: Settings, options: ScaleOptions, *, json_path: Path | None = None,
                    markdown: Path | None = None) -> int:
    """Run the chosen phases, print the headline, write the JSON (merged) and the Markdown; returns 0."""
    conversations = load_longmemeval(options.data)
    command = " ".join(shlex.quote(a) for a in ["mnemos", *sys.argv[1:]])
    blocks: dict[str, Any] = {}
    for phase in options.phases:
        click.echo(f"phase {phase}")
        started = time.monotonic()
        block = RUNNERS[phase](settings, options, conversations)
        blocks[phase] = {**block, "command": command, "machine": machine(), "bi_encoder": bi_encoder_name(settings),
                         "wall_s": time.monotonic() - started,
                         "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    phases = {**kept_phases(json_path), **blocks}
    recorded = scale_settings(settings, reranker=options.reranker, stamp="recorded")
    payload = {"command": command, "machine": machine(), "data": options.data.name, "reranker": options.reranker,
               **headline(phases), "sizes": sizes(phases),
               "options": {**dataclasses.asdict(options), "data": options.data.name},
               "settings": {name: getattr(recorded, name) for name in RECORDED_SETTINGS},
               "phases_run_now": list(options.phases), "phases": phases}
    for key in ("p50_ratio_200k_vs_6k", "cold_start_s_200k", "cold_start_turns", "bytes_per_turn",
                "bytes_per_turn_rss", "ingest_turns_per_s", "refresh_retrievable_p50_s", "eviction_hit_rate"):
        click.echo(f"{key}: {payload[key]}")
    if payload["shards"] is not None:
        click.echo(f"shards: every tenant served by its shard: {payload['shards']['every_tenant_served_by_its_shard']}")
    if payload["reshard"] is not None:
        grown = payload["reshard"]
        click.echo(f"reshard {grown['shards_before']} -> {grown['shards_after']}: {len(grown['moved_tenants'])} tenants "
                   f"moved, all to the new shard: {grown['every_moved_tenant_went_to_the_new_shard']}; "
                   f"turns lost {grown['turns_lost']}")
    if json_path is not None:
        write_json(json_path, payload)
        click.echo(f"wrote {json_path}")
    if markdown is not None:
        write_scale_markdown(payload, markdown)
        click.echo(f"wrote {markdown}")
    return 0


@click.command("scale")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="LongMemEval JSON, e.g. longmemeval_s_498.json.xz (its haystacks are the turns)")
@click.option("--phases", default=",".join(PHASES), show_default=True, help="which phases, comma-separated")
@click.option("--reranker", default=None, help="cross-encoder dir ('fake' for plumbing); default: settings")
@click.option("--bi-encoder", type=click.Choice(["settings", "hashing"]), default="settings", show_default=True,
              help="hashing: a fake bi-encoder of the bundled model's dimension (index-side figures only; "
                   "ingest then skips the transformer)")
@click.option("--large-turns", type=click.IntRange(1), default=200_000, show_default=True)
@click.option("--small-turns", type=click.IntRange(1), default=6_000, show_default=True)
@click.option("--queries", type=click.IntRange(1), default=100, show_default=True,
              help="questions asked of the large and of the small tenant each")
@click.option("--probes", type=click.IntRange(1), default=3, show_default=True, help="index refresh probes")
@click.option("--probe-turns", type=click.IntRange(1), default=5, show_default=True, help="new turns per probe")
@click.option("--tenants", type=click.IntRange(1), default=500, show_default=True, help="tenants of the many phase")
@click.option("--memory-mb", type=click.IntRange(1), default=None,
              help="MNEMOS_INDEX_MEMORY_MB of the many phase's query worker (default: settings)")
@click.option("--requests", type=click.IntRange(1), default=2_000, show_default=True, help="requests of the many phase")
@click.option("--zipf-s", type=click.FloatRange(0), default=1.1, show_default=True, help="Zipf exponent over tenants")
@click.option("--shards", type=click.IntRange(1), default=2, show_default=True,
              help="MNEMOS_SHARDS of the shards phase; the reshard phase grows from it to one more")
@click.option("--shard-tenants", type=click.IntRange(1), default=40, show_default=True)
@click.option("--shard-requests", type=click.IntRange(1), default=200, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write (or add phases to) this result, e.g. bench/results/scale.json")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the report here, e.g. bench/results/scale.md")
@click.pass_context
def scale(ctx: click.Context, data: Path, phases: str, reranker: str | None, bi_encoder: str,
          json_path: Path | None, markdown: Path | None, **sizes_: Any) -> None:
    """A 200k-turn tenant, 500 tenants under a memory budget, and shards, through the service."""
    settings = with_bi_encoder(ctx.find_root().obj, bi_encoder)
    options = ScaleOptions(data=data, phases=parse_phases(phases), reranker=reranker or settings.cross_encoder,
                           **sizes_)
    sys.exit(run_scale_bench(settings, options, json_path=json_path, markdown=markdown))
