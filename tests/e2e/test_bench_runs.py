"""``bench service`` and ``bench speed`` end to end: real worker processes, fake models, a tiny LoCoMo file.

Each benchmark creates its own database ``mnemos_bench_<stamp>`` and stream prefix and must drop
them again. The stamp is the product's own (``time.strftime``) with a per-test token appended, so
two runs in the same second (or another run on the machine) never share a database or keys.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import bench.service
import bench.speed
from bench.datasets import load_locomo
from bench.service import run_service_bench
from bench.speed import run_speed_bench
from tests.support import PG_ADMIN_URL
from workers.queue_cleanup import delete_queue_jobs, queue_job_ids
from workers.settings import FAKE_MODEL, Settings

pytestmark = pytest.mark.e2e

# Two conversations, two sessions each; every turn text is distinct except one deliberate repeat
# per conversation (dedupe folds it into an alias, which the relevance mapping must follow).
_CONVERSATIONS = {
    "conv-a": ("Ann", "Bo", [
        ["I adopted a grey cat named Pixel last week.", "That is lovely, how old is Pixel?",
         "Pixel is two years old and loves the balcony.", "My sister Clara lives in Bergen now.",
         "Sounds good, see you on Friday.", "Bergen is rainy but Clara likes the fjords."],
        ["I started learning the cello in March.", "Is the cello hard to learn?",
         "The bow technique is the hardest part of the cello.", "We booked a trip to Lisbon in June.",
         "Sounds good, see you on Friday.", "Lisbon has great custard tarts and trams."],
    ], [
        ("What is the name of Ann's cat?", ["D1:1"]),
        ("Where does Clara live?", ["D1:4", "D1:6"]),
        ("Which instrument is Ann learning?", ["D2:1; D2:3"]),
        ("When are they meeting, Friday?", ["D2:5"]),
    ]),
    "conv-b": ("Cem", "Dora", [
        ["I planted tomatoes and basil in the garden.", "Do the tomatoes get enough sun?",
         "The garden faces south so the tomatoes thrive.", "My brother Emil repairs old bicycles.",
         "Emil fixed a red racing bicycle from 1978.", "Okay, talk to you tomorrow."],
        ["I ran my first half marathon in Vienna.", "How long did the marathon take?",
         "The half marathon took me two hours and five minutes.", "I am reading a novel about lighthouses.",
         "Okay, talk to you tomorrow.", "The lighthouse keeper in the novel is called Ida."],
    ], [
        ("What did Cem plant in the garden?", ["D1:1"]),
        ("What does Emil repair?", ["D1:4 D1:5"]),
        ("Where did Cem run a half marathon?", ["D2:1"]),
        ("Who is the lighthouse keeper in the novel?", ["D2:6"]),
    ]),
}
_DATES = ["1:56 pm on 8 May, 2023", "10:04 am on 19 June, 2023"]


def _locomo_payload() -> list[dict[str, Any]]:
    samples = []
    for sample_id, (a, b, sessions, qa) in _CONVERSATIONS.items():
        conversation: dict[str, Any] = {"speaker_a": a, "speaker_b": b}
        for s, texts in enumerate(sessions, start=1):
            conversation[f"session_{s}_date_time"] = _DATES[s - 1]
            conversation[f"session_{s}"] = [{"speaker": (a, b)[i % 2], "dia_id": f"D{s}:{i + 1}", "text": text}
                                            for i, text in enumerate(texts)]
        samples.append({"sample_id": sample_id, "conversation": conversation,
                        "qa": [{"question": q, "answer": "x", "evidence": ev, "category": 4} for q, ev in qa]})
    return samples


@pytest.fixture
def locomo(tmp_path: Path) -> Path:
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(_locomo_payload()), encoding="utf-8")
    conversations = load_locomo(path)
    assert [c.conversation_id for c in conversations] == ["conv-a", "conv-b"]
    assert all(len(c.turns) == 12 and len(c.questions) == 4 for c in conversations)
    assert all(q.relevant_turn_ids for c in conversations for q in c.questions)
    return path


@pytest.fixture
def bench_runs(monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis) -> Iterator[list[Settings]]:
    """Settings of every benchmark run the test starts (recorded, stamps made unique); cleaned up after."""
    token = uuid.uuid4().hex[:8]
    runs: list[Settings] = []
    original = bench.service.bench_settings

    def recording(base: Settings, *, reranker: str | None, stamp: str) -> Settings:
        value = original(base, reranker=reranker, stamp=f"{stamp}_{token}")
        runs.append(value)
        return value

    monkeypatch.setattr(bench.service, "bench_settings", recording)
    monkeypatch.setattr(bench.speed, "bench_settings", recording)
    yield runs
    # safety net only: the assertions below are about what the benchmarks themselves left behind
    for run in runs:
        delete_queue_jobs(redis_client, run.queue_name)
        keys = [*redis_client.scan_iter(match=f"{run.stream_prefix}*"),
                *redis_client.scan_iter(match=f"rq:*{run.stream_prefix}*")]
        if keys:
            redis_client.delete(*keys)
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(_dbname(run))))


def _dbname(run: Settings) -> str:
    return psycopg.conninfo.conninfo_to_dict(run.database_url)["dbname"]


def _assert_nothing_left(runs: list[Settings], redis_client: redis.Redis) -> None:
    assert runs
    names = {_dbname(run) for run in runs}
    assert all(name.startswith("mnemos_bench_") for name in names)
    with psycopg.connect(PG_ADMIN_URL) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'mnemos_bench_%'")}
    assert not names & existing
    for run in runs:
        assert list(redis_client.scan_iter(match=f"{run.stream_prefix}*")) == []
        assert list(redis_client.scan_iter(match=f"rq:*{run.queue_name}*")) == []  # registries, queue
        assert queue_job_ids(redis_client, run.queue_name) == set()  # rq:job:<id>, rq:results:<id>


def test_service_bench_ranks_exactly_like_the_in_process_pipeline(
        settings: Settings, locomo: Path, tmp_path: Path, bench_runs: list[Settings],
        redis_client: redis.Redis) -> None:
    out = tmp_path / "service.json"
    code = run_service_bench(settings, data=locomo, rerankers=[FAKE_MODEL], limit=None, limit_conversations=None,
                             all_conversations=False, json_path=out, keep=False)
    assert code == 0
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["n_questions"] == 8
    assert payload["in_process_hybrid_rerank"]["n_questions"] == 8
    # suppression off, no deep pass: the service is exactly hybrid_rerank, question by question
    assert payload["questions_with_different_ndcg@10"] == 0
    assert payload["max_abs_ndcg@10_gap_per_question"] == pytest.approx(0.0, abs=1e-9)
    assert payload["ndcg@10"] == pytest.approx(payload["in_process_hybrid_rerank"]["ndcg@10"], abs=1e-12)
    assert payload["recall@10"] == pytest.approx(payload["in_process_hybrid_rerank"]["recall@10"], abs=1e-12)
    assert 0.0 < payload["ndcg@10"] <= 1.0
    assert payload["turns"] == 24
    assert payload["ingest_turns_per_s"] > 0
    assert payload["query_p50_s"] <= payload["query_p95_s"]
    [fold] = payload["folds"]
    assert fold["reranker"] == FAKE_MODEL and fold["conversations"] == ["conv-a", "conv-b"]
    assert fold["n_questions"] == 8 and fold["turns"] == 24
    assert payload["settings"]["suppression"] is False and payload["settings"]["deep_threshold"] is None
    assert len(bench_runs) == 1
    _assert_nothing_left(bench_runs, redis_client)


SPEED_KEYS = ("encoder_turns_per_s", "encoder_sorted_turns_per_s", "ingest_turns_per_s", "ingest_share_of_encoder",
              "query_p50_s", "query_p95_s", "rerank_p50_s", "worker_rerank_p50_s",
              "query_overhead_vs_worker_rerank_p50", "outside_rerank_p50_s", "freshness_p50_s", "freshness_p95_s",
              "machine", "command")


def test_speed_bench_reports_every_number(settings: Settings, locomo: Path, tmp_path: Path,
                                          bench_runs: list[Settings], redis_client: redis.Redis) -> None:
    out = tmp_path / "speed.json"
    code = run_speed_bench(settings, data=locomo, reranker=FAKE_MODEL, limit=None, limit_conversations=None,
                           probes=3, json_path=out)
    assert code == 0
    payload = json.loads(out.read_text(encoding="utf-8"))
    missing = [key for key in SPEED_KEYS if key not in payload]
    assert missing == []
    assert all(payload[key] is not None for key in SPEED_KEYS)
    assert payload["machine"]["cores"] >= 1
    assert payload["command"].startswith("mnemos")
    assert payload["n_queries"] == 8 and payload["n_turns"] == 24 and payload["n_freshness_probes"] == 3
    assert payload["reranker"] == FAKE_MODEL
    assert payload["encoder_turns_per_s"] > 0 and payload["encoder_sorted_turns_per_s"] > 0
    assert payload["encoder_turns_per_s"] == pytest.approx(
        (payload["encoder_turns_per_s_before"] + payload["encoder_turns_per_s_after"]) / 2)
    assert payload["ingest_turns_per_s"] > 0 and payload["ingest_share_of_encoder"] > 0
    assert 0 < payload["query_p50_s"] <= payload["query_p95_s"]
    assert 0 < payload["freshness_p50_s"] <= payload["freshness_p95_s"]
    assert payload["freshness_probes_returned"] == 3  # each probe is visible to the query worker once committed
    assert payload["rerank_p50_s"] > 0 and payload["worker_rerank_p50_s"] > 0
    stages = payload["worker_stage_p50_s"]
    assert {"rerank", "total"} <= set(stages)
    assert stages["rerank"] <= stages["total"]
    assert len(bench_runs) == 1
    _assert_nothing_left(bench_runs, redis_client)
