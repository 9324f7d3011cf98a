"""``mnemos bench service`` (what ``make run`` runs): the whole system on LoCoMo, held out, replayed.

Protocol:

1. Services: Redis and Postgres at the configured URLs; when a URL was not configured and nothing
   answers there, embedded ones are started (:mod:`workers.runtime.embedded`) and the run says so. The run
   gets its own database, stream prefix and queue; the ingest, query and suppression workers run as
   processes with the service's settings as they are (reranker, deep pass, suppression, K,
   bootstrap, post-rerank features): only names, ports and timeouts are the run's own.
2. Data: the conversations the reranker never trained on (its ``mnemos_provenance.json``). Each
   one is published turn by turn as two tenants, ``<conversation>.a`` and ``<conversation>.b``.
3. Held-out suppression: the conversation's questions are split in halves A and B by the quality
   bench's seeded split (:func:`bench.common.questions.prepare_questions`). On ``.a`` a burn-in asks half-A
   questions through the queue (drawn with replacement, seeded as the quality bench's per-tenant
   held-out runs, ``burnin_factor`` x the half's size); ``.b`` mirrors it with half B. When the
   suppression worker has applied every burn-in outcome (its group has no lag and nothing
   pending), ``.a`` is asked the labelled half-B questions and ``.b`` the half-A ones, one at a
   time, and scored. The service keeps learning while it is evaluated, so an evaluation question
   sees outcomes of the burn-in and of the evaluation questions asked before it on its tenant,
   never its own; no question is scored by state its own half fed.
4. Freshness: XADD to committed-and-retrievable, probed on the first tenant afterwards
   (:func:`bench.common.harness.freshness`).
5. In-process replay (:mod:`bench.service.replay`): the same requests through :func:`mnemos.pipeline.retrieve`
   on tenants built by :func:`bench.common.corpora.build_tenants` from the embeddings the ingest worker
   stored for each tenant (:func:`bench.service.mainjob_replay.stored_vectors`), each at the suppression state version
   the service recorded, with the cross-encoder logits of the service's outcomes; NDCG@10 must be
   equal on every question. A seeded sample of those logits is recomputed with the real model.

Headline metrics are over LoCoMo categories 1-4; category 5 is reported apart
(:mod:`bench.service.report`). Relevance is alias-aware.
"""

from __future__ import annotations

import logging
import shlex
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click
import numpy as np
import redis

from api.schemas import Outcome as OutcomeMessage
from bench.common.datasets import Conversation, DatasetError
from bench.common.fetch import DataFetchError, locate_locomo
from bench.common.harness import (
    ServiceRun,
    freshness,
    group_caught_up,
    isolated_settings,
    publish_tenants,
    run_stamp,
    running_service,
)
from bench.common.paths import display_path
from bench.common.questions import BenchQuestion, prepare_questions, stable_seed
from bench.service.mainjob_replay import replay_in_process
from bench.service.records import Asked, ServiceRecord, TenantPlan, progress_bar
from workers.runtime.embedded import EmbeddedServices
from workers.runtime.errors import EmbeddedServicesError, ModelSetupError
from workers.runtime.models import cross_encoder_location, reranker_provenance
from workers.settings import Settings, quiet_model_loading
from workers.suppression.worker import GROUP as SUPPRESSION_GROUP

log = logging.getLogger(__name__)

TENANT_SUFFIXES = (".a", ".b")
"""Tenant ``<conversation>.a`` burns in half A and is evaluated on half B; ``.b`` the other way round."""


# the plan ---------------------------------------------------------------------------------------

def heldout_plan(conversations: Sequence[Conversation], questions: Sequence[BenchQuestion], *,
                 burnin_factor: float, seed: int) -> list[TenantPlan]:
    """Two tenants per conversation (``.a`` burns in half A, evaluates half B; ``.b`` mirrors it).

    Burn-in draws are with replacement from every question of the half (labelled or not),
    ``round(burnin_factor x half size)`` of them, from the quality bench's seed for the per-tenant
    held-out run of that half; evaluation asks the labelled questions of the other half.
    """
    plans = []
    for conversation in conversations:
        members = [q for q in questions if q.conversation_id == conversation.conversation_id]
        halves = [[q for q in members if q.half == h] for h in (0, 1)]
        for half, suffix in enumerate(TENANT_SUFFIXES):
            burn = halves[half]
            rng = np.random.default_rng(stable_seed(seed, "burn", "per_tenant", "heldout",
                                                    conversation.conversation_id, half))
            steps = round(burnin_factor * len(burn)) if burn else 0
            draws = tuple(burn[int(rng.integers(len(burn)))] for _ in range(steps))
            evaluate = tuple(q for q in halves[1 - half] if q.labelled)
            plans.append(TenantPlan(conversation.conversation_id + suffix, conversation, half, draws, evaluate))
    return plans


# asking ------------------------------------------------------------------------------------------

def ask(run: ServiceRun, plans: Sequence[TenantPlan], phase: str, collector: OutcomeCollector,
        k: int = 10) -> list[Asked]:
    """Ask every plan's burn-in draws or evaluation questions through rq, one at a time, with a bar
    showing the running median latency."""
    work = [(p.tenant_id, q) for p in plans for q in (p.burn_in if phase == "burn-in" else p.evaluate)]
    asked: list[Asked] = []
    latencies: list[float] = []
    with progress_bar(len(work), phase, "q") as bar:
        for number, (tenant_id, question) in enumerate(work, start=1):
            started = time.perf_counter()
            result = run.client.retrieve(tenant_id, question.text, k=k)
            latencies.append(time.perf_counter() - started)
            asked.append(Asked(tenant_id, question, phase, latencies[-1], result))
            if number % 25 == 0 or number == len(work):
                bar.set_postfix_str(f"p50 {1000 * statistics.median(latencies):.0f} ms", refresh=False)
                collector.drain()
            bar.update(1)
    return asked


class OutcomeCollector:
    """Reads every outcome of the run through a consumer group of its own on the outcomes stream.

    The group is created at the stream's start before the first question, so the workers' trimming
    (never below what every group acknowledged) keeps each outcome until it was read here.
    """

    GROUP = "bench-replay"

    def __init__(self, connection: redis.Redis, stream: str) -> None:
        self.connection = connection
        self.stream = stream
        self.outcomes: dict[str, OutcomeMessage] = {}
        try:
            connection.xgroup_create(stream, self.GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def drain(self) -> int:
        """Read and acknowledge everything new (no blocking); returns how many outcomes were read."""
        read = 0
        while True:
            batches = self.connection.xreadgroup(self.GROUP, "bench", {self.stream: ">"}, count=500)
            entries = [entry for _stream, items in batches or [] for entry in items]
            if not entries:
                return read
            for _raw_id, fields in entries:
                message = OutcomeMessage.from_stream_fields(fields)
                self.outcomes[message.outcome_id] = message
            self.connection.xack(self.stream, self.GROUP, *[raw_id for raw_id, _ in entries])
            read += len(entries)


# the run -----------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_counter(port: int, name: str) -> float | None:
    """The value of counter ``name`` (without ``_total``) on a worker's /metrics; None if unreachable."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode("utf-8")
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name == name + "_total")
    return None


def run_service_phases(settings: Settings, plans: list[TenantPlan], *, probes: int, keep: bool) -> ServiceRecord:
    """Ingest, burn-in, suppression catch-up, evaluation and freshness through the worker processes."""
    phases: dict[str, float] = {}
    clock = time.monotonic()
    with running_service(settings, keep=keep, log_level="WARNING") as run:
        phases["start workers"] = time.monotonic() - clock
        collector = OutcomeCollector(run.connection, settings.outcomes_stream)
        clock = time.monotonic()
        total = sum(len(p.conversation.turns) for p in plans)
        with progress_bar(total, "ingest", "turn") as bar:
            ingest = publish_tenants(run, [(p.tenant_id, p.conversation) for p in plans], progress=bar.update)
        phases["ingest"] = time.monotonic() - clock
        clock = time.monotonic()
        asked = ask(run, plans, "burn-in", collector)
        phases["burn-in"] = time.monotonic() - clock
        clock = time.monotonic()
        _wait_for_suppression(run)
        phases["suppression catch-up"] = time.monotonic() - clock
        before = {p.tenant_id: run.suppression_state(p.tenant_id) for p in plans}
        clock = time.monotonic()
        asked += ask(run, plans, "evaluation", collector)
        phases["evaluation"] = time.monotonic() - clock
        _wait_for_suppression(run)
        collector.drain()
        ledgers = {p.tenant_id: [o for o, _c, _v in run.ledger(p.tenant_id)] for p in plans}
        entry_turns = {p.tenant_id: run.entry_turns(p.tenant_id) for p in plans}
        canonical = {p.tenant_id: run.canonical_map(p.tenant_id) for p in plans}
        embeddings = {p.tenant_id: run.turn_embeddings(p.tenant_id) for p in plans}
        after = {p.tenant_id: run.suppression_state(p.tenant_id) for p in plans}
        clock = time.monotonic()
        fresh, returned = freshness(run, plans[0].tenant_id, probes) if probes else ([], 0)
        phases["freshness"] = time.monotonic() - clock
        hits = scrape_counter(settings.query_metrics_port, "mnemos_query_rerank_cache_hits")
    tenants = [{"tenant_id": p.tenant_id, "conversation": p.conversation.conversation_id,
                "burn_in_half": "AB"[p.burn_half], "evaluated_half": "AB"[1 - p.burn_half],
                "burn_in_queries": len(p.burn_in), "distinct_burn_in_questions": len({q.key for q in p.burn_in}),
                "evaluated_questions": len(p.evaluate),
                "bootstrapped_before_evaluation": before[p.tenant_id]["centroids"] is not None,
                "clusters": None if after[p.tenant_id]["centroids"] is None else len(after[p.tenant_id]["centroids"]),
                "outcomes_applied_before_evaluation": before[p.tenant_id]["suppression_version"],
                "outcomes_applied": after[p.tenant_id]["suppression_version"],
                "suppression_scores_before_evaluation": before[p.tenant_id]["scores"]} for p in plans]
    centroids = {p.tenant_id: after[p.tenant_id]["centroids"] for p in plans}
    return ServiceRecord(settings, plans, asked, collector.outcomes, ledgers, entry_turns, canonical, embeddings,
                         tenants, centroids, ingest, fresh, returned, hits, phases)


def _wait_for_suppression(run: ServiceRun, timeout_s: float = 600.0) -> None:
    started = time.monotonic()
    while not group_caught_up(run.connection, run.settings.outcomes_stream, SUPPRESSION_GROUP):
        if time.monotonic() - started > timeout_s:
            raise click.ClickException(f"the suppression worker did not catch up within {timeout_s:.0f}s")
        time.sleep(0.05)


def main_job_settings(base: Settings, *, reranker: str, stamp: str) -> Settings:
    """The service's own settings with the run's database, prefix, queue and free metrics ports."""
    return isolated_settings(base, stamp=stamp, cross_encoder=reranker, metrics_enabled=True,
                             ingest_metrics_port=free_port(), query_metrics_port=free_port(),
                             suppression_metrics_port=free_port())


# the replay --------------------------------------------------------------------------------------

def run_main_job(settings: Settings, *, data: Path | None, reranker: str | None, limit: int | None,
                 limit_conversations: int | None, burnin_factor: float, seed: int, probes: int, sample_pairs: int,
                 json_path: Path | None, plot_path: Path | None, keep: bool,
                 echo: Callable[[str], None] = click.echo) -> int:
    """The main job; returns 0 when the in-process replay matched the service on every question,
    1 when it did not, 2 when the run could not start (no reranker, no data, no services)."""
    from bench.common.harness import evaluated_conversations
    from bench.service.report import build_report, write_outputs

    started = time.monotonic()
    quiet_model_loading()
    reranker = reranker if reranker is not None else settings.cross_encoder
    if reranker is None:
        echo("error: the main job needs a reranker (MNEMOS_CROSS_ENCODER is none); give --reranker DIR")
        return 2
    embedded = EmbeddedServices(settings)  # referenced to the end: its servers stop when it is collected
    try:
        location = cross_encoder_location(settings.replace(cross_encoder=reranker))
        data_path = locate_locomo(data, Path(settings.data_dir), echo=echo)
        conversations, trained = evaluated_conversations(data_path, reranker, limit_conversations, False)
        base = embedded.start()
    except (ModelSetupError, EmbeddedServicesError, DatasetError) as exc:
        hint = "; give the file with --data (make run DATA=...)" if isinstance(exc, DataFetchError) else ""
        echo(f"error: {exc}{hint}")
        return 2
    for line in embedded.started:
        echo(line)
    stamp = run_stamp()
    run_settings = main_job_settings(base, reranker=reranker, stamp=stamp)
    questions = prepare_questions(conversations, seed=seed, limit=limit)
    plans = heldout_plan(conversations, questions, burnin_factor=burnin_factor, seed=seed)
    echo(f"reranker: {reranker} ({location}); trained on {_trained_summary(location, trained)}")
    echo(f"evaluating {len(conversations)} conversations it never trained on "
         f"({', '.join(c.conversation_id for c in conversations)}): {sum(len(p.evaluate) for p in plans)} questions, "
         f"{sum(len(c.turns) for c in conversations)} turns published twice (tenants .a and .b), "
         f"{sum(len(p.burn_in) for p in plans)} burn-in queries")
    setup_s = time.monotonic() - started
    record = run_service_phases(run_settings, plans, probes=probes, keep=keep)
    record.phases_s = {"setup": setup_s, **record.phases_s}
    clock = time.monotonic()
    replay = replay_in_process(record, sample_pairs=sample_pairs, seed=seed)
    record.phases_s["in-process replay"] = time.monotonic() - clock
    report = build_report(record, replay, data_path=data_path,
                          reranker={"name": reranker, "path": _shown(location), "provenance": reranker_provenance(location)},
                          trained=trained, burnin_factor=burnin_factor, seed=seed,
                          command=" ".join(shlex.quote(a) for a in ["mnemos", *sys.argv[1:]]), started=started)
    json_path = json_path or Path(settings.embedded_dir) / "results" / f"service-{stamp}.json"
    plot_path = plot_path or json_path.with_suffix(".png")
    write_outputs(report, json_path, plot_path, echo=echo)
    return 0 if report.payload["per_question_check"]["passed"] else 1


def _shown(location: str | None) -> str | None:
    """A reranker location as results record it: a directory relative to the working directory
    (else its last two parts, :func:`bench.common.paths.display_path`), a name or ``fake`` as given."""
    return display_path(Path(location)) if location is not None and Path(location).is_dir() else location


@click.command("service")
@click.option("--data", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="LoCoMo JSON; default: ../shared/data/locomo/locomo10.json if present, else the cached "
                   "download, else download it (mnemos data fetch locomo)")
@click.option("--reranker", default=None, help="cross-encoder: 'shipped', a dir, 'fake'; default: MNEMOS_CROSS_ENCODER")
@click.option("--limit", type=click.IntRange(min=2), default=None,
              help="about this many questions, spread over the conversations (a quick sample)")
@click.option("--conversations", "limit_conversations", type=click.IntRange(min=1), default=None,
              help="only the first N evaluated conversations")
@click.option("--burnin-factor", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="burn-in draws per question of the burn-in half (as mnemos bench quality)")
@click.option("--seed", type=int, default=0, show_default=True, help="question split and burn-in draws")
@click.option("--probes", type=click.IntRange(min=0), default=20, show_default=True, help="freshness probes")
@click.option("--sample-pairs", type=click.IntRange(min=0), default=200, show_default=True,
              help="service logits recomputed with the real model")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="results JSON (default .mnemos/results/service-<stamp>.json; committed: bench/results/service.json)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG of NDCG@10 per LoCoMo category (default: the JSON path with .png)")
@click.option("--keep", is_flag=True, help="keep the run's database and streams")
@click.pass_context
def service(ctx: click.Context, data: Path | None, reranker: str | None, limit: int | None,
            limit_conversations: int | None, burnin_factor: float, seed: int, probes: int, sample_pairs: int,
            json_path: Path | None, plot_path: Path | None, keep: bool) -> None:
    """The main job: LoCoMo through the whole service (held-out suppression), replayed in process."""
    settings: Settings = ctx.find_root().obj
    sys.exit(run_main_job(settings, data=data, reranker=reranker, limit=limit, limit_conversations=limit_conversations,
                          burnin_factor=burnin_factor, seed=seed, probes=probes, sample_pairs=sample_pairs,
                          json_path=json_path, plot_path=plot_path, keep=keep))


def _trained_summary(location: str | None, trained: Sequence[str]) -> str:
    """What the reranker learned from, in one short line: each training source of its provenance
    with its licence and item count, or the item ids themselves when no source is recorded."""
    from workers.runtime.model_licences import training_sources
    from workers.runtime.models import reranker_provenance

    sources = training_sources(reranker_provenance(location) or {})
    if sources:
        return "; ".join(f"{s.name} ({s.licence}), {s.n_items} items" for s in sources)
    return ", ".join(trained) or "nothing listed"

