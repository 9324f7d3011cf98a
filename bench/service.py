"""``mnemos bench service``: LoCoMo through the real service, scored against the in-process pipeline.

Protocol:

1. A fresh database ``mnemos_bench_<stamp>`` and stream prefix; the ingest, query and suppression
   workers run as separate processes (``python -m workers worker ...``) with the bundled
   bi-encoder and the given cross-encoder, suppression off and no deep pass, so the service runs
   exactly the ``hybrid_rerank`` arm of ``mnemos bench quality`` (BM25 + dense, RRF, pool 30,
   cross-encoder).
2. Every turn of the evaluated conversations is published turn by turn to the stream, one
   tenant per conversation; ingest throughput is turns over the seconds from the first XADD to
   the last commit.
3. Every question is asked through the rq queue, one at a time; latency is the client's wall
   time. The share of time outside the models is ``1 - (query embedding + rerank seconds) /
   end-to-end seconds``, with model seconds as measured inside the worker.
4. The same questions run in-process (:func:`mnemos.pipeline.retrieve`, ``hybrid_rerank``
   config, tenants built by :func:`bench.corpora.build_tenants`) with the same cross-encoder;
   NDCG@10 / Recall@10 of both are reported side by side with the largest per-question gap.

A reranker trained on some conversations (its ``mnemos_provenance.json``) is only evaluated on
the others. Relevance is alias-aware: a gold turn folded into a canonical entry by dedupe counts
when that entry is retrieved.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
import psycopg
import redis
from psycopg import sql
from rq import Worker

from api.client import MnemosClient
from api.schemas import RetrievalResult
from bench.datasets import Conversation, load_locomo
from bench.datasets import Turn as DatasetTurn
from mnemos.evaluation import ndcg_at_k, recall_at_k
from workers.ingest import GROUP as INGEST_GROUP
from workers.ingest import limits_of
from workers.migrate import ensure_database, run_migrations
from workers.queue_cleanup import delete_queue
from workers.settings import FAKE_MODEL, Settings
from workers.store import Store
from workers.supervisor import WORKER_KINDS, spawn_workers, stop_workers

log = logging.getLogger(__name__)

PROVENANCE_FILE = "mnemos_provenance.json"
DEFAULT_RERANK_CACHE = Path.home() / ".cache" / "mnemos" / "bench" / "rerank_scores.sqlite"


# a running service ------------------------------------------------------------------------------

@dataclass
class ServiceRun:
    """A benchmark's own service: settings, client, store and worker processes."""

    settings: Settings
    client: MnemosClient
    store: Store
    connection: redis.Redis
    children: list = field(default_factory=list)

    def stored(self, tenant_id: str) -> int:
        with self.store.tenant_tx(tenant_id) as conn:
            return int(conn.execute("SELECT count(*) FROM entries WHERE tenant_id = %s", (tenant_id,)).fetchone()[0])

    def canonical_map(self, tenant_id: str) -> dict[str, str]:
        """``{turn_id: canonical turn_id}`` of a tenant, from Postgres."""
        with self.store.tenant_tx(tenant_id) as conn:
            rows = conn.execute(
                "SELECT e.turn_id, coalesce(c.turn_id, e.turn_id) FROM entries e"
                " LEFT JOIN entries c ON c.entry_id = e.canonical_entry_id WHERE e.tenant_id = %s",
                (tenant_id,)).fetchall()
        return dict(rows)


def bench_settings(base: Settings, *, reranker: str | None, stamp: str) -> Settings:
    """The service settings of one benchmark run: own database and prefix, hybrid_rerank knobs."""
    url = psycopg.conninfo.make_conninfo(base.database_url, dbname=f"mnemos_bench_{stamp}")
    return base.replace(
        database_url=url, stream_prefix=f"mnemos_bench_{stamp}", queue_name=f"mnemos_bench_{stamp}_retrievals",
        cross_encoder=reranker, suppression=False, deep_threshold=None, metrics_enabled=False,
        retrieve_timeout_s=max(base.retrieve_timeout_s, 120.0), job_timeout_s=max(base.job_timeout_s, 120),
        claim_idle_ms=max(base.claim_idle_ms, 120_000))


def run_stamp() -> str:
    """A run's name part: the time to the second plus a random token (two runs never share a database)."""
    return f"{time.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:6]}"


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.2) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise click.ClickException(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic()


@contextmanager
def running_service(settings: Settings, kinds: Sequence[str] = WORKER_KINDS, *, keep: bool = False,
                    ready_timeout_s: float = 300.0) -> Iterator[ServiceRun]:
    """Create and migrate the run's database, start the workers, wait until they listen."""
    ensure_database(settings.database_url)
    run_migrations(settings.database_url)
    from workers.connections import redis_client  # the workers' socket timeout and TLS settings

    connection = redis_client(settings)
    client = MnemosClient(connection, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                          limits=limits_of(settings), retrieve_timeout_s=settings.retrieve_timeout_s,
                          job_timeout_s=settings.job_timeout_s, result_ttl_s=settings.result_ttl_s)
    children = spawn_workers(settings, tuple(kinds))
    store = Store(settings.database_url, settings.db_app_role).open()
    run = ServiceRun(settings, client, store, connection, children)
    try:
        if "ingest" in kinds:
            _wait(lambda: _has_consumer(connection, settings.turns_stream, INGEST_GROUP), ready_timeout_s,
                  "the ingest worker")
        if "query" in kinds:
            _wait(lambda: bool(Worker.all(queue=client.queue)), ready_timeout_s, "the query worker")
        yield run
    finally:
        stop_workers(children)
        store.close()
        keys = list(connection.scan_iter(match=f"{settings.stream_prefix}*"))
        if keys and not keep:
            connection.delete(*keys)
        if not keep:
            delete_queue(connection, settings.queue_name)
        if not keep:
            _drop_database(settings.database_url)


def _has_consumer(connection: redis.Redis, stream: str, group: str) -> bool:
    try:
        return bool(connection.xinfo_consumers(stream, group))
    except redis.ResponseError:
        return False


def _group_caught_up(connection: redis.Redis, stream: str, group: str) -> bool:
    """True when ``group`` has been delivered the stream's last entry and acknowledged everything."""
    try:
        last = connection.xinfo_stream(stream)["last-generated-id"]
        groups = {g["name"]: g for g in connection.xinfo_groups(stream)}
    except redis.ResponseError:
        return False
    info = groups.get(group.encode()) or groups.get(group)
    return info is not None and info["pending"] == 0 and info["last-delivered-id"] == last


def _drop_database(url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def turn_message(tenant_id: str, turn: DatasetTurn) -> dict[str, Any]:
    """The published form of a dataset turn; an image caption travels as ``metadata.image_caption``."""
    message = {"tenant_id": tenant_id, "session_id": turn.session_id, "turn_id": turn.turn_id, "role": turn.role,
               "text": turn.text, "occurred_at": turn.occurred_at.isoformat()}
    if turn.image_caption:
        message["metadata"] = {"image_caption": turn.image_caption}
    return message


def publish_conversations(run: ServiceRun, conversations: Sequence[Conversation],
                          timeout_s: float = 3600.0) -> dict[str, float]:
    """Publish every turn (tenant = conversation id), wait until all are stored; returns timings."""
    turns = [turn_message(c.conversation_id, t) for c in conversations for t in c.turns]
    expected = {c.conversation_id: len(c.turns) for c in conversations}
    started = time.monotonic()
    for turn in turns:  # turn by turn, as an agent would
        run.client.publish_turn(turn)
    published = time.monotonic()
    # every turn is acknowledged only after its commit: one cheap Redis call per poll, not a count per tenant
    done = _wait(lambda: _group_caught_up(run.connection, run.settings.turns_stream, INGEST_GROUP), timeout_s,
                 "ingestion", 0.05)
    seconds = done - started
    stored = {t: run.stored(t) for t in expected}
    short = {t: (stored[t], n) for t, n in expected.items() if stored[t] < n}
    if short:
        raise click.ClickException(f"ingestion acknowledged every turn but stored fewer: {short} (see dead letters)")
    return {"turns": len(turns), "publish_seconds": published - started, "ingest_seconds": seconds,
            "ingest_turns_per_s": len(turns) / seconds if seconds > 0 else float("nan")}


# questions ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Asked:
    """One question as the service answered it."""

    key: str
    conversation_id: str
    latency_s: float
    result: RetrievalResult


def ask_questions(run: ServiceRun, questions: Sequence[Any], k: int = 30) -> list[Asked]:
    """Ask each question through rq, one at a time (``questions`` are ``bench.engine.BenchQuestion``)."""
    asked = []
    for number, question in enumerate(questions, start=1):
        started = time.perf_counter()
        result = run.client.retrieve(question.conversation_id, question.text, k=k)
        asked.append(Asked(question.key, question.conversation_id, time.perf_counter() - started, result))
        if number % 50 == 0:
            log.info("asked %d/%d questions", number, len(questions))
    return asked


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def evaluated_conversations(data: Path, reranker: str | None, limit_conversations: int | None,
                            all_conversations: bool) -> tuple[list[Conversation], list[str]]:
    """LoCoMo conversations to evaluate: those the reranker was not trained on (unless overridden)."""
    conversations = load_locomo(data)
    trained: list[str] = []
    if reranker and reranker != FAKE_MODEL and (Path(reranker) / PROVENANCE_FILE).is_file():
        provenance = json.loads((Path(reranker) / PROVENANCE_FILE).read_text(encoding="utf-8"))
        trained = list(provenance.get("training_conversations") or [])
    if not all_conversations:
        conversations = [c for c in conversations if c.conversation_id not in set(trained)]
    if limit_conversations is not None:
        conversations = conversations[:limit_conversations]
    if not conversations:
        raise click.ClickException("no conversation left to evaluate (all were used to train the reranker?)")
    return conversations, trained


def load_models(settings: Settings):
    """The bi-encoder and cross-encoder of ``settings`` for the in-process comparison."""
    from workers.models import load_encoder, load_reranker

    encoder = load_encoder(settings)
    reranker = load_reranker(settings)
    name = settings.cross_encoder
    if reranker is not None and name not in (None, FAKE_MODEL) and Path(name).is_dir():
        from bench.caches import PersistentReranker, model_identity

        inner = reranker
        reranker = PersistentReranker(model_identity(name), DEFAULT_RERANK_CACHE, load=lambda: inner)
    return encoder, reranker


def in_process_rankings(conversations: Sequence[Conversation], questions: Sequence[Any], encoder, reranker,
                        k: int = 30) -> dict[str, tuple[list[int], frozenset[int]]]:
    """``{question key: (ranked canonical entry ids, relevant canonical entry ids)}`` of hybrid_rerank."""
    from bench.arms import BASELINE_ARM, arm_by_name
    from bench.corpora import CorpusMode, build_tenants, rendered_texts
    from mnemos.pipeline import retrieve

    texts = rendered_texts([t for c in conversations for t in c.turns])
    tenants = build_tenants(conversations, encoder.encode(texts), CorpusMode.PER_TENANT, dim=encoder.dim)
    config = arm_by_name(BASELINE_ARM).config
    out = {}
    for question in questions:
        tenant = tenants[question.conversation_id]
        vector = encoder.encode([question.text])[0]
        result = retrieve(tenant.index, question.text, vector, k=k, config=config, reranker=reranker)
        out[question.key] = ([h.entry_id for h in result.hits], tenant.relevant_entries(question.relevant_turns))
    return out


def service_rankings(run: ServiceRun, asked: Sequence[Asked], questions: Sequence[Any]
                     ) -> dict[str, tuple[list[str], frozenset[str]]]:
    """``{question key: (ranked canonical turn ids, relevant canonical turn ids)}`` from the service."""
    maps = {c: run.canonical_map(c) for c in {a.conversation_id for a in asked}}
    by_key = {q.key: q for q in questions}
    out = {}
    for item in asked:
        canonical = maps[item.conversation_id]
        local = [t.split("/", 1)[1] for t in by_key[item.key].relevant_turns]
        relevant = frozenset(canonical[t] for t in local if t in canonical)
        out[item.key] = ([h.turn_id for h in item.result.hits], relevant)
    return out


def mean_metrics(rankings: dict[str, tuple[list, frozenset]]) -> dict[str, float]:
    ndcg = [ndcg_at_k(r, rel, 10) for r, rel in rankings.values()]
    recall = [recall_at_k(r, rel, 10) for r, rel in rankings.values()]
    return {"ndcg@10": statistics.fmean(ndcg) if ndcg else float("nan"),
            "recall@10": statistics.fmean(recall) if recall else float("nan")}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")


@dataclass
class FoldRun:
    """The service and in-process rankings of one reranker on the conversations it was not trained on."""

    reranker: str | None
    trained: list[str]
    conversations: list[str]
    service: dict[str, tuple[list, frozenset]]
    local: dict[str, tuple[list, frozenset]]
    latencies: list[float]
    model_seconds: float
    ingest: dict[str, float]


def run_fold(settings: Settings, *, data: Path, reranker: str | None, limit: int | None,
             limit_conversations: int | None, all_conversations: bool, keep: bool, stamp: str) -> FoldRun:
    from bench.engine import prepare_questions

    run_settings = bench_settings(settings, reranker=reranker, stamp=stamp)
    conversations, trained = evaluated_conversations(data, reranker, limit_conversations, all_conversations)
    questions = prepare_questions(conversations, limit=limit)
    click.echo(f"{len(conversations)} conversations, {sum(len(c.turns) for c in conversations)} turns, "
               f"{len(questions)} questions; reranker {reranker} (trained on {trained or 'nothing listed'})")
    with running_service(run_settings, keep=keep) as run:
        ingest = publish_conversations(run, conversations)
        click.echo(f"ingested {ingest['turns']} turns in {ingest['ingest_seconds']:.1f}s "
                   f"({ingest['ingest_turns_per_s']:.1f} turns/s)")
        asked = ask_questions(run, questions)
        service = service_rankings(run, asked, questions)
    encoder, in_reranker = load_models(run_settings)
    local = in_process_rankings(conversations, questions, encoder, in_reranker)
    model_s = sum(a.result.stage_seconds.get("encode", 0.0) + a.result.stage_seconds.get("rerank", 0.0)
                  for a in asked)
    return FoldRun(reranker, trained, [c.conversation_id for c in conversations], service, local,
                   [a.latency_s for a in asked], model_s, ingest)


def run_service_bench(settings: Settings, *, data: Path, rerankers: Sequence[str | None], limit: int | None,
                      limit_conversations: int | None, all_conversations: bool, json_path: Path | None,
                      keep: bool) -> int:
    """One service run per reranker (each on the conversations it was not trained on), pooled."""
    stamp = run_stamp()
    folds = [run_fold(settings, data=data, reranker=r, limit=limit, limit_conversations=limit_conversations,
                      all_conversations=all_conversations, keep=keep, stamp=f"{stamp}_{i}")
             for i, r in enumerate(rerankers)]
    service = {f"{i}:{k}": v for i, f in enumerate(folds) for k, v in f.service.items()}
    local = {f"{i}:{k}": v for i, f in enumerate(folds) for k, v in f.local.items()}
    latencies = [x for f in folds for x in f.latencies]
    gaps = [abs(ndcg_at_k(*service[key], 10) - ndcg_at_k(*local[key], 10)) for key in service]
    turns = sum(f.ingest["turns"] for f in folds)
    ingest_s = sum(f.ingest["ingest_seconds"] for f in folds)
    payload = {
        "command": " ".join(shlex.quote(a) for a in ["mnemos", *sys.argv[1:]]),
        "machine": machine(), "data": str(data),
        "n_questions": len(service), **mean_metrics(service),
        "in_process_hybrid_rerank": {"n_questions": len(local), **mean_metrics(local)},
        "max_abs_ndcg@10_gap_per_question": max(gaps) if gaps else 0.0,
        "questions_with_different_ndcg@10": sum(g > 1e-9 for g in gaps),
        "turns": turns, "ingest_seconds": ingest_s, "ingest_turns_per_s": turns / ingest_s if ingest_s else None,
        "query_p50_s": percentile(latencies, 50), "query_p95_s": percentile(latencies, 95),
        "share_outside_models": 1.0 - sum(f.model_seconds for f in folds) / sum(latencies) if latencies else None,
        "folds": [{"reranker": f.reranker, "training_conversations": f.trained, "conversations": f.conversations,
                   "n_questions": len(f.service), **mean_metrics(f.service),
                   "in_process_hybrid_rerank": mean_metrics(f.local), **f.ingest,
                   "query_p50_s": percentile(f.latencies, 50), "query_p95_s": percentile(f.latencies, 95)}
                  for f in folds],
        "settings": {"pool_size": settings.pool_size, "n_candidates": settings.n_candidates, "suppression": False,
                     "deep_threshold": None, "bi_encoder": settings.bi_encoder},
    }
    click.echo(json.dumps({k: payload[k] for k in ("n_questions", "ndcg@10", "recall@10", "in_process_hybrid_rerank",
                                                    "max_abs_ndcg@10_gap_per_question", "ingest_turns_per_s",
                                                    "query_p50_s", "query_p95_s", "share_outside_models")}, indent=2))
    if json_path is not None:
        write_json(json_path, payload)
        click.echo(f"wrote {json_path}")
    return 0


@click.command("service")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="LoCoMo JSON (locomo10.json)")
@click.option("--reranker", "rerankers", multiple=True,
              help="cross-encoder dir ('fake' for plumbing); repeat per fold; default: settings")
@click.option("--limit", type=int, default=None, help="about this many questions per fold, spread over conversations")
@click.option("--conversations", "limit_conversations", type=int, default=None, help="first N conversations only")
@click.option("--all-conversations", is_flag=True, help="also evaluate conversations the reranker was trained on")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the results here (e.g. bench/results/service.json)")
@click.option("--keep", is_flag=True, help="keep the runs' databases and streams")
@click.pass_context
def service(ctx: click.Context, data: Path, rerankers: tuple[str, ...], limit: int | None,
            limit_conversations: int | None, all_conversations: bool, json_path: Path | None, keep: bool) -> None:
    """LoCoMo through the running service vs the in-process hybrid_rerank numbers."""
    settings: Settings = ctx.find_root().obj
    chosen: list[str | None] = list(rerankers) or [settings.cross_encoder]
    sys.exit(run_service_bench(settings, data=data, rerankers=chosen, limit=limit,
                               limit_conversations=limit_conversations, all_conversations=all_conversations,
                               json_path=json_path, keep=keep))
