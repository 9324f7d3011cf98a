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
