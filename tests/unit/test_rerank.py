"""Rerankers: the fake, the cache (pairs scored, hits), empty inputs, the real adapter's plumbing."""

import numpy as np
import pytest

from mnemos.errors import ModelLoadError
from mnemos.rerank import CachedReranker, CrossEncoderReranker, FakeReranker, Reranker


def test_fake_scores_token_overlap_as_logits():
    fake = FakeReranker()
    scores = fake.score("Where does my dog sleep?", ["the dog sleeps inside", "cats", "my dog"])
    np.testing.assert_allclose(scores, [0.5, -0.5, 1.5])
    assert scores.dtype == np.float32
    assert fake.pairs_scored == 3 and len(fake.calls) == 1


def test_fake_overrides_and_custom_fn():
    fake = FakeReranker(overrides={"b": 9.0}, fn=lambda q, t: -float(len(t)))
    np.testing.assert_allclose(fake.score("q", ["a", "b", "ccc"]), [-1.0, 9.0, -3.0])


def test_empty_texts_never_call_a_model():
    fake = FakeReranker()
    assert fake.score("q", []).shape == (0,)
    assert fake.calls == []
    cached = CachedReranker(fake)
    assert cached.score("q", []).shape == (0,)
    assert fake.calls == [] and cached.calls == 0


def test_cache_scores_only_missing_pairs_and_counts():
    fake = FakeReranker()
    cached = CachedReranker(fake)
    first = cached.score("dog", ["dog a", "b", "dog c"])
    assert cached.pairs_scored == 3 and cached.cache_hits == 0
    second = cached.score("dog", ["dog c", "d", "dog a", "d"])
    assert fake.calls[-1] == ("dog", ("d",))  # only the new text reached the model, once
    assert cached.pairs_scored == 4 and cached.cache_hits == 3 and cached.calls == 2
    np.testing.assert_allclose(second, [first[2], -0.5, first[0], -0.5])
    cached.score("cat", ["dog a"])  # another query is another key
    assert cached.pairs_scored == 5


def test_a_scope_reads_and_fills_only_its_own_pairs():
    fake = FakeReranker()
    cached = CachedReranker(fake)
    alice, bob = cached.scoped("alice"), cached.scoped("bob")
    first = alice.score("dog", ["dog a", "b"])
    np.testing.assert_allclose(bob.score("dog", ["dog a", "b"]), first)  # same model, same scores ...
    assert cached.pairs_scored == 4 and cached.cache_hits == 0  # ... but scored afresh
    alice.score("dog", ["b"])
    cached.score("dog", ["b"])  # the unscoped cache is a third scope
    assert cached.cache_hits == 1 and cached.pairs_scored == 5
    assert alice.model_version == cached.model_version and isinstance(alice, Reranker)
    assert cached.discard(["b"], scope="alice") == 1 and cached.pairs_of("b") == 2  # one tenant's pairs only
    assert bob.score("dog", ["b"]) is not None and cached.cache_hits == 2  # bob cannot tell alice was dropped
    assert cached.discard(["b"]) == 2 and cached.pairs_of("dog a") == 2  # unscoped: every scope


def test_cache_evicts_oldest_beyond_max_entries():
    cached = CachedReranker(FakeReranker(), max_entries=2)
    cached.score("q", ["a", "b", "c"])
    assert len(cached) == 2
    cached.score("q", ["a"])  # evicted, scored again
    assert cached.pairs_scored == 4


def test_cache_evicts_the_least_recently_used():
    cached = CachedReranker(FakeReranker(), max_entries=2)
    cached.score("q", ["a", "b"])
    cached.score("q", ["a"])  # a hit: "a" is now the most recent
    cached.score("q", ["c"])  # evicts "b", not "a"
    assert cached.cache_misses == 3
    cached.score("q", ["a"])
    assert cached.cache_misses == 3 and cached.cache_hits == 2
    cached.score("q", ["b"])
    assert cached.cache_misses == 4


def test_a_hit_in_the_same_call_survives_eviction():
    cached = CachedReranker(FakeReranker(), max_entries=1)
    cached.score("dog", ["dog"])
    np.testing.assert_allclose(cached.score("dog", ["dog", "x", "y"]), [0.5, -0.5, -0.5])


class _VersionedFake(FakeReranker):
    model_version = "v1"


def test_cache_keys_include_the_model_version():
    inner = _VersionedFake()
    cached = CachedReranker(inner)
    assert cached.model_version == "v1" and CachedReranker(FakeReranker()).model_version == ""
    cached.score("q", ["a", "b"])
    cached.score("q", ["a"])
    assert cached.cache_misses == 2 and cached.cache_hits == 1
    inner.model_version = "v2"  # another model (or max_length, precision): nothing cached answers for it
    cached.score("q", ["a", "b"])
    assert cached.cache_misses == 4 and cached.cache_hits == 1


def test_cache_keys_do_not_collide_across_query_and_text_boundaries():
    cached = CachedReranker(FakeReranker(fn=lambda q, t: float(len(q))))
    np.testing.assert_allclose(cached.score("ab", ["c"]), [2.0])
    np.testing.assert_allclose(cached.score("a", ["bc"]), [1.0])


def test_fakes_satisfy_the_protocol():
    assert isinstance(FakeReranker(), Reranker)
    assert isinstance(CachedReranker(FakeReranker()), Reranker)


def test_missing_model_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        CrossEncoderReranker(tmp_path / "no-such-model")
    assert info.value.__cause__ is not None


@pytest.mark.slow
def test_cross_encoder_plumbing_with_random_head(tmp_path):
    """Bundled MiniLM + random 1-logit head, saved and reloaded: shapes and logits only."""
    from sentence_transformers import CrossEncoder

    from mnemos.encoder import bundled_bi_encoder_path

    CrossEncoder(str(bundled_bi_encoder_path()), num_labels=1).save(str(tmp_path / "ce"))
    reranker = CrossEncoderReranker(tmp_path / "ce", max_length=32, batch_size=4)
    scores = reranker.score("where is my dog", ["the dog is in the garden", "tax forms", "x"])
    assert scores.shape == (3,) and scores.dtype == np.float32 and np.isfinite(scores).all()
    assert reranker.score("q", []).shape == (0,)
