"""``bench service`` (the main job) and ``bench speed`` end to end: real worker processes, fake models, a tiny
LoCoMo file.

Each benchmark creates its own database ``mnemos_bench_<stamp>`` and stream prefix and must drop
them again. The stamp is the product's own (``time.strftime``) with a per-test token appended, so
two runs in the same second (or another run on the machine) never share a database or keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import bench.common.harness
import bench.service.mainjob
import bench.speed.run
from bench.common.datasets import load_locomo
from bench.common.questions import prepare_questions
from bench.common.queue_cleanup import queue_job_ids
from bench.service.mainjob import run_main_job
from bench.speed.run import run_speed_bench
from tests.e2e.recorded_runs import database_name, drop_runs, record_runs
from tests.support import PG_ADMIN_URL
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
    runs = record_runs(monkeypatch, [(bench.speed.run, "bench_settings"), (bench.service.mainjob, "main_job_settings")])
    yield runs
    # safety net only: the assertions below are about what the benchmarks themselves left behind
    drop_runs(redis_client, runs)


def _assert_nothing_left(runs: list[Settings], redis_client: redis.Redis) -> None:
    assert runs
    names = {database_name(run) for run in runs}
    assert all(name.startswith("mnemos_bench_") for name in names)
    with psycopg.connect(PG_ADMIN_URL) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'mnemos_bench_%'")}
    assert not names & existing
    for run in runs:
        assert list(redis_client.scan_iter(match=f"{run.stream_prefix}*")) == []
        assert list(redis_client.scan_iter(match=f"rq:*{run.queue_name}*")) == []  # registries, queue
        assert queue_job_ids(redis_client, run.queue_name) == set()  # rq:job:<id>, rq:results:<id>


def test_main_job_holds_out_suppression_and_replays_equal_in_process(
        settings: Settings, locomo: Path, tmp_path: Path, bench_runs: list[Settings],
        redis_client: redis.Redis) -> None:
    out, png = tmp_path / "service.json", tmp_path / "service.png"
    lines: list[str] = []
    code = run_main_job(settings, data=locomo, reranker=FAKE_MODEL, limit=None, limit_conversations=None,
                        burnin_factor=10.0, seed=0, probes=2, sample_pairs=20, json_path=out, plot_path=png,
                        keep=False, echo=lines.append)
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert code == 0, "\n".join(lines)
    assert png.stat().st_size > 0
    assert f"JSON: {out}" in lines
    for key in ("reranker", "suppression", "features", "n_questions", "ndcg@10", "recall@10", "session_hit@1",
                "in_process", "per_question_check"):
        assert key in payload
    assert payload["reranker"] == {"name": FAKE_MODEL, "path": FAKE_MODEL, "provenance": None}
    assert payload["suppression"] is True and payload["features"] == []
    assert payload["settings"]["clusters_k"] == settings.clusters_k  # the service's own K, not a special value

    # held out: each question evaluated once, on the tenant whose burn-in drew only the other half
    questions = {q.key: q for q in prepare_questions(load_locomo(locomo), seed=0)}
    rows = payload["per_question"]
    assert sorted(r["key"] for r in rows) == sorted(questions)
    for row in rows:
        question = questions[row["key"]]
        assert row["tenant_id"] == question.conversation_id + (".b" if question.half == 0 else ".a")
    tenants = {t["tenant_id"]: t for t in payload["tenants"]}
    assert sorted(tenants) == ["conv-a.a", "conv-a.b", "conv-b.a", "conv-b.b"]
    for tenant in tenants.values():
        assert tenant["burn_in_queries"] == 20 and tenant["evaluated_questions"] == 2  # 10 x a half of 2
        assert tenant["bootstrapped_before_evaluation"] is True  # K=2, factor 2: 4 outcomes bootstrap
        assert tenant["outcomes_applied_before_evaluation"] == 20
        assert tenant["outcomes_applied"] == 22
    assert sum(t["suppression_scores_before_evaluation"] for t in tenants.values()) > 0  # learned in the burn-in
    versions = {r["suppression_version"] for r in rows}  # the burn-in, and maybe the tenant's first evaluation answer
    assert min(versions) == 20 and versions <= {20, 21}
    assert all(r["cluster"] is not None for r in rows)

    # the in-process replay gives the same NDCG@10 (and ranking) on every question
    check = payload["per_question_check"]
    assert check["passed"] is True and check["errors"] == []
    assert check["questions"] == check["equal_ndcg@10"] == check["equal_rankings"] == check["equal_clusters"] == 8
    assert check["equal_outcome_pools"] == check["requests_compared"] == 88  # 80 burn-in + 8 evaluation
    assert payload["n_questions"] == 8 and payload["in_process"]["n_questions"] == 8
    assert payload["n_questions_evaluated"] == check["questions"] == 8  # this sample has no category 5
    assert payload["ndcg@10"] == payload["in_process"]["ndcg@10"]
    assert 0.0 < payload["ndcg@10"] <= 1.0
    low, high = payload["ndcg@10_ci95"]
    assert low <= payload["ndcg@10"] <= high
    assert payload["in_process"]["recomputed_pairs"] == 20
    assert payload["in_process"]["max_abs_logit_difference"] == 0.0  # the fake reranker is exact
    assert set(payload["in_process"]["centroid_max_abs_difference"].values()) == {0.0}

    assert payload["ingest"]["turns"] == 48 and payload["ingest"]["turns_per_s"] > 0
    assert 0 < payload["query"]["p50_s"] <= payload["query"]["p95_s"] and payload["query"]["n"] == 8
    assert payload["freshness"]["probes"] == 2 and payload["freshness"]["returned"] == 2
    assert payload["rerank_cache"]["hits"] > 0  # repeated burn-in questions were answered from the cache
    assert {"ingest", "burn-in", "evaluation", "in-process replay", "total"} <= set(payload["phases_s"])
    assert any("in-process check PASSED" in line for line in lines)
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
