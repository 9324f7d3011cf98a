"""The cross-encoder adapter on a tiny random BERT built locally: length-sorted batches, turn-only
truncation, its counters, precision and model version (scores are meaningless, only compared)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mnemos.rerank import CachedReranker, CrossEncoderReranker, RerankPrecision, model_digest
from mnemos.rerank_pairs import window_starts
from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder

QUERY = "where does my dog sleep at night"
TEXTS = ["the dog sleeps in the garden shed", "tax forms", "x",
         "we talked about the dog and the cat and the long walk by the river " * 3, "my dog sleeps inside",
         "a b c d e f g"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny") / "ce")


@pytest.fixture(scope="module")
def reranker(model_dir):
    return CrossEncoderReranker(model_dir, max_length=128, batch_size=2)


def _forward(reranker: CrossEncoderReranker, encoded) -> float:
    """Oracle: the model's logit for one pair the Hugging Face tokenizer encoded (no padding)."""
    import torch

    with torch.inference_mode():
        return float(reranker._model(dict(encoded))["scores"].reshape(-1)[0])


def test_scores_come_back_in_the_callers_order(reranker):
    scores = reranker.score(QUERY, TEXTS)
    assert scores.shape == (len(TEXTS),) and scores.dtype == np.float32
    assert len(set(np.round(scores, 4))) > 1  # texts score differently, so order matters
    np.testing.assert_allclose(reranker.score(QUERY, TEXTS[::-1]), scores[::-1], atol=1e-5)


def test_batched_scores_equal_unbatched_scores(model_dir, reranker):
    one_by_one = np.concatenate([reranker.score(QUERY, [t]) for t in TEXTS])
    np.testing.assert_allclose(reranker.score(QUERY, TEXTS), one_by_one, atol=1e-5)
    whole = CrossEncoderReranker(model_dir, max_length=128, batch_size=64)
    np.testing.assert_allclose(whole.score(QUERY, TEXTS), one_by_one, atol=1e-5)


def test_untruncated_scores_equal_the_libraries_own_predict(reranker):
    predicted = reranker._model.predict([(QUERY, t) for t in TEXTS], batch_size=1, show_progress_bar=False)
    np.testing.assert_allclose(reranker.score(QUERY, TEXTS), predicted, atol=1e-5)
    assert reranker.queries_truncated == 0


def test_the_turn_absorbs_the_cut_and_the_query_is_kept_whole(model_dir):
    short = CrossEncoderReranker(model_dir, max_length=24, batch_size=4)
    query = "what did we say about the long walk by the river last week"  # 13 word pieces
    turn = TEXTS[3]
    tokenizer = short._model.tokenizer
    assert len(tokenizer(query, add_special_tokens=False)["input_ids"]) > (24 - 3) // 2  # longest_first cuts it
    only_turn = tokenizer(query, turn, truncation="only_second", max_length=24, return_tensors="pt")
    assert only_turn["input_ids"].shape[1] == 24
    np.testing.assert_allclose(short.score(query, [turn, "x"])[0], _forward(short, only_turn), atol=1e-5)
    assert (short.pairs_truncated, short.queries_truncated) == (1, 0)


def test_a_query_longer_than_the_budget_is_cut_as_a_last_resort_and_counted(model_dir):
    short = CrossEncoderReranker(model_dir, max_length=24, batch_size=4)
    scores = short.score("dog " * 40, ["cat " * 40, "x"])
    assert np.isfinite(scores).all()
    assert (short.pairs_truncated, short.queries_truncated) == (2, 2)


def test_model_version_names_every_input_of_a_score(model_dir, tmp_path):
    copy = tmp_path / "ce"
    shutil.copytree(model_dir, copy)
    assert model_digest(copy) == model_digest(model_dir)  # contents, not location
    assert model_digest("some/hub-name") == "some/hub-name"
    fp32 = CrossEncoderReranker(model_dir, max_length=64)
    bf16 = CrossEncoderReranker(model_dir, max_length=64, precision="bf16")
    longer = CrossEncoderReranker(model_dir, max_length=128)
    assert fp32.model_version.startswith(model_digest(model_dir) + "|max_length=64|fp32|")
    assert len({fp32.model_version, bf16.model_version, longer.model_version}) == 3
    cached = CachedReranker(fp32)
    assert cached.model_version == fp32.model_version


def test_bf16_runs_on_cpu_and_fp16_on_cpu_is_refused(model_dir):
    fp32 = CrossEncoderReranker(model_dir, max_length=64)
    bf16 = CrossEncoderReranker(model_dir, max_length=64, precision=RerankPrecision.BF16)
    import torch

    assert {p.dtype for p in bf16._model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in fp32._model.parameters()} == {torch.float32}
    scores = bf16.score(QUERY, TEXTS)  # a random wide network amplifies rounding: no closeness claim
    assert scores.dtype == np.float32 and np.isfinite(scores).all()
    assert not np.array_equal(scores, fp32.score(QUERY, TEXTS))
    with pytest.raises(ValueError, match="CUDA"):
        CrossEncoderReranker(model_dir, precision="fp16", device="cpu")
    with pytest.raises(ValueError):
        CrossEncoderReranker(model_dir, precision="fp8")


def test_resolve_precision_keeps_an_explicit_format_and_resolves_auto_per_device() -> None:
    from mnemos.precision import resolve_precision

    yes, no = (lambda: True), (lambda: False)
    for explicit in ("fp32", "fp16", "bf16"):
        assert resolve_precision(explicit, "cpu", cpu_bf16=yes) is RerankPrecision(explicit)
    assert resolve_precision("auto", "cpu", cpu_bf16=yes) is RerankPrecision.BF16
    assert resolve_precision(RerankPrecision.AUTO, "cpu", cpu_bf16=no) is RerankPrecision.FP32
    assert resolve_precision("auto", "cuda", cpu_bf16=yes) is RerankPrecision.FP32
    assert resolve_precision("auto", "cuda:0", cpu_bf16=no) is RerankPrecision.FP32
    with pytest.raises(ValueError):
        resolve_precision("int8", "cpu", cpu_bf16=yes)


def test_an_auto_reranker_reports_the_format_it_computes_in(model_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mnemos.precision.bf16_faster_on_cpu", lambda: False)
    reranker = CrossEncoderReranker(model_dir, max_length=64, precision="auto")
    assert reranker.precision is RerankPrecision.FP32 and "|fp32|" in reranker.model_version


def test_a_long_turn_read_in_windows_scores_as_its_best_window(model_dir):
    words = " ".join(f"word{i}" for i in range(120))  # far more tokens than one 32-token pair holds
    short = "a short turn"
    plain = CrossEncoderReranker(model_dir, max_length=32, batch_size=4)
    windowed = CrossEncoderReranker(model_dir, max_length=32, batch_size=4, windows=3)
    scores = windowed.score("which word", [short, words])
    # the short turn fits: scored once, as without windows
    assert scores[0] == pytest.approx(plain.score("which word", [short])[0], abs=1e-5)
    # the long turn: the best of three windows, each scored as its own (fitting) text
    encoding = windowed._tokenizer.encode(words, add_special_tokens=False)
    query_len = len(windowed._tokenizer.encode("which word", add_special_tokens=False).ids)
    kept = 32 - windowed._special - query_len
    starts = window_starts(len(encoding.ids), kept, 3)
    assert len(starts) == 3 and starts[0] == 0 and starts[-1] + kept == len(encoding.ids)
    spans = [words[encoding.offsets[s][0]:encoding.offsets[s + kept - 1][1]] for s in starts]
    assert scores[1] == pytest.approx(float(plain.score("which word", spans).max()), abs=1e-5)
    assert scores[1] >= plain.score("which word", [words])[0] - 1e-5  # the first window is one of them


def test_windows_are_part_of_the_model_version_and_must_be_positive(model_dir):
    assert "windows" not in CrossEncoderReranker(model_dir, max_length=32).model_version
    assert CrossEncoderReranker(model_dir, max_length=32, windows=3).model_version.endswith("|windows=3")
    with pytest.raises(ValueError, match="windows"):
        CrossEncoderReranker(model_dir, max_length=32, windows=0)
