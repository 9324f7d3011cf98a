"""`mnemos bench quality --device`: the bi-encoder and the cross-encoders run where they are told."""

from __future__ import annotations

import json

import pytest

from bench.common.caches import PersistentEncoder, cached_bi_encoder
from bench.common.folds import load_folds


def _encoder_dir(tmp_path):
    path = tmp_path / "encoder"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"hidden_size": 8}), encoding="utf-8")
    return path


def test_fp16_embedding_is_refused_on_the_cpu_and_accepted_on_cuda(tmp_path):
    path = _encoder_dir(tmp_path)
    with pytest.raises(ValueError, match="fp16 embedding needs a CUDA device"):
        cached_bi_encoder(path, tmp_path / "cache", "fp16", device="cpu")
    # The model loads lazily, so no GPU is needed to build the cached encoder for one.
    assert isinstance(cached_bi_encoder(path, tmp_path / "cache", "fp16", device="cuda"), PersistentEncoder)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fold_rerankers_are_built_on_the_given_device(tmp_path, monkeypatch, device):
    model = tmp_path / "model"
    model.mkdir()
    (model / "mnemos_provenance.json").write_text(json.dumps({"training_conversations": ["conv-1"]}),
                                                  encoding="utf-8")
    built = {}

    class Recorder:
        def __init__(self, path, **kwargs):
            built.update(kwargs, path=path)

    monkeypatch.setattr("mnemos.rerank.CrossEncoderReranker", Recorder)
    _, loaders = load_folds([str(model)], cache_dir=tmp_path / "cache", max_length=128, batch_size=4,
                            precision="fp32", device=device)
    loaders["model"]()
    assert built["device"] == device and built["path"] == model and built["precision"].value == "fp32"
