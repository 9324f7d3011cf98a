"""Encoders: the hashing fake is deterministic and normalised; the real one loads locally."""

import numpy as np
import pytest

from mnemos.encoder import Encoder, HashingEncoder, SentenceTransformerEncoder, bundled_bi_encoder_path
from mnemos.errors import ModelLoadError


def test_hashing_encoder_shapes_norms_and_determinism():
    enc = HashingEncoder(dim=32)
    vectors = enc.encode(["My dog Rex", "my DOG rex!", "tax forms", "?!"])
    assert vectors.shape == (4, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert float(vectors[0] @ vectors[1]) == pytest.approx(1.0)  # same tokens, same vector
    np.testing.assert_array_equal(vectors, HashingEncoder(dim=32).encode(["My dog Rex", "my DOG rex!", "tax forms", "?!"]))
    assert enc.encode([]).shape == (0, 32)
    assert isinstance(enc, Encoder)


def test_hashing_encoder_tokenless_texts_differ():
    a, b = HashingEncoder(dim=256).encode(["?!", "..."])
    assert float(a @ b) < 0.99


def test_missing_model_path_raises(tmp_path):
    with pytest.raises(ModelLoadError):
        SentenceTransformerEncoder(tmp_path / "absent")


@pytest.mark.slow
def test_bundled_bi_encoder_loads_and_normalises():
    path = bundled_bi_encoder_path()
    assert path.is_dir()
    enc = SentenceTransformerEncoder(path, batch_size=8)
    vectors = enc.encode(["my dog is called Rex", "what is my dog's name?", "quarterly tax forms"])
    assert enc.dim == 384 and vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])
    assert enc.encode([]).shape == (0, 384)


def test_fp16_embedding_is_refused_on_a_cpu(tmp_path):
    with pytest.raises(ValueError, match="fp16 embedding needs a CUDA device"):
        SentenceTransformerEncoder(tmp_path / "absent", precision="fp16")
    with pytest.raises(ValueError):
        SentenceTransformerEncoder(tmp_path / "absent", precision="int8")


@pytest.mark.slow
def test_bundled_bi_encoder_in_bf16_gives_unit_rows_close_to_fp32():
    texts = ["my dog is called Rex", "what is my dog's name?", "quarterly tax forms", "Caroline: I went to a "
             "LGBTQ support group yesterday and it was so powerful."]
    fp32 = SentenceTransformerEncoder(bundled_bi_encoder_path(), batch_size=8, precision="fp32")
    bf16 = SentenceTransformerEncoder(bundled_bi_encoder_path(), batch_size=8, precision="bf16")
    assert fp32.precision.value == "fp32" and bf16.precision.value == "bf16"
    a, b = fp32.encode(texts), bf16.encode(texts)
    assert b.dtype == np.float32 and b.shape == a.shape
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)  # normalised again in float32
    assert not np.array_equal(a, b)  # the model did compute in another format
    assert float(np.min(np.sum(a * b, axis=1))) > 0.99
    assert float(b[0] @ b[1]) > float(b[0] @ b[2])
