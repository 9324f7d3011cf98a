"""bench/quality/precision_check.py on the tiny local cross-encoder: fused pools of synthetic conversations,
bf16 against fp32 on the CPU (the lead runs fp16/bf16 on real LoCoMo pools on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.quality.precision_check import AGREEMENT_BAR, Pool, agreement, real_pools, run
from mnemos.encoder import HashingEncoder
from mnemos.rerank import FakeReranker
from tests.unit.test_bench_synthetic import synthetic_conversations
from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder


@pytest.fixture(scope="module")
def pools():
    return real_pools(synthetic_conversations(), HashingEncoder(64), questions=6, pool_size=8)


def test_real_pools_are_fused_pools_of_rendered_turns(pools):
    assert len(pools) == 6
    assert all(1 <= len(p.texts) <= 8 and len(set(p.texts)) == len(p.texts) for p in pools)
    assert all(p.query and p.question_key for p in pools)


def test_agreement_of_a_reranker_with_itself_is_perfect(pools):
    seconds, (record,) = agreement(pools, FakeReranker(fn=lambda q, t: float(len(t))),
                                   {"same": FakeReranker(fn=lambda q, t: float(len(t)))})
    assert seconds >= 0 and record.pools == len(pools)
    assert record.mean_rho == pytest.approx(1.0) and record.share_at_bar == 1.0 and record.max_abs_diff == 0.0
    assert record.top1_agreement == 1.0


def test_agreement_counts_constant_pools_apart():
    pool = Pool("q1", "q", ("a", "bb", "ccc"))
    _, (record,) = agreement([pool, Pool("q2", "q", ("only",))], FakeReranker(fn=lambda q, t: float(len(t))),
                             {"flat": FakeReranker(fn=lambda q, t: 0.0)})
    assert (record.pools, record.constant_pools) == (1, 1)  # the one-text pool is not usable
    assert np.isnan(record.mean_rho) and np.isnan(record.share_at_bar)


def test_bf16_against_fp32_on_the_cpu(pools, tmp_path):
    import torch

    torch.set_num_threads(1)
    model = build_tiny_cross_encoder(tmp_path / "ce")
    report = run(model, pools, precisions=["bf16", "fp32"], device="cpu", max_length=64, batch_size=4)
    bf16, fp32 = report["precisions"]
    assert report["model"].startswith("ce@") and report["bar"] == AGREEMENT_BAR
    assert fp32["mean_rho"] == pytest.approx(1.0) and fp32["max_abs_diff"] == 0.0
    assert bf16["precision"] == "bf16" and -1.0 <= bf16["min_rho"] <= 1.0 and bf16["seconds_per_pool"] > 0
