"""The kustomizations render, the rendered objects validate, and they agree with the service.

Rendering uses ``kustomize build`` or ``kubectl kustomize`` (skipped when neither is installed;
test_k8s_structure.py checks the trees by hand). The agreement checks read workers/settings.py:
every MNEMOS_* variable is a real setting, the KEDA triggers watch the streams, groups and rq
queue the workers use, the ports are the metrics ports, grace periods outlast the job timeout.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy import manifests
from tests.deploy.manifests import DEPLOY, K8S, K8S_VERSIONS, WORKERS
from workers.runtime.metrics import LIVENESS_PATH
from workers.settings import ENV_VARS, Settings

DEV = K8S / "overlays" / "dev"
SETTINGS_ENV = K8S / "base" / "settings.env"
STREAM_GROUPS = {"ingest": "turns_stream", "suppression": "outcomes_stream"}


def _env_file(path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value
    return pairs


def _dev_generator(kind: str, name: str) -> dict[str, str]:
    for generator in manifests.kustomization(DEV).get(kind, []):
        if generator["name"] == name:
            return dict(literal.split("=", 1) for literal in generator.get("literals", []))
    raise AssertionError(f"dev overlay has no {kind} {name}")


SETTINGS_VARS = _env_file(SETTINGS_ENV) | _dev_generator("configMapGenerator", "mnemos-settings")
SETTINGS = Settings.from_env(SETTINGS_VARS)


@pytest.fixture(scope="module")
def dev(kustomize):
    return kustomize(DEV)


@pytest.fixture(scope="module")
def hpa_variant(kustomize, tmp_path_factory):
    """base + the HPA component, as an operator without KEDA would compose it."""
    root = tmp_path_factory.mktemp("hpa-overlay")
    base, hpa = (os.path.relpath(K8S / part, root) for part in ("base", "components/hpa"))  # no absolute roots
    (root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {hpa}\n"
    )
    return kustomize(root)


# --- settings ----------------------------------------------------------------------------------------

def test_settings_are_real_and_parse():
    unknown = set(SETTINGS_VARS) - set(ENV_VARS.values())
    assert not unknown, f"not settings of workers/settings.py: {unknown}"
    assert set(SETTINGS.from_environment) == {k for k, v in ENV_VARS.items() if v in SETTINGS_VARS}
    assert "MNEMOS_REDIS_URL" not in SETTINGS_VARS and "MNEMOS_DATABASE_URL" not in SETTINGS_VARS, \
        "connection URLs belong in the Secret"


def test_dev_secret_holds_every_key_the_manifests_read(dev):
    secret = _dev_generator("secretGenerator", "mnemos-connections")
    Settings.from_env({k: v for k, v in secret.items() if k.startswith("MNEMOS_") and k in ENV_VARS.values()})
    referenced = set()
    for doc in dev:
        if doc["kind"] == "TriggerAuthentication":
            referenced |= {ref["key"] for ref in doc["spec"]["secretTargetRef"]}
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref and ref["name"] == "mnemos-connections":
                        referenced.add(ref["key"])
    assert referenced <= set(secret), f"missing in the dev Secret: {referenced - set(secret)}"
    assert {"MNEMOS_REDIS_URL", "MNEMOS_DATABASE_URL", "REDIS_ADDRESS"} <= set(secret)


# --- rendering -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", [K8S / "base", DEV, DEPLOY / "prometheus", DEPLOY / "grafana"],
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kustomization_renders_valid_objects(kustomize, directory, version):
    docs = kustomize(directory)
    assert docs
    for doc in docs:
        errors = manifests.validation_errors(doc, version)
        assert not errors, f"{manifests.describe(doc)} (Kubernetes {version}):\n" + "\n".join(errors)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_hpa_variant_renders_valid_objects(hpa_variant, version):
    assert set(manifests.by_kind(hpa_variant, "HorizontalPodAutoscaler")) == {f"mnemos-{w}" for w in WORKERS}
    assert not manifests.by_kind(hpa_variant, "ScaledObject")
    for doc in hpa_variant:
        assert not manifests.validation_errors(doc, version), manifests.describe(doc)


def test_dev_overlay_namespaces_everything(dev):
    for doc in dev:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "mnemos-dev", manifests.describe(doc)


def test_dev_overlay_wires_the_generated_names(dev):
    config_maps = manifests.by_kind(dev, "ConfigMap")
    settings = [n for n in config_maps if n.startswith("mnemos-settings-")]
    assert len(settings) == 1, "the settings ConfigMap carries its content hash"
    assert config_maps[settings[0]]["data"]["MNEMOS_MAX_CACHED_TENANTS"] == "32"
    for doc in dev:
        if doc["kind"] in ("Deployment", "Job") and doc["metadata"]["name"].startswith("mnemos-"):
            container = doc["spec"]["template"]["spec"]["containers"][0]
            refs = {e.get("configMapRef", {}).get("name") for e in container["envFrom"]}
            assert settings[0] in refs, manifests.describe(doc)
            assert container["image"] == "mnemos:dev"
    assert "mnemos-connections" in manifests.by_kind(dev, "Secret"), "no hash suffix: KEDA names the Secret"
    for scaled in manifests.by_kind(dev, "ScaledObject").values():
        assert scaled["spec"]["maxReplicaCount"] == 2
    for kind in ("ServiceMonitor", "PrometheusRule"):
        for doc in manifests.by_kind(dev, kind).values():
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


# --- the workers -----------------------------------------------------------------------------------------

def _container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.mark.parametrize("worker", WORKERS)
def test_worker_deployment_is_production_shaped(dev, worker):
    deployment = manifests.by_kind(dev, "Deployment")[f"mnemos-{worker}"]
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    port = getattr(SETTINGS, f"{worker}_metrics_port")
    assert container["args"] == ["worker", worker]
    assert spec["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), f"{worker}: {kind} incomplete"
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"] == [port]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe in container, f"{worker} has no {probe}"
    assert container["readinessProbe"]["exec"]["command"] == ["mnemos", "health", "--no-models"]
    assert container["livenessProbe"]["httpGet"] == {"path": LIVENESS_PATH, "port": "metrics"}, \
        "the loop's own liveness, not the metrics thread"
    assert "replicas" not in spec, "KEDA owns the replica count"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"], "HF_HOME and caches live in /tmp"
    assert pod["automountServiceAccountToken"] is False
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_grace_period_outlasts_a_retrieval_job(dev):
    grace = manifests.by_kind(dev, "Deployment")["mnemos-query"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert grace > SETTINGS.job_timeout_s, "rq's warm shutdown must be able to finish the job in hand"
    for worker in ("ingest", "suppression"):
        pod = manifests.by_kind(dev, "Deployment")[f"mnemos-{worker}"]["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] >= 30


@pytest.mark.parametrize("worker", WORKERS)
def test_each_worker_has_service_pdb_and_scaler(dev, worker):
    name = f"mnemos-{worker}"
    deployment = manifests.by_kind(dev, "Deployment")[name]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = manifests.by_kind(dev, "Service")[f"{name}-metrics"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": getattr(SETTINGS, f"{worker}_metrics_port"),
                                         "protocol": "TCP", "targetPort": "metrics"}]
    others = [d for n, d in manifests.by_kind(dev, "Deployment").items() if n != name]
    for other in others:
        assert not service["spec"]["selector"].items() <= other["spec"]["template"]["metadata"]["labels"].items()
    pdb = manifests.by_kind(dev, "PodDisruptionBudget")[name]
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 1, "a single replica must stay drainable"
    scaled = manifests.by_kind(dev, "ScaledObject")[name]
    assert scaled["spec"]["scaleTargetRef"]["name"] == name
    assert scaled["spec"]["minReplicaCount"] >= 1, "models take too long to load for scale-to-zero"
    monitor = manifests.by_kind(dev, "ServiceMonitor")["mnemos"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert worker in monitor["spec"]["selector"]["matchExpressions"][0]["values"]


def test_keda_watches_the_streams_groups_and_queue_the_workers_use(dev):
    scaled = manifests.by_kind(dev, "ScaledObject")
    for worker, stream_attr in STREAM_GROUPS.items():
        triggers = scaled[f"mnemos-{worker}"]["spec"]["triggers"]
        assert triggers and all(t["type"] == "redis-streams" for t in triggers)
        for trigger in triggers:
            assert trigger["metadata"]["stream"] == getattr(SETTINGS, stream_attr)
            assert trigger["metadata"]["consumerGroup"] == worker
            assert trigger["authenticationRef"]["name"] == "mnemos-redis"
        assert any("lagCount" in t["metadata"] for t in triggers), f"{worker} must scale on consumer-group lag"
    (queue_trigger,) = scaled["mnemos-query"]["spec"]["triggers"]
    assert queue_trigger["type"] == "redis"
    assert queue_trigger["metadata"]["listName"] == f"rq:queue:{SETTINGS.queue_name}"
    auth = manifests.by_kind(dev, "TriggerAuthentication")["mnemos-redis"]
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == {"address", "password"}


def test_stream_names_follow_the_prefix_of_the_settings():
    # A changed MNEMOS_STREAM_PREFIX must be mirrored in the ScaledObjects (they hold literal keys).
    keda = manifests.collect_resources(K8S / "components" / "keda")
    streams = {t["metadata"]["stream"] for d in keda if d["kind"] == "ScaledObject"
               for t in d["spec"]["triggers"] if "stream" in t["metadata"]}
    assert streams == {SETTINGS.turns_stream, SETTINGS.outcomes_stream}


def test_migration_job(dev):
    job = manifests.by_kind(dev, "Job")["mnemos-migrate-dev"]  # named after the image tag
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["migrate"]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] >= 1
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    (db,) = [e for e in container["env"] if e["name"] == "MNEMOS_DATABASE_URL"]
    assert db["valueFrom"]["secretKeyRef"]["key"] == "MNEMOS_MIGRATE_DATABASE_URL"


def test_cli_has_the_commands_the_manifests_run():
    """Container args and probes name CLI commands and options that exist."""
    import tomllib

    import click

    from workers import cli

    pyproject = tomllib.loads((manifests.REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["mnemos"] == "workers.cli:main"
    group = cli.cli
    assert isinstance(group, click.Group)
    for command in ("migrate", "health", "worker"):
        assert command in group.commands, f"`mnemos {command}` is not a command"
    health_options = {opt for p in group.commands["health"].params for opt in p.opts + p.secondary_opts}
    assert "--no-models" in health_options
    (kind,) = [p for p in group.commands["worker"].params if p.name == "kind"]
    assert set(kind.type.choices) == set(WORKERS)


def _overlay(tmp_path, kustomize, body: dict) -> list[dict]:
    """Render a kustomization written to ``tmp_path`` (paths in ``body`` relative to deploy/k8s)."""
    def rel(part: str) -> str:
        return os.path.relpath(K8S / part, tmp_path)

    spec = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **body}
    spec["resources"] = [rel(r) for r in body.get("resources", [])]
    spec["components"] = [rel(c) for c in body.get("components", [])]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return kustomize(tmp_path)


def _keda_index(index: str) -> dict:
    return {"name": "mnemos-keda", "options": {"disableNameSuffixHash": True, "annotations": {
        "config.kubernetes.io/local-config": "true"}}, "literals": [f"REDIS_DATABASE_INDEX={index}"]}


def test_a_new_image_tag_makes_a_new_migration_job(kustomize, tmp_path):
    """A Job's pod template is immutable: the same name with a new image could not be applied."""
    replacements = manifests.kustomization(DEV)["replacements"]
    docs = _overlay(tmp_path, kustomize, {"resources": ["base"], "replacements": replacements,
                                          "images": [{"name": "mnemos", "newName": "mnemos", "newTag": "1.2.3-rc1"}]})
    (job,) = manifests.by_kind(docs, "Job").values()
    assert job["metadata"]["name"] == "mnemos-migrate-1.2.3-rc1"
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "mnemos:1.2.3-rc1"
    assert "mnemos-migrate-0.1.0" in manifests.by_kind(kustomize(K8S / "base"), "Job")


def test_keda_watches_the_database_of_the_redis_url(dev, kustomize, tmp_path):
    secret = _dev_generator("secretGenerator", "mnemos-connections")
    database = urlsplit(secret["MNEMOS_REDIS_URL"]).path.strip("/") or "0"
    indexes = {t["metadata"]["databaseIndex"] for so in manifests.by_kind(dev, "ScaledObject").values()
               for t in so["spec"]["triggers"]}
    assert indexes == {database}
    assert "mnemos-keda" not in manifests.by_kind(dev, "ConfigMap"), "local-config: never applied"
    docs = _overlay(tmp_path, kustomize, {"resources": ["base"], "components": ["components/keda"],
                                          "configMapGenerator": [_keda_index("3")]})
    assert {t["metadata"]["databaseIndex"] for so in manifests.by_kind(docs, "ScaledObject").values()
            for t in so["spec"]["triggers"]} == {"3"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_redis_tls_component(kustomize, tmp_path, version):
    docs = _overlay(tmp_path, kustomize, {"resources": ["base"],
                                          "components": ["components/keda", "components/redis-tls"],
                                          "configMapGenerator": [_keda_index("0")]})
    for doc in docs:
        assert not manifests.validation_errors(doc, version), manifests.describe(doc)
    for worker in WORKERS:
        deployment = manifests.by_kind(docs, "Deployment")[f"mnemos-{worker}"]
        container = _container(deployment)
        (ca,) = [e["value"] for e in container["env"] if e["name"] == "MNEMOS_REDIS_CA_FILE"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "redis-tls"]
        assert ca == f"{mount['mountPath']}/ca.crt"
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["redis-tls"]["secret"]["secretName"] == "mnemos-redis-tls"
        Settings.from_env({"MNEMOS_REDIS_URL": "rediss://:pw@redis:6380/0", "MNEMOS_REDIS_CA_FILE": ca})
    auth = manifests.by_kind(docs, "TriggerAuthentication")["mnemos-redis"]
    assert {"tls": "tls", "ca": "ca.crt"}.items() <= {r["parameter"]: r["key"] for r in auth["spec"]["secretTargetRef"]}.items()
