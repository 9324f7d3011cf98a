"""Every manifest under deploy/ parses and validates offline; every kustomization is consistent.

These checks need no kustomize binary: files are validated one by one against the Kubernetes JSON
schemas of kubernetes-validate (strict) and the CRD schemas in tests/deploy/schemas, and the
kustomize trees are walked by hand (test_k8s_build.py renders them when kustomize is installed).
"""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.deploy import manifests
from tests.deploy.manifests import DEPLOY, K8S, K8S_VERSIONS, KUSTOMIZATION, WORKERS

MANIFEST_FILES = manifests.manifest_files()
KUSTOMIZATION_DIRS = manifests.kustomization_dirs()
PATCH_FILES = sorted({p for d in KUSTOMIZATION_DIRS for p in manifests.patch_files(d)})
# kustomize's own configuration (fieldSpecs such as KEDA's name references), not Kubernetes objects
CONFIGURATION_FILES = sorted({(d / c).resolve() for d in KUSTOMIZATION_DIRS
                              for c in manifests.kustomization(d).get("configurations", [])})


def _rel(path) -> str:
    return str(path.relative_to(DEPLOY))


def test_the_tree_has_what_the_issue_asks_for():
    assert (K8S / "base" / KUSTOMIZATION).is_file()
    assert (K8S / "overlays" / "dev" / KUSTOMIZATION).is_file()
    for component in ("keda", "hpa", "servicemonitor"):
        assert manifests.kustomization(K8S / "components" / component)["kind"] == "Component"
    assert len(MANIFEST_FILES) >= 10


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.yaml")), ids=_rel)
def test_every_yaml_file_parses(path):
    docs = manifests.load_docs(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert isinstance(doc, dict)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFEST_FILES, ids=_rel)
def test_manifest_validates_against_schema(path, version):
    for doc in manifests.load_docs(path):
        errors = manifests.validation_errors(doc, version)
        assert not errors, f"{_rel(path)} {manifests.describe(doc)} (Kubernetes {version}):\n" + "\n".join(errors)


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=_rel)
def test_manifest_objects_are_named_and_unnamespaced(path):
    # The overlay decides the namespace; a namespace in a base file would pin it.
    for doc in manifests.load_docs(path):
        assert doc["metadata"].get("name"), f"{_rel(path)}: object without a name"
        if doc["kind"] != "Namespace":
            assert "namespace" not in doc["metadata"], f"{_rel(path)} {manifests.describe(doc)} pins a namespace"


@pytest.mark.parametrize("directory", KUSTOMIZATION_DIRS, ids=_rel)
def test_kustomization_references_exist(directory):
    spec = manifests.kustomization(directory)
    assert spec["apiVersion"].startswith("kustomize.config.k8s.io/")
    assert spec["kind"] in ("Kustomization", "Component")
    for entry in spec.get("resources", []):
        target = directory / entry
        assert target.exists(), f"{_rel(directory)}: resource {entry} does not exist"
        if target.is_dir():
            assert manifests.kustomization(target)["kind"] == "Kustomization", f"{entry} is not a Kustomization"
    for entry in spec.get("components", []):
        assert manifests.kustomization(directory / entry)["kind"] == "Component", f"{entry} is not a Component"
    for entry in spec.get("configurations", []):
        assert (directory / entry).is_file(), f"{_rel(directory)}: configuration {entry} missing"
    for patch in spec.get("patches", []):
        assert ("path" in patch) != ("patch" in patch), f"{_rel(directory)}: a patch needs exactly one of path/patch"
        if "path" in patch:
            assert (directory / patch["path"]).is_file(), f"{_rel(directory)}: patch {patch['path']} missing"
    for generator in [*spec.get("configMapGenerator", []), *spec.get("secretGenerator", [])]:
        for entry in [*generator.get("envs", []), *generator.get("files", [])]:
            source = entry.split("=", 1)[-1]
            assert (directory / source).is_file(), f"{_rel(directory)}: generator source {source} missing"
    # kustomize loads files only from inside the kustomization root (directories may be anywhere).
    for entry in [*spec.get("resources", []), *(p["path"] for p in spec.get("patches", []) if "path" in p)]:
        if (directory / entry).is_file():
            assert ".." not in entry.split("/"), f"{_rel(directory)}: file {entry} lies outside the root"


def test_no_orphan_manifests():
    """Every YAML file under deploy/k8s is a kustomization, a resource, a patch or a configuration of one."""
    used = {*MANIFEST_FILES, *PATCH_FILES, *CONFIGURATION_FILES}
    used |= {d / KUSTOMIZATION for d in KUSTOMIZATION_DIRS}
    orphans = [p for p in K8S.rglob("*.yaml") if p.resolve() not in used]
    assert not orphans, f"files no kustomization includes: {orphans}"


def test_kustomize_trees_have_no_duplicate_objects():
    for directory in (K8S / "base", K8S / "overlays" / "dev"):
        docs = manifests.collect_resources(directory)
        keys = [(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in docs]
        duplicates = {k for k in keys if keys.count(k) > 1}
        assert not duplicates, f"{_rel(directory)} includes twice: {duplicates}"


def _targets(patch: dict, directory) -> list[tuple[str | None, str | None, str | None]]:
    """(group, kind, name) that a patch entry addresses."""
    if "target" in patch:
        t = patch["target"]
        return [(t.get("group"), t.get("kind"), t.get("name"))]
    docs = manifests.load_docs(directory / patch["path"])
    return [(d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else "", d["kind"], d["metadata"]["name"])
            for d in docs]


@pytest.mark.parametrize("directory", [d for d in KUSTOMIZATION_DIRS if manifests.kustomization(d).get("patches")],
                         ids=_rel)
def test_patches_target_existing_resources(directory):
    docs = manifests.collect_resources(directory)
    if manifests.kustomization(directory)["kind"] == "Component":  # patches what the overlay brings
        docs += manifests.collect_resources(K8S / "base") + manifests.collect_resources(K8S / "components" / "keda")
    for patch in manifests.kustomization(directory)["patches"]:
        for group, kind, name in _targets(patch, directory):
            matches = [
                d for d in docs
                if (kind is None or d["kind"] == kind)
                and (name is None or d["metadata"]["name"] == name)
                and (group is None or (d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else "") == group)
            ]
            assert matches, f"{_rel(directory)}: patch for {group}/{kind}/{name} matches no resource"


@pytest.mark.parametrize("path", PATCH_FILES, ids=_rel)
def test_strategic_merge_patches_name_existing_containers(path):
    base = {manifests.describe(d): d for d in manifests.collect_resources(K8S / "base")}
    for doc in manifests.load_docs(path):
        target = base[manifests.describe(doc)]
        names = {c["name"] for c in target["spec"]["template"]["spec"]["containers"]}
        for container in doc["spec"]["template"]["spec"]["containers"]:
            # A misspelt container name would silently add a second, image-less container.
            assert container["name"] in names, f"{_rel(path)}: no container {container['name']} in {names}"


def test_no_overlay_combines_keda_and_hpa():
    # KEDA creates its own HPA per ScaledObject; a second HPA on the same Deployment fights it.
    for directory in KUSTOMIZATION_DIRS:
        components = {c.rstrip("/").split("/")[-1] for c in manifests.kustomization(directory).get("components", [])}
        assert not {"keda", "hpa"} <= components, f"{_rel(directory)} uses both keda and hpa"


def test_every_worker_has_deployment_service_pdb_and_autoscaler():
    base = manifests.collect_resources(K8S / "base")
    keda = manifests.collect_resources(K8S / "components" / "keda")
    hpa = manifests.collect_resources(K8S / "components" / "hpa")
    for worker in WORKERS:
        name = f"mnemos-{worker}"
        assert name in manifests.by_kind(base, "Deployment")
        assert f"{name}-metrics" in manifests.by_kind(base, "Service")
        assert name in manifests.by_kind(base, "PodDisruptionBudget")
        assert manifests.by_kind(keda, "ScaledObject")[name]["spec"]["scaleTargetRef"]["name"] == name
        assert manifests.by_kind(hpa, "HorizontalPodAutoscaler")[name]["spec"]["scaleTargetRef"]["name"] == name
    assert list(manifests.by_kind(base, "Job")) == ["mnemos-migrate-image"]  # renamed after the image tag


def test_no_deployment_sets_replicas():
    """KEDA (or the HPA) owns the replica count: a `replicas` in the manifest resets it on every apply."""
    for doc in manifests.collect_resources(K8S / "base"):
        if doc["kind"] == "Deployment":
            assert "replicas" not in doc["spec"], manifests.describe(doc)


def test_no_scaled_object_hard_codes_a_database_index():
    """Every trigger's databaseIndex is a placeholder the overlay's ConfigMap mnemos-keda replaces
    (test_k8s_build renders it with another index)."""
    spec = manifests.kustomization(K8S / "components" / "keda")
    (replacement,) = spec["replacements"]
    assert replacement["source"] == {"kind": "ConfigMap", "name": "mnemos-keda",
                                     "fieldPath": "data.REDIS_DATABASE_INDEX"}
    (target,) = replacement["targets"]
    assert target["select"]["kind"] == "ScaledObject" and "name" not in target["select"]
    assert target["fieldPaths"] == ["spec.triggers.*.metadata.databaseIndex"]
    for doc in manifests.collect_resources(K8S / "components" / "keda"):
        for trigger in doc.get("spec", {}).get("triggers", []):
            assert "databaseIndex" in trigger["metadata"], "a placeholder keeps the replaced value a string"


# --- the validators really reject mistakes --------------------------------------------------------

def _base_doc(kind: str, name: str) -> dict:
    docs = manifests.collect_resources(K8S / "overlays" / "dev")
    return copy.deepcopy(manifests.by_kind(docs, kind)[name])


@pytest.mark.parametrize(
    ("kind", "name", "mutate", "message"),
    [
        ("Deployment", "mnemos-query",
         lambda d: d["spec"]["template"]["spec"]["containers"][0].update(livenessprobe={}), "livenessprobe"),
        ("Deployment", "mnemos-query",
         lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriodSeconds="90"), "is not of type"),
        ("PodDisruptionBudget", "mnemos-ingest", lambda d: d["spec"].update(maxUnavaliable=1), "maxUnavaliable"),
        ("ScaledObject", "mnemos-ingest",
         lambda d: d["spec"]["triggers"][0]["metadata"].update(lagcount="5"), "lagcount"),
        ("ScaledObject", "mnemos-ingest", lambda d: d["spec"]["triggers"][0]["metadata"].pop("stream"), "stream"),
        ("ScaledObject", "mnemos-query",
         lambda d: d["spec"]["triggers"][0]["metadata"].update(listLength=5), "is not of type"),
        ("ScaledObject", "mnemos-suppression",
         lambda d: d["spec"]["triggers"][0]["metadata"].pop("consumerGroup"), "consumerGroup"),
        ("ServiceMonitor", "mnemos", lambda d: d["spec"]["endpoints"][0].update(interval="15 s"), "does not match"),
        ("PrometheusRule", "mnemos",
         lambda d: d["spec"]["groups"][1]["rules"][0].update(record="x:y:z"), "is not valid under any"),
    ],
)
def test_schemas_reject_mistakes(kind, name, mutate, message):
    doc = _base_doc(kind, name)
    assert not manifests.validation_errors(doc, K8S_VERSIONS[-1])
    mutate(doc)
    errors = manifests.validation_errors(doc, K8S_VERSIONS[-1])
    assert any(message in e for e in errors), errors


def test_unknown_kinds_are_not_silently_accepted():
    with pytest.raises(manifests.SchemaNotFound):
        manifests.validator_for({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
                                K8S_VERSIONS[-1])


def test_yaml_has_no_duplicate_keys():
    """PyYAML keeps the last of two equal keys silently; a duplicated key in a manifest is a bug."""

    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        duplicates = {k for k in keys if keys.count(k) > 1}
        if duplicates:
            raise AssertionError(f"duplicate keys {duplicates} at line {node.start_mark.line + 1}")
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    for path in DEPLOY.rglob("*.yaml"):
        with path.open() as handle:
            list(yaml.load_all(handle, Loader=StrictLoader))  # noqa: S506 - a SafeLoader subclass
