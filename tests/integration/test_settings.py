"""Settings: one environment read, every knob mapped, bad values refused (no server needed)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import pytest

from workers.runtime.errors import ModelSetupError, SettingsError
from workers.runtime.models import cross_encoder_location, load_encoder, load_reranker, reranker_provenance
from workers.settings import ENV_VARS, Settings, to_environment


def test_every_knob_has_an_environment_variable_and_round_trips() -> None:
    names = {f.name for f in dataclasses.fields(Settings)} - {"from_environment"}
    assert set(ENV_VARS) == names
    assert all(var.startswith("MNEMOS_") for var in ENV_VARS.values())
    custom = Settings(cross_encoder="/models/ce", deep_threshold=None, suppression=False, alpha=0.5, clusters_k=1)
    rebuilt = Settings.from_env(to_environment(custom))
    assert rebuilt.replace(from_environment=frozenset()) == custom


def test_defaults_follow_the_design() -> None:
    s = Settings.from_env({})
    assert (s.pool_size, s.deep_pool_size, s.alpha, s.eta, s.clusters_k, s.update_rule) == (30, 100, 0.3, 0.1, 30,
                                                                                           "rank_gap")
    assert (s.turns_stream, s.outcomes_stream, s.dead_letter_stream) == ("mnemos:turns", "mnemos:outcomes",
                                                                          "mnemos:turns:dead")
    assert s.cross_encoder == "shipped" and s.from_environment == frozenset()
    assert s.rerank_cache_pairs == 50_000
    assert (s.fusion, s.rrf_k) == ("rrf", 60)  # reciprocal rank fusion unless MNEMOS_FUSION=convex
    assert Settings.from_env({"MNEMOS_FUSION": "convex", "MNEMOS_CONVEX_WEIGHT": "0.3"}).convex_weight == 0.3


def test_the_deep_pass_is_off_unless_a_threshold_is_set() -> None:
    assert Settings.from_env({}).deep_threshold is None
    assert Settings.from_env({"MNEMOS_DEEP_THRESHOLD": "0"}).deep_threshold == 0.0
    assert Settings.from_env({"MNEMOS_DEEP_THRESHOLD": "none"}).deep_threshold is None
    with pytest.raises(SettingsError, match="deep_threshold"):
        Settings.from_env({"MNEMOS_DEEP_THRESHOLD": "nan"})


def test_cross_encoder_none_means_no_reranker() -> None:
    assert Settings.from_env({"MNEMOS_CROSS_ENCODER": "none"}).cross_encoder is None
    assert Settings.from_env({"MNEMOS_CROSS_ENCODER": "/models/ce"}).cross_encoder == "/models/ce"
    assert Settings.from_env({"MNEMOS_RERANK_CACHE_PAIRS": "0"}).rerank_cache_pairs == 0
    with pytest.raises(SettingsError):
        Settings.from_env({"MNEMOS_RERANK_CACHE_PAIRS": "-1"})


def test_the_shipped_cross_encoder_resolves_inside_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import workers.runtime.models as models

    monkeypatch.setattr(models, "shipped_reranker_path", lambda: tmp_path)
    with pytest.raises(ModelSetupError, match="shipped cross-encoder is not in this installation"):
        cross_encoder_location(Settings())
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "mnemos_provenance.json").write_text('{"training_conversations": ["conv-26"]}', encoding="utf-8")
    assert cross_encoder_location(Settings()) == str(tmp_path)
    assert reranker_provenance(str(tmp_path))["training_conversations"] == ["conv-26"]
    assert cross_encoder_location(Settings(cross_encoder=None)) is None
    assert reranker_provenance("fake") is None


@pytest.mark.parametrize("env", [{"MNEMOS_POOL_SIZE": "thirty"}, {"MNEMOS_SUPPRESSION": "maybe"},
                                 {"MNEMOS_UPDATE_RULE": "linear"}, {"MNEMOS_POOL_SIZE": "0"},
                                 {"MNEMOS_SESSION_TOP": "0"}, {"MNEMOS_TEMPORAL_WEIGHT": "nan"},
                                 {"MNEMOS_HEARTBEAT_TTL_S": "0.5"}, {"MNEMOS_HEARTBEAT_TTL_S": "2", "MNEMOS_BLOCK_MS": "5000"},
                                 {"MNEMOS_REINDEX_BATCH_SIZE": "0"},
                                 {"MNEMOS_HEARTBEAT_TTL_S": "60"},  # a 20 s dequeue wait against a 15 s socket timeout
                                 {"MNEMOS_REDIS_URL": "redis://h:6379/0?socket_timeout=0.5"},
                                 {"MNEMOS_REDIS_URL": "redis://h:6379/0?socket_timeout=soon"},
                                 {"MNEMOS_REDIS_SOCKET_TIMEOUT_S": "0"}, {"MNEMOS_REDIS_CA_FILE": "/etc/ca.pem"},
                                 {"MNEMOS_DB_STATEMENT_TIMEOUT_S": "0"}, {"MNEMOS_INTERMEDIATE_GRACE_S": "-1"},
                                 {"MNEMOS_DATABASE_URL": "postgresql://u:pa@ss@h/db"},
                                 {"MNEMOS_FUSION": "borda"}, {"MNEMOS_CONVEX_WEIGHT": "1.5"},
                                 {"MNEMOS_CONVEX_WEIGHT": "nan"}, {"MNEMOS_BM25_WEIGHT": "nan"}, {"MNEMOS_BM25_SCORE_WEIGHT": "-inf"},
                                 {"MNEMOS_FIRST_STAGE_WEIGHT": "inf"}])
def test_bad_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)


@pytest.mark.parametrize(("variable", "value"), [
    ("MNEMOS_RESULT_TTL_S", "0"), ("MNEMOS_RESULT_TTL_S", "-5"), ("MNEMOS_JOB_TIMEOUT_S", "0"),
    ("MNEMOS_JOB_TIMEOUT_S", "-2"), ("MNEMOS_RETRIEVE_TIMEOUT_S", "nan"), ("MNEMOS_RETRIEVE_TIMEOUT_S", "-1"),
    ("MNEMOS_RETRIEVE_TIMEOUT_S", "inf"), ("MNEMOS_MAX_FUTURE_SKEW_S", "nan"), ("MNEMOS_MAX_FUTURE_SKEW_S", "-1"),
    ("MNEMOS_CLAIM_IDLE_MS", "-1"), ("MNEMOS_MAX_QUERY_BYTES", "0"), ("MNEMOS_MAX_ID_CHARS", "0"),
    ("MNEMOS_MAX_METADATA_BYTES", "-1"), ("MNEMOS_SAMPLE_INTERVAL_S", "0"), ("MNEMOS_CLAIM_INTERVAL_S", "nan"),
    ("MNEMOS_TRIM_INTERVAL_S", "-1"), ("MNEMOS_DEDUPE_THRESHOLD", "nan"), ("MNEMOS_DEDUPE_THRESHOLD", "1.5"),
    ("MNEMOS_ALPHA", "nan"), ("MNEMOS_QUERY_METRICS_PORT", "0"), ("MNEMOS_RERANK_BATCH_SIZE", "0"),
    # break-it round 14: a block of 0 ms blocks for ever; a client wait over a day the client refuses
    ("MNEMOS_BLOCK_MS", "0"), ("MNEMOS_RETRIEVE_TIMEOUT_S", "100000"), ("MNEMOS_MCP_INGEST_WAIT_S", "100000")])
def test_operating_limits_that_would_break_every_request_stop_the_start(variable: str, value: str) -> None:
    """Break-it round 12: these loaded without complaint, then failed every retrieval (a result kept
    0 s, a NaN timeout) or switched a check off (a NaN future skew accepted any timestamp)."""
    with pytest.raises(SettingsError, match=next(n for n, v in ENV_VARS.items() if v == variable)):
        Settings.from_env({variable: value})
    assert Settings.from_env({"MNEMOS_JOB_TIMEOUT_S": "-1"}).job_timeout_s == -1  # rq's "no timeout"


def test_a_missing_cross_encoder_is_warned_when_the_reranker_is_loaded_not_when_settings_are_read(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        settings = Settings.from_env({"MNEMOS_CROSS_ENCODER": "none"})
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="workers.runtime.models"):
        assert load_reranker(settings) is None
    assert [r.getMessage() for r in caplog.records if "MNEMOS_CROSS_ENCODER is none" in r.getMessage()]


def test_subcommand_help_does_not_warn_about_the_reranker() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MNEMOS_CROSS_ENCODER"}  # the group callback reads settings
    out = subprocess.run([sys.executable, "-m", "workers", "worker", "--help"], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    assert "MNEMOS_CROSS_ENCODER" not in out.stderr + out.stdout


def test_the_socket_timeout_must_exceed_every_blocking_read() -> None:
    assert Settings.from_env({"MNEMOS_BLOCK_MS": "8000"}).redis_socket_timeout_s == 15.0  # the setup fits
    with pytest.raises(SettingsError, match=r"MNEMOS_REDIS_SOCKET_TIMEOUT_S \(15 s\) must exceed MNEMOS_BLOCK_MS"):
        Settings.from_env({"MNEMOS_BLOCK_MS": "20000", "MNEMOS_HEARTBEAT_TTL_S": "30"})
    with pytest.raises(SettingsError, match="dequeue wait"):
        Settings.from_env({"MNEMOS_HEARTBEAT_TTL_S": "90"})
    assert Settings.from_env({"MNEMOS_HEARTBEAT_TTL_S": "90", "MNEMOS_REDIS_SOCKET_TIMEOUT_S": "45"}).dequeue_wait_s == 30
    tls = Settings.from_env({"MNEMOS_REDIS_URL": "rediss://:pw@redis.example:6380/2",
                             "MNEMOS_REDIS_CA_FILE": "/etc/mnemos/redis-tls/ca.crt"})
    assert tls.redis_ca_file == "/etc/mnemos/redis-tls/ca.crt"


def test_rerank_precision_defaults_to_auto_and_refuses_fp16_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env({}).rerank_precision == "auto"
    assert Settings.from_env({"MNEMOS_RERANK_PRECISION": "bf16", "MNEMOS_DEVICE": "cpu"}).rerank_precision == "bf16"
    with pytest.raises(SettingsError, match="one of auto, fp32, fp16, bf16"):
        Settings.from_env({"MNEMOS_RERANK_PRECISION": "int8"})
    with pytest.raises(SettingsError, match="fp16 needs a GPU"):
        Settings.from_env({"MNEMOS_RERANK_PRECISION": "fp16", "MNEMOS_DEVICE": "cpu"})
    auto = Settings.from_env({"MNEMOS_RERANK_PRECISION": "fp16", "MNEMOS_CROSS_ENCODER": "/models/ce"})
    monkeypatch.setattr("workers.runtime.models.resolve_device", lambda spec: "cpu")  # auto found no GPU
    with pytest.raises(SettingsError, match="fp16 needs a GPU"):
        load_reranker(auto)


def test_encoder_precision_defaults_to_auto_and_refuses_fp16_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env({}).encoder_precision == "auto"
    assert Settings.from_env({"MNEMOS_ENCODER_PRECISION": "fp32"}).encoder_precision == "fp32"
    with pytest.raises(SettingsError, match="encoder_precision must be one of auto, fp32, fp16, bf16"):
        Settings.from_env({"MNEMOS_ENCODER_PRECISION": "int8"})
    with pytest.raises(SettingsError, match="ENCODER_PRECISION=fp16 needs a GPU"):
        Settings.from_env({"MNEMOS_ENCODER_PRECISION": "fp16", "MNEMOS_DEVICE": "cpu"})
    auto = Settings.from_env({"MNEMOS_ENCODER_PRECISION": "fp16"})
    monkeypatch.setattr("workers.runtime.models.resolve_device", lambda spec: "cpu")  # auto found no GPU
    with pytest.raises(SettingsError, match="ENCODER_PRECISION=fp16 needs a GPU"):
        load_encoder(auto)


@pytest.mark.parametrize(("native_bf16", "expected"), [(True, "bf16"), (False, "fp32")])
def test_load_encoder_resolves_auto_by_what_the_cpu_computes(monkeypatch: pytest.MonkeyPatch,
                                                             native_bf16: bool, expected: str) -> None:
    from mnemos.encoder import SentenceTransformerEncoder

    monkeypatch.setattr("mnemos.precision.bf16_faster_on_cpu", lambda: native_bf16)
    encoder = load_encoder(Settings(device="cpu"))
    assert isinstance(encoder, SentenceTransformerEncoder) and encoder.precision.value == expected
    assert load_encoder(Settings(device="cpu", encoder_precision="fp32")).precision.value == "fp32"


def test_load_reranker_applies_the_precision(tmp_path) -> None:
    import torch

    from mnemos.rerank import CrossEncoderReranker, RerankPrecision
    from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder

    torch.set_num_threads(1)
    model = build_tiny_cross_encoder(tmp_path / "ce")
    reranker = load_reranker(Settings(cross_encoder=str(model), device="cpu", rerank_precision="bf16",
                                      rerank_max_length=64))
    assert isinstance(reranker, CrossEncoderReranker)
    assert reranker.precision is RerankPrecision.BF16 and "|max_length=64|bf16|" in reranker.model_version


@pytest.mark.parametrize(("native_bf16", "expected"), [(True, "bf16"), (False, "fp32")])
def test_load_reranker_resolves_auto_by_what_the_cpu_computes(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                              native_bf16: bool, expected: str) -> None:
    import torch

    from mnemos.rerank import CrossEncoderReranker
    from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder

    torch.set_num_threads(1)
    monkeypatch.setattr("mnemos.precision.bf16_faster_on_cpu", lambda: native_bf16)
    model = build_tiny_cross_encoder(tmp_path / "ce")
    reranker = load_reranker(Settings(cross_encoder=str(model), device="cpu", rerank_max_length=64))
    assert isinstance(reranker, CrossEncoderReranker)
    assert reranker.precision.value == expected and f"|{expected}|" in reranker.model_version


def test_the_evidence_weights_turn_their_features_on_and_off() -> None:
    from mnemos.features import Feature
    from workers.query.config import feature_settings

    on = {s.feature: s.params for s in feature_settings(Settings.from_env({"MNEMOS_BM25_WEIGHT": "1.5"}))}
    assert on[Feature.BM25] == {"weight": 1.5, "floor": 1.0} and Feature.FIRST_STAGE in on  # the default floor
    off = {s.feature for s in feature_settings(Settings.from_env({"MNEMOS_BM25_WEIGHT": "0",
                                                                  "MNEMOS_FIRST_STAGE_WEIGHT": "0"}))}
    assert Feature.BM25 not in off and Feature.FIRST_STAGE not in off
    scored = {s.feature: s.params for s in feature_settings(Settings.from_env({"MNEMOS_BM25_SCORE_WEIGHT": "1"}))}
    assert scored[Feature.BM25_SCORE] == {"weight": 1.0, "floor": 1.0}
    unfloored = feature_settings(Settings.from_env({"MNEMOS_EVIDENCE_FLOOR": "0"}))
    assert {s.feature: s.params for s in unfloored}[Feature.BM25_SCORE] == {"weight": 0.5}  # 0: the logits' own spread
    with pytest.raises(SettingsError, match="evidence_floor >= 0"):
        Settings.from_env({"MNEMOS_EVIDENCE_FLOOR": "-1"})
    unscored = feature_settings(Settings.from_env({"MNEMOS_BM25_SCORE_WEIGHT": "0"}))
    assert Feature.BM25_SCORE not in {s.feature for s in unscored}


def test_a_misspelt_variable_is_named_with_the_setting_it_resembles(caplog: pytest.LogCaptureFixture) -> None:
    """New-user trial (2026-12-08): MNEMOS_POOLSIZE=20 was ignored without a word."""
    settings = Settings.from_env({"MNEMOS_DEDUPE_TRESHOLD": "0.9", "MNEMOS_MIGRATE_DATABASE_URL": "postgresql://x/y",
                                  "MNEMOS_POOL_SIZE": "20", "OTHER_POOLSIZE": "1",
                                  # Kubernetes service links of the mnemos-query-metrics Service
                                  "MNEMOS_QUERY_METRICS_SERVICE_HOST": "10.0.0.7",
                                  "MNEMOS_QUERY_METRICS_SERVICE_PORT_METRICS": "9102",
                                  "MNEMOS_QUERY_METRICS_PORT_9102_TCP_ADDR": "10.0.0.7"})
    assert settings.pool_size == 20 and settings.dedupe_threshold == Settings().dedupe_threshold
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["MNEMOS_DEDUPE_TRESHOLD is not a Mnemos setting and is ignored "
                        "(did you mean MNEMOS_DEDUPE_THRESHOLD?)"]  # the migration Job's Secret key is known
