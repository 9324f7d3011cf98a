"""``mnemos bench scale`` end to end on tiny sizes: real worker processes, fake models, a tiny
LongMemEval-format file (xz-compressed, as the S file is distributed).

Six questions, five haystack sessions of ten turns each; the first session is the same in every
haystack (LongMemEval-S repeats sessions across questions), so the large tenant's pool holds 250
distinct turns and 300 large turns go round it once more; the first haystack also repeats that
session under another date, as 13 haystacks of the S file do. Each turn carries 60 random numbers, so a
question tenant's index (its vocabulary mostly) is large enough that a 1 MiB budget cannot hold all six
and the Zipf mix evicts and reloads. About 13 s on an idle 2-core
machine (both tests 21 s).
"""

from __future__ import annotations

import json
import lzma
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import bench.scale.reshard
import bench.scale.run
import bench.scale.tenants
from api import sharding
from bench.scale.cli import run_scale_bench
from bench.scale.run import ScaleOptions
from tests.e2e.recorded_runs import database_name, drop_runs, record_runs
from tests.support import PG_ADMIN_URL
from workers.settings import FAKE_MODEL, Settings

pytestmark = pytest.mark.e2e

_WORDS = ("cello", "garden", "Lisbon", "marathon", "novel", "tomato", "bicycle", "lighthouse", "recipe", "train",
          "museum", "violin", "harbour", "pottery", "kayak", "orchard", "glacier", "lantern", "quilt", "tram")
_QUESTIONS = 6
_NOTES = 60  # distinct numbers per turn: tenants large enough that a 1 MiB budget cannot hold them all


def _session(rng: random.Random, tag: str, turns: int = 10) -> list[dict[str, Any]]:
    return [{"role": ("user", "assistant")[i % 2],
             "content": f"In {tag} turn {i} we talked about the {rng.choice(_WORDS)} and the {rng.choice(_WORDS)}, "
                        f"then the {rng.choice(_WORDS)} near the {rng.choice(_WORDS)}, {rng.randint(1, 10_000)} times; "
                        f"notes {' '.join(str(rng.randint(1, 10**6)) for _ in range(_NOTES))}."}
            for i in range(turns)]


def _items() -> list[dict[str, Any]]:
    rng = random.Random(7)
    shared = _session(rng, "the shared session")
    items = []
    for q in range(_QUESTIONS):
        sessions = [shared, *(_session(rng, f"question {q} session {s}") for s in range(1, 5))]
        items.append({"question_id": f"q{q}", "question_type": "single-session-user",
                      "question": f"What did we say about the {_WORDS[q]}?", "answer": "x",
                      "question_date": "2023/06/01 (Thu) 10:00",
                      "haystack_session_ids": ["shared", *(f"q{q}s{s}" for s in range(1, 5))],
                      "haystack_dates": [f"2023/05/{s + 1:02d} (Mon) 09:30" for s in range(5)],
                      "haystack_sessions": sessions, "answer_session_ids": []})
    first = items[0]  # as in 13 haystacks of LongMemEval-S: a session again, under another date
    first["haystack_session_ids"].append("shared")
    first["haystack_dates"].append("2023/05/30 (Tue) 18:00")
    first["haystack_sessions"].append(shared)
    return items


@pytest.fixture
def longmemeval(tmp_path: Path) -> Path:
    path = tmp_path / "longmemeval_s_tiny.json.xz"
    path.write_bytes(lzma.compress(json.dumps(_items()).encode("utf-8")))
    return path


@pytest.fixture
def scale_runs(monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis) -> Iterator[list[Settings]]:
    """Settings of every phase the bench runs (stamps made unique); their leftovers removed after."""
    runs = record_runs(monkeypatch, [(bench.scale.run, "scale_settings"), (bench.scale.tenants, "scale_settings"),
                                     (bench.scale.reshard, "scale_settings")])
    yield runs
    drop_runs(redis_client, runs)  # safety net only: the test asserts the bench itself left nothing


def _left_behind(runs: list[Settings], redis_client: redis.Redis) -> list[str]:
    names = {database_name(run) for run in runs}
    with psycopg.connect(PG_ADMIN_URL) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'mnemos_bench_%'")}
    keys = [k for run in runs for pattern in (f"{run.stream_prefix}*", f"rq:*{run.queue_name}*")
            for k in redis_client.scan_iter(match=pattern)]
    return sorted(names & existing) + [k.decode() for k in keys]


def test_scale_bench_measures_every_phase_on_tiny_data(settings: Settings, longmemeval: Path, tmp_path: Path,
                                                       scale_runs: list[Settings], redis_client: redis.Redis) -> None:
    assert {sharding.shard_of(f"q{q}", 2) for q in range(_QUESTIONS)} == {0, 1}  # both shards get tenants
    out, report = tmp_path / "scale.json", tmp_path / "scale.md"
    options = ScaleOptions(data=longmemeval, reranker=FAKE_MODEL, large_turns=300, small_turns=60, queries=5,
                           probes=2, probe_turns=5, tenants=_QUESTIONS, memory_mb=1, requests=40, shards=2,
                           shard_tenants=_QUESTIONS, shard_requests=12)
    assert run_scale_bench(settings, options, json_path=out, markdown=report) == 0
    payload = json.loads(out.read_text(encoding="utf-8"))

    assert payload["command"].startswith("mnemos") and payload["machine"]["cores"] >= 1
    assert payload["sizes"]["large_turns"] == 300 and payload["sizes"]["small_turns"] == 60
    large = payload["phases"]["large"]
    assert large["aliases_stored"] == 0  # every synthetic turn says another number
    assert large["distinct_pool_turns"] == 250  # the shared session counted once; 50 copies go round again
    assert payload["p50_ratio_200k_vs_6k"] > 0
    assert payload["cold_start_turns"] == 300 and payload["cold_start_s_200k"] > 0
    assert large["cold_start"]["loaded_from_postgres"] is True
    assert 500 < payload["bytes_per_turn"] < 100_000
    assert payload["ingest_turns_per_s"] > 0
    assert large["refresh"]["probes"] == 2 and payload["refresh_retrievable_p50_s"] > 0
    assert large["refresh"]["committed_s_p50"] <= payload["refresh_retrievable_p50_s"]

    many = payload["phases"]["many"]
    assert many["tenants"] == _QUESTIONS and many["requests"] == 40 and many["memory_mb"] == 1
    assert many["hits"] + many["misses"] == 40 and many["unclassified"] == 0
    assert 0 < payload["eviction_hit_rate"] < 1
    assert payload["eviction_hit_rate"] <= many["hit_rate_without_eviction"]
    assert many["evictions"] > 0 and many["max_cached_tenants"] < _QUESTIONS  # the budget held fewer than all
    assert sum(many["requests_per_tenant_rank"]) == 40

    shards = payload["shards"]
    assert shards["shards"] == 2 and shards["every_tenant_served_by_its_shard"] is True
    assert sum(row["tenants"] for row in shards["per_shard"]) == _QUESTIONS
    for row in shards["per_shard"]:
        assert row["requests_served"] == row["requests_routed"] == row["query_jobs_ok"]
        assert row["turns_stored"] == row["turns_routed"]
        assert row["cached_tenants"] == row["tenants"]

    grown = payload["reshard"]
    moved = sorted(f"q{q}" for q in range(_QUESTIONS) if sharding.shard_of(f"q{q}", 2) != sharding.shard_of(f"q{q}", 3))
    assert grown["shards_before"] == 2 and grown["shards_after"] == 3 and grown["moved_tenants"] == moved
    assert grown["every_moved_tenant_went_to_the_new_shard"] is True
    assert grown["new_shard_stream_holds_only_moved_tenants"] is True
    assert grown["turns_lost"] == grown["turns_unexpected"] == grown["dead_letters"] == 0
    assert grown["turns_published_before_change"] + grown["turns_published_after_change"] == grown["turns"]
    # the old shards' ingest workers were paused: every first half still waited at the change
    assert grown["turns_waiting_in_old_streams_at_change"] == grown["turns_published_before_change"]
    assert grown["moved_tenants_turns_in_old_streams_at_change"] > 0
    assert grown["new_shard_stream_tenants"] == len(moved)
    assert sum(row["turns_stored_by_its_ingest_worker"] for row in grown["per_shard"]) == grown["turns"]
    assert grown["per_shard"][2]["tenants_before"] == 0 and grown["per_shard"][2]["tenants_after"] == len(moved)
    assert grown["every_tenant_served_by_its_new_shard"] is True and grown["requests"] == _QUESTIONS
    text = report.read_text(encoding="utf-8")
    assert "# Scale of the service" in text and "## Adding a shard with turns in flight" in text
    assert len(scale_runs) == 4 and _left_behind(scale_runs, redis_client) == []


def test_a_later_phase_is_added_to_an_earlier_result(settings: Settings, longmemeval: Path, tmp_path: Path,
                                                     scale_runs: list[Settings], redis_client: redis.Redis) -> None:
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({"phases": {"large": {"kept": True, "queries": {"p50_ratio": 1.5},
                                                    "cold_start": {"load_s": 2.0, "turns": 9}, "ingest": {
                                                        "ingest_turns_per_s": 3.0},
                                                    "refresh": {"retrievable_s_p50": 0.1}}}}), encoding="utf-8")
    options = ScaleOptions(data=longmemeval, phases=("shards",), reranker=FAKE_MODEL, shards=2,
                           shard_tenants=_QUESTIONS, shard_requests=6)
    assert run_scale_bench(settings, options, json_path=out) == 0
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["phases"]["large"]["kept"] is True and payload["phases_run_now"] == ["shards"]
    assert payload["p50_ratio_200k_vs_6k"] == 1.5 and payload["cold_start_s_200k"] == 2.0
    assert payload["eviction_hit_rate"] is None and payload["shards"]["every_tenant_served_by_its_shard"] is True
    assert len(scale_runs) == 1 and _left_behind(scale_runs, redis_client) == []
