"""``mnemos bench speed``: service overhead against the models' own time, in the same run.

* Ingest: the bi-encoder's own throughput on the turns (in this process, in consecutive chunks of
  ``ingest_batch_size`` in stream order, the batches a backlogged worker reads; the one-call,
  corpus-sorted rate is reported beside it) first, then end-to-end turns per second through the stream (first XADD to
  last commit) with one ingest worker process; target: at least 90% of the encoder's rate.
* Query: p50 / p95 client wall time of questions through rq (query worker process), against
  the cross-encoder's own time scoring the same pools in this process (the pool is the top
  ``pool_size`` of the fused list, as in the worker with suppression off); target overhead <= 20%.
  The worker's own per-stage seconds come back in every result, so the overhead is also given
  against the rerank time the worker measured on the very same request, and as absolute seconds
  outside reranking (client latency minus the worker's rerank).
* Freshness: seconds from XADD of a new turn to its commit in Postgres, from which the next
  request sees it (every request reads the tenant's memory version first); each probe is then
  confirmed retrievable through the queue (not timed).

Numbers, not assertions: the JSON records the machine and the command; run it alone on the machine.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

import click
from tqdm import tqdm

from bench.common.harness import (
    bench_settings,
    evaluated_conversations,
    freshness,
    machine,
    percentile,
    publish_conversations,
    run_stamp,
    running_service,
    write_json,
)
from bench.speed.report import write_speed_report
from workers.settings import Settings

log = logging.getLogger(__name__)


def encoder_rate(encoder, texts: list[str], batch: int | None = None) -> float:
    """Turns per second of ``encoder.encode`` over ``texts`` (one warm-up call first).

    ``batch`` None encodes everything in one call (the encoder sorts the whole corpus by length,
    so padding is minimal); an int encodes consecutive chunks of that many turns, in stream order,
    which is what an ingest worker reading full batches hands the encoder.
    """
    encoder.encode(texts[:8])
    size = batch or len(texts)
    started = time.perf_counter()
    for start in range(0, len(texts), size):
        encoder.encode(texts[start:start + size])
    return len(texts) / (time.perf_counter() - started)


def rerank_times(conversations, questions, encoder, reranker, pool_size: int) -> list[float]:
    """Seconds the cross-encoder alone takes on each question's pool (fused top ``pool_size``)."""
    from bench.common.corpora import CorpusMode, build_tenants, rendered_texts, unread_of
    from mnemos.pipeline import RetrievalConfig, retrieve

    texts = rendered_texts([t for c in conversations for t in c.turns])
    tenants = build_tenants(conversations, encoder.encode(texts), CorpusMode.PER_TENANT, dim=encoder.dim,
                            unread_of=unread_of(encoder))
    fused = RetrievalConfig(rerank=False, suppression=False, deep_threshold=None)
    times = []
    reranker.score("warm up", ["warm up"])
    for question in questions:
        tenant = tenants[question.conversation_id]
        vector = encoder.encode([question.text])[0]
        hits = retrieve(tenant.index, question.text, vector, k=pool_size, config=fused, reranker=None).hits
        pool = [tenant.index.rendered(h.entry_id) for h in hits[:pool_size]]
        started = time.perf_counter()
        reranker.score(question.text, pool)
        times.append(time.perf_counter() - started)
    return times


def run_speed_bench(settings: Settings, *, data: Path, reranker: str | None, limit: int | None,
                    limit_conversations: int | None, probes: int, json_path: Path | None,
                    sweep_from: tuple[Path, ...] = (), markdown: Path | None = None) -> int:
    from bench.common.corpora import rendered_texts
    from bench.common.questions import prepare_questions
    from workers.runtime.models import load_encoder, load_reranker

    stamp = run_stamp()
    run_settings = bench_settings(settings, reranker=reranker, stamp=stamp)
    conversations, _trained = evaluated_conversations(data, reranker, limit_conversations, True)
    questions = prepare_questions(conversations, limit=limit)
    texts = rendered_texts([t for c in conversations for t in c.turns])
    encoder = load_encoder(run_settings)
    encoder_before = encoder_rate(encoder, texts, run_settings.ingest_batch_size)
    sorted_tps = encoder_rate(encoder, texts)
    click.echo(f"bi-encoder alone: {encoder_before:.1f} turns/s in batches of {run_settings.ingest_batch_size} "
               f"({sorted_tps:.1f} turns/s in one length-sorted call) on {len(texts)} turns")
    with running_service(run_settings, ("ingest", "query")) as run:
        ingest = publish_conversations(run, conversations)
        click.echo(f"through the stream: {ingest['ingest_turns_per_s']:.1f} turns/s")
        # again right after, with the workers still up: the mean of the two brackets the ingest phase,
        # so a machine that slows down or speeds up during the run does not bias the ratio
        encoder_after = encoder_rate(encoder, texts, run_settings.ingest_batch_size)
        click.echo(f"bi-encoder alone after ingestion: {encoder_after:.1f} turns/s")
        encoder_tps = (encoder_before + encoder_after) / 2
        latencies, worker = [], []
        for question in tqdm(questions, desc="queries through rq", unit="q", disable=None):
            started = time.perf_counter()
            result = run.client.retrieve(question.conversation_id, question.text, k=10)
            latencies.append(time.perf_counter() - started)
            worker.append(result.stage_seconds)
        fresh, fresh_visible = freshness(run, conversations[0].conversation_id, probes)
    cross = load_reranker(run_settings)
    rerank = rerank_times(conversations, questions, encoder, cross, run_settings.pool_size) if cross else []
    worker_rerank = [w.get("rerank", 0.0) for w in worker]
    outside = [lat - w.get("rerank", 0.0) for lat, w in zip(latencies, worker, strict=True)]
    payload = {
        "command": " ".join(shlex.quote(a) for a in ["mnemos", *sys.argv[1:]]),
        "machine": machine(), "data": str(data), "reranker": reranker,
        "n_turns": len(texts), "n_queries": len(questions), "n_freshness_probes": probes,
        "encoder_turns_per_s": encoder_tps, "encoder_turns_per_s_before": encoder_before,
        "encoder_turns_per_s_after": encoder_after, "encoder_batch": run_settings.ingest_batch_size,
        "encoder_sorted_turns_per_s": sorted_tps, "ingest_turns_per_s": ingest["ingest_turns_per_s"],
        "ingest_share_of_encoder": ingest["ingest_turns_per_s"] / encoder_tps,
        "ingest_share_of_sorted_encoder": ingest["ingest_turns_per_s"] / sorted_tps,
        "query_p50_s": percentile(latencies, 50), "query_p95_s": percentile(latencies, 95),
        "rerank_p50_s": percentile(rerank, 50) if rerank else None,
        "rerank_p95_s": percentile(rerank, 95) if rerank else None,
        "query_overhead_p50": percentile(latencies, 50) / percentile(rerank, 50) - 1 if rerank else None,
        "worker_rerank_p50_s": percentile(worker_rerank, 50),
        "query_overhead_vs_worker_rerank_p50": (percentile(latencies, 50) / percentile(worker_rerank, 50) - 1
                                                if cross and percentile(worker_rerank, 50) > 0 else None),
        "outside_rerank_p50_s": percentile(outside, 50), "outside_rerank_p95_s": percentile(outside, 95),
        "worker_stage_p50_s": {key: percentile([w.get(key, 0.0) for w in worker], 50)
                               for key in sorted({k for w in worker for k in w})},
        "freshness_p50_s": percentile(fresh, 50), "freshness_p95_s": percentile(fresh, 95),
        "freshness_probes_returned": fresh_visible,
        "settings": {"pool_size": run_settings.pool_size, "encoder_batch_size": run_settings.encoder_batch_size,
                     "ingest_batch_size": run_settings.ingest_batch_size, "bi_encoder": run_settings.bi_encoder,
                     "rerank_max_length": run_settings.rerank_max_length,
                     # the deep pass's knobs: bench_settings runs hybrid_rerank's, so never a deep pass (None)
                     "deep_threshold": run_settings.deep_threshold, "deep_pool_size": run_settings.deep_pool_size,
                     # what MNEMOS_RERANK_PRECISION resolved to (the query worker resolves it the same way)
                     "rerank_precision": getattr(getattr(cross, "precision", None), "value", None),
                     # and MNEMOS_ENCODER_PRECISION (None: the fake bi-encoder)
                     "encoder_precision": getattr(getattr(encoder, "precision", None), "value", None)},
    }
    for key in ("encoder_turns_per_s", "encoder_turns_per_s_before", "encoder_turns_per_s_after",
                "encoder_sorted_turns_per_s", "ingest_turns_per_s", "ingest_share_of_encoder",
                "query_p50_s", "query_p95_s", "rerank_p50_s", "worker_rerank_p50_s", "query_overhead_p50",
                "query_overhead_vs_worker_rerank_p50", "outside_rerank_p50_s", "freshness_p50_s", "freshness_p95_s",
                "freshness_probes_returned"):
        click.echo(f"{key}: {payload[key]}")
    if json_path is not None:
        write_json(json_path, payload)
        click.echo(f"wrote {json_path}")
        write_speed_report(json_path, sweep_from, markdown)
    return 0


@click.command("speed")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="LoCoMo JSON (locomo10.json)")
@click.option("--reranker", default=None, help="cross-encoder dir ('fake' for plumbing); default: settings")
@click.option("--limit", type=int, default=None, help="about this many questions")
@click.option("--conversations", "limit_conversations", type=int, default=None, help="first N conversations only")
@click.option("--probes", type=int, default=20, show_default=True, help="freshness probes")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the results here (e.g. bench/results/speed.json)")
@click.option("--sweep-from", "sweep_from", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a `bench quality` JSON whose reranker variants become the rerank_sweep (repeatable)")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write speed.md here (with --json)")
@click.pass_context
def speed(ctx: click.Context, data: Path, reranker: str | None, limit: int | None, limit_conversations: int | None,
          probes: int, json_path: Path | None, sweep_from: tuple[Path, ...], markdown: Path | None) -> None:
    """Ingest, query and freshness speed of the service against the models' own time."""
    settings: Settings = ctx.find_root().obj
    sys.exit(run_speed_bench(settings, data=data, reranker=reranker or settings.cross_encoder, limit=limit,
                             limit_conversations=limit_conversations, probes=probes, json_path=json_path,
                             sweep_from=sweep_from, markdown=markdown))


@click.command("speed-report")
@click.option("--speed", "speed_json", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="a `bench speed` JSON (updated in place with rerank_sweep)")
@click.option("--sweep-from", "sweep_from", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a `bench quality` JSON whose reranker variants become the rerank_sweep (repeatable)")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), required=True)
def speed_report(speed_json: Path, sweep_from: tuple[Path, ...], markdown: Path) -> None:
    """Write speed.md (and the rerank_sweep) from committed results without re-running anything."""
    rows = write_speed_report(speed_json, sweep_from, markdown)
    click.echo(f"wrote {markdown} ({len(rows)} sweep rows)")
