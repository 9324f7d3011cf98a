"""What ``mnemos bench scale`` (:mod:`bench.scale.run`) reads from the worker processes it starts.

* :class:`WorkerMetrics`: the Prometheus text of one worker's ``/metrics`` (the bench gives every
  worker a free port of its own), read after each request. A query worker answers one job at a
  time, so the change of ``mnemos_query_tenant_cache_hits_total`` / ``_misses_total`` across one
  request says whether that request found its tenant's index cached; the gauge
  ``mnemos_query_tenant_cache_bytes`` is the estimate the cache sizes its budget with
  (``TenantIndex.memory_bytes``, docs/scaling.md).
* :func:`memory_of`: the resident set (``VmRSS``) and its peak (``VmHWM``) of a process, in bytes,
  from ``/proc`` (None where there is no ``/proc``).
* :func:`start_query_worker`: a fresh query worker process, and the seconds from spawning it until
  it takes jobs (models loaded and warmed up).
* :func:`served_by`: the shard whose query worker ran a retrieval, from the rq job's ``worker_name``.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import click
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from api.client import job_id_for
from bench.common.harness import ServiceRun
from workers.launch.supervisor import spawn_workers
from workers.settings import Settings

CACHE_HITS = "mnemos_query_tenant_cache_hits_total"
CACHE_MISSES = "mnemos_query_tenant_cache_misses_total"
CACHE_EVICTIONS = "mnemos_query_tenant_cache_evictions_total"
CACHE_BYTES = "mnemos_query_tenant_cache_bytes"
CACHE_TENANTS = "mnemos_query_tenant_cache_tenants"
JOBS_OK = 'mnemos_query_jobs_total{status="ok"}'
TURNS_INDEXED = "mnemos_ingest_turns_indexed_total"  # stored as canonical entries
ALIASES = "mnemos_ingest_duplicates_total"  # stored as aliases of a near-duplicate (docs/architecture.md "Dedupe")


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def with_free_ports(settings: Settings) -> Settings:
    """``settings`` with metrics served, each worker kind on a free port of its own."""
    return settings.replace(metrics_enabled=True, ingest_metrics_port=free_port(), query_metrics_port=free_port(),
                            suppression_metrics_port=free_port())


def scrape(port: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The samples of ``http://127.0.0.1:<port>/metrics``: ``{name: value}``, a labelled sample as
    ``name{label="value",...}`` (labels sorted). Raises ClickException when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
            text = response.read().decode("utf-8")
    except OSError as exc:
        raise click.ClickException(f"no metrics on port {port}: {exc}") from exc
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return samples


@dataclass
class WorkerMetrics:
    """One worker's metrics endpoint; :meth:`delta` gives what changed since the previous call."""

    port: int
    last: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.last = scrape(self.port)

    def delta(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(changes of every sample since the last call, the samples now)``."""
        now = scrape(self.port)
        changes = {name: value - self.last.get(name, 0.0) for name, value in now.items()}
        self.last = now
        return changes, now


def memory_of(pid: int) -> dict[str, int] | None:
    """``{"rss_bytes", "peak_rss_bytes"}`` of process ``pid`` (``VmRSS``, ``VmHWM``), or None without ``/proc``."""
    status = Path(f"/proc/{pid}/status")
    try:
        lines = status.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    values = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024  # kB
    if len(values) < 2:
        return None
    return {"rss_bytes": values["VmRSS"], "peak_rss_bytes": values["VmHWM"]}


@dataclass
class QueryProcess:
    """A query worker process the bench started, its metrics and how long it took to take jobs."""

    process: subprocess.Popen[bytes]
    metrics: WorkerMetrics
    start_s: float


def start_query_worker(run: ServiceRun, settings: Settings, timeout_s: float = 300.0) -> QueryProcess:
    """Spawn a query worker with ``settings`` (metrics on), wait until rq lists it on its queue.

    The process joins ``run.children`` (stopped when the run ends). Raises ClickException when it
    exits or is not listening within ``timeout_s``.
    """
    started = time.monotonic()
    (process,) = spawn_workers(settings, ("query",))
    run.children.append(process)
    queue = Queue(settings.retrieval_queue, connection=run.connection, serializer=JSONSerializer)
    while not any(w.pid == process.pid for w in Worker.all(queue=queue)):
        if process.poll() is not None:
            raise click.ClickException(f"the query worker exited with code {process.returncode}")
        if time.monotonic() - started > timeout_s:
            raise click.ClickException(f"the query worker did not start within {timeout_s:.0f}s")
        time.sleep(0.1)
    return QueryProcess(process, WorkerMetrics(settings.query_metrics_port), time.monotonic() - started)


def query_worker_shards(run: ServiceRun) -> dict[str, int]:
    """``{rq worker name: shard}`` of every query worker listening on one of the client's queues."""
    return {worker.name: shard for shard, queue in enumerate(run.client.queues) for worker in Worker.all(queue=queue)}


def served_by(run: ServiceRun, tenant_id: str, request_id: str, shards: dict[str, int]) -> int | None:
    """The shard of the query worker that ran ``request_id`` of ``tenant_id`` (None if unknown)."""
    try:
        job = Job.fetch(job_id_for(tenant_id, request_id, run.client.stream_prefix), connection=run.connection, serializer=JSONSerializer)
    except NoSuchJobError:  # expired: "unknown", counted by the caller
        return None
    return shards.get(job.worker_name or "")
