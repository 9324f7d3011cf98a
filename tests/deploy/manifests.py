"""Load, walk and validate the manifests under deploy/ offline (shared by the tests in tests/deploy).

Kubernetes' own kinds validate against the JSON schemas that the PyPI package kubernetes-validate
ships in its wheel (the ``-local-strict`` variants: unknown fields are errors). Custom resources
(KEDA, Prometheus Operator) validate against the small schemas in ``tests/deploy/schemas``.
Kustomize trees are rendered by a ``kustomize`` binary or ``kubectl kustomize`` when one is on
PATH; without one, :func:`collect_resources` walks ``resources``/``components`` by itself (no
patches, no generators), which is enough for the structural checks.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import jsonschema
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# Oldest Kubernetes minor the manifests support, and the newest kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", "1.37.0")
KUSTOMIZATION = "kustomization.yaml"
WORKERS = ("ingest", "query", "suppression")


class SchemaNotFound(LookupError):
    """Raised when neither kubernetes-validate nor tests/deploy/schemas knows a kind."""


def script_module(path: Path, name: str) -> Iterator[ModuleType]:
    """The script at ``path`` (a generate.py outside any package) imported as module ``name``, for a
    fixture to yield from; it leaves ``sys.modules`` when the fixture ends."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def load_docs(path: Path) -> list[dict]:
    """Every non-empty YAML document of ``path``."""
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def kustomization_dirs() -> list[Path]:
    """Every directory under deploy/ that holds a kustomization.yaml, sorted."""
    return sorted(p.parent for p in DEPLOY.rglob(KUSTOMIZATION))


def kustomization(directory: Path) -> dict:
    return load_docs(directory / KUSTOMIZATION)[0]


def patch_files(directory: Path) -> list[Path]:
    """Files of a kustomization that are patches (partial objects, validated only after a build)."""
    spec = kustomization(directory)
    paths = [p["path"] for p in spec.get("patches", []) if "path" in p]
    paths += spec.get("patchesStrategicMerge", [])
    return [(directory / p).resolve() for p in paths]


def manifest_files() -> list[Path]:
    """Every Kubernetes object file under deploy/ (YAML listed as a kustomize resource), sorted."""
    files: set[Path] = set()
    for directory in kustomization_dirs():
        for entry in kustomization(directory).get("resources", []):
            path = (directory / entry).resolve()
            if path.is_file():
                files.add(path)
    return sorted(files)


def collect_resources(directory: Path, _seen: frozenset[Path] = frozenset()) -> list[dict]:
    """The objects a kustomization includes through resources and components, unpatched."""
    directory = directory.resolve()
    if directory in _seen:
        raise ValueError(f"kustomization cycle through {directory}")
    spec = kustomization(directory)
    docs: list[dict] = []
    for entry in [*spec.get("resources", []), *spec.get("components", [])]:
        path = (directory / entry).resolve()
        if path.is_dir():
            docs.extend(collect_resources(path, _seen | {directory}))
        else:
            docs.extend(load_docs(path))
    return docs


# --- validation ------------------------------------------------------------------------------------

def _k8s_schema_dir(version: str):
    return importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"


@functools.cache
def _k8s_registry(version: str) -> Registry:
    definitions = json.loads((_k8s_schema_dir(version) / "_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


def _api_file_part(api_version: str) -> str:
    # apps/v1 -> apps-v1, rbac.authorization.k8s.io/v1 -> rbac-v1, v1 -> v1 (kubernetes-validate's naming)
    return re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)


@functools.cache
def _k8s_validator(version: str, kind: str, api_version: str) -> jsonschema.Validator | None:
    path = _k8s_schema_dir(version) / f"{kind.lower()}-{_api_file_part(api_version)}.json"
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ _k8s_registry(version)
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _crd_registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.glob("*.yaml")):
        contents = load_docs(path)[0]
        resources.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(resources)


@functools.cache
def _crd_validator(kind: str, api_version: str) -> jsonschema.Validator | None:
    group_version = api_version.split("/")
    if len(group_version) != 2:
        return None
    group, version = group_version
    path = SCHEMAS / f"{kind.lower()}-{group.split('.')[0]}-{version}.yaml"
    if not path.is_file():
        return None
    schema = load_docs(path)[0]
    return jsonschema.Draft202012Validator(schema, registry=_crd_registry())


def validator_for(doc: dict, version: str) -> jsonschema.Validator:
    """The strict validator of ``doc``'s kind; raises SchemaNotFound for an unknown kind."""
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if not kind or not api_version:
        raise SchemaNotFound(f"object without kind/apiVersion: {doc!r:.200}")
    validator = _k8s_validator(version, kind, api_version) or _crd_validator(kind, api_version)
    if validator is None:
        raise SchemaNotFound(f"no schema for {kind} {api_version} (Kubernetes {version})")
    return validator


def validation_errors(doc: dict, version: str) -> list[str]:
    """Human-readable schema violations of ``doc`` (empty when it is valid)."""
    errors = sorted(validator_for(doc, version).iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def describe(doc: dict) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


# --- kustomize -------------------------------------------------------------------------------------

@functools.cache
def kustomize_command() -> tuple[str, ...] | None:
    """``kustomize build`` or ``kubectl kustomize``, whichever is installed and works offline."""
    candidates = []
    if shutil.which("kustomize"):
        candidates.append(("kustomize", "build"))
    if shutil.which("kubectl"):
        candidates.append(("kubectl", "kustomize"))
    for command in candidates:
        try:
            probe = subprocess.run([*command, "--help"], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return command
    return None


def kustomize_build(directory: Path) -> list[dict]:
    """Render a kustomization with the installed kustomize; raises RuntimeError when it fails."""
    command = kustomize_command()
    if command is None:
        raise RuntimeError("no kustomize binary")
    result = subprocess.run([*command, str(directory)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} {directory} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def by_kind(docs: Iterable[dict], kind: str) -> dict[str, dict]:
    """The objects of one kind, keyed by name."""
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}
