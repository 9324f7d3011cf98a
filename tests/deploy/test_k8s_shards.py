"""deploy/k8s/overlays/shards: N shards, each with its own workers, scaled by KEDA on its own backlog.

The committed overlay (2 shards) is what its generate.py writes. Rendered, every shard's Deployments
run with ``MNEMOS_SHARDS=N`` and ``MNEMOS_SHARD=n``, and every ScaledObject scales its own shard's
Deployment on the Redis key that shard's workers read, as the code names it: the expected names
come from ``api.sharding`` (and rq's list prefix and the consumer groups of ``workers.ingest.worker`` and
``workers.suppression.worker``), and are checked again against ``Settings`` built from the environment the
shard's pods get. Every shard's workers, migration Job and KEDA TriggerAuthentication read the
shard's own Secret ``mnemos-connections-shard-<n>`` (its Redis address and URLs), so each shard's
triggers watch that shard's Redis. ``test_the_checks_catch_a_miswired_shard`` shows that the checks fail on a broken
overlay. Rendering needs kustomize or kubectl (skipped otherwise, like test_k8s_build.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from rq import Queue

from api import sharding
from tests.deploy import manifests
from tests.deploy.manifests import K8S, K8S_VERSIONS, KUSTOMIZATION, WORKERS
from tests.deploy.test_k8s_build import SETTINGS
from workers.ingest import worker as ingest
from workers.settings import Settings
from workers.suppression import worker as suppression

SHARDS_DIR = K8S / "overlays" / "shards"
SHARD_LABEL = "mnemos/shard"


@pytest.fixture(scope="module")
def generator():
    yield from manifests.script_module(SHARDS_DIR / "generate.py", "mnemos_shards_generate")


@pytest.fixture(scope="module")
def sharded(kustomize):
    return kustomize(SHARDS_DIR)


def _key(trigger: dict) -> tuple[str, str | None]:
    """What a trigger watches: (stream, consumer group) or (rq list, None)."""
    metadata = trigger["metadata"]
    if trigger["type"] == "redis-streams":
        return metadata["stream"], metadata["consumerGroup"]
    return metadata["listName"], None


def _expected_key(worker: str, shard: int, shards: int) -> tuple[str, str | None]:
    """The key shard ``shard``'s ``worker`` reads, named by api.sharding (the single source of the names)."""
    prefix, queue = SETTINGS.stream_prefix, SETTINGS.queue_name
    return {"ingest": (sharding.turns_stream(prefix, shard, shards), ingest.GROUP),
            "suppression": (sharding.outcomes_stream(prefix, shard, shards), suppression.GROUP),
            "query": (Queue.redis_queue_namespace_prefix + sharding.queue_name(queue, shard, shards), None)}[worker]


def _key_read_by(worker: str, settings: Settings) -> tuple[str, str | None]:
    """The key a worker started with ``settings`` reads."""
    return {"ingest": (settings.turns_stream, ingest.GROUP),
            "suppression": (settings.outcomes_stream, suppression.GROUP),
            "query": (Queue.redis_queue_namespace_prefix + settings.retrieval_queue, None)}[worker]


def _pod_env(deployment: dict, docs: list[dict]) -> dict[str, str]:
    """The literal environment of a Deployment's container: its ConfigMaps' data, then its env values."""
    config_maps = manifests.by_kind(docs, "ConfigMap")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config_maps[source["configMapRef"]["name"]]["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def _shard_problems(docs: list[dict], shards: int) -> list[str]:
    """Every way a rendered N-shard overlay fails to run each shard's workers on that shard's keys."""
    problems = []
    deployments, scaled = manifests.by_kind(docs, "Deployment"), manifests.by_kind(docs, "ScaledObject")
    auths = manifests.by_kind(docs, "TriggerAuthentication")
    names = {f"mnemos-{worker}-shard-{shard}" for worker in WORKERS for shard in range(shards)}
    if set(deployments) != names or set(scaled) != names:
        problems.append(f"Deployments {sorted(deployments)} and ScaledObjects {sorted(scaled)} are not {sorted(names)}")
    for shard in range(shards):
        for worker in WORKERS:
            name = f"mnemos-{worker}-shard-{shard}"
            if name not in deployments or name not in scaled:
                continue
            env = _pod_env(deployments[name], docs)
            if (env.get("MNEMOS_SHARDS"), env.get("MNEMOS_SHARD")) != (str(shards), str(shard)):
                problems.append(f"{name} runs with MNEMOS_SHARDS={env.get('MNEMOS_SHARDS')} "
                                f"MNEMOS_SHARD={env.get('MNEMOS_SHARD')}")
            if scaled[name]["spec"]["scaleTargetRef"]["name"] != name:
                problems.append(f"ScaledObject {name} scales {scaled[name]['spec']['scaleTargetRef']['name']}")
            watched = {_key(trigger) for trigger in scaled[name]["spec"]["triggers"]}
            expected = _expected_key(worker, shard, shards)
            if watched != {expected}:
                problems.append(f"ScaledObject {name} watches {sorted(watched, key=str)}, not {expected}")
            if _key_read_by(worker, Settings.from_env(env)) != expected:
                problems.append(f"{name}'s pods read {_key_read_by(worker, Settings.from_env(env))}, not {expected}")
            for trigger in scaled[name]["spec"]["triggers"]:
                if trigger["authenticationRef"]["name"] not in auths:
                    problems.append(f"{name} trigger {trigger['name']} uses a missing TriggerAuthentication")
    return problems + _secret_problems(docs, shards) + _sharing_problems(docs)


def _secret_names(node: object) -> set[str]:
    """The names of every Secret ``node`` refers to (envFrom secretRef, env secretKeyRef, KEDA secretTargetRef)."""
    if isinstance(node, list):
        return set().union(*(_secret_names(v) for v in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node[k]["name"] for k in ("secretRef", "secretKeyRef") if isinstance(node.get(k), dict)}
    found |= {ref["name"] for ref in node.get("secretTargetRef", [])}
    return found.union(*(_secret_names(v) for v in node.values()))


def _secret_problems(docs: list[dict], shards: int) -> list[str]:
    """A shard's workers, migration Job or triggers reading another Secret than the shard's own."""
    problems = []
    auths = manifests.by_kind(docs, "TriggerAuthentication")
    for kind in ("Deployment", "Job", "TriggerAuthentication"):
        for name, doc in manifests.by_kind(docs, kind).items():
            shard = doc["metadata"].get("labels", {}).get(SHARD_LABEL)
            if _secret_names(doc) != {f"mnemos-connections-shard-{shard}"}:
                problems.append(f"{kind} {name} (shard {shard}) reads the Secrets {sorted(_secret_names(doc))}")
    for name, scaled in manifests.by_kind(docs, "ScaledObject").items():
        for trigger in scaled["spec"]["triggers"]:
            auth = auths.get(trigger["authenticationRef"]["name"], {})
            if _secret_names(auth) != {f"mnemos-connections-shard-{name.rsplit('-', 1)[1]}"}:
                problems.append(f"ScaledObject {name} reaches Redis through the Secrets {sorted(_secret_names(auth))}")
    if len(manifests.by_kind(docs, "Job")) != shards:
        problems.append(f"migration Jobs {sorted(manifests.by_kind(docs, 'Job'))}: not one per shard")
    return problems


def _sharing_problems(docs: list[dict]) -> list[str]:
    """Two ScaledObjects with one key or one target, or a selector that reaches another shard's pods."""
    problems = []
    owners: dict[object, set[str]] = {}
    for name, scaled in manifests.by_kind(docs, "ScaledObject").items():
        owners.setdefault(("target", scaled["spec"]["scaleTargetRef"]["name"]), set()).add(name)
        for trigger in scaled["spec"]["triggers"]:
            owners.setdefault(_key(trigger), set()).add(name)
    problems += [f"{what} is shared by {sorted(names)}" for what, names in owners.items() if len(names) > 1]
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in manifests.by_kind(docs, "Deployment").items()}
    selectors = {f"Deployment {n}": d["spec"]["selector"]["matchLabels"]
                 for n, d in manifests.by_kind(docs, "Deployment").items()}
    selectors |= {f"Service {n}": d["spec"]["selector"] for n, d in manifests.by_kind(docs, "Service").items()}
    selectors |= {f"PodDisruptionBudget {n}": d["spec"]["selector"]["matchLabels"]
                  for n, d in manifests.by_kind(docs, "PodDisruptionBudget").items()}
    for what, selector in selectors.items():
        selected = [name for name, labels in pods.items() if selector.items() <= labels.items()]
        if len(selected) != 1 or selected[0] != what.split()[1].replace("-metrics", ""):
            problems.append(f"{what} selects the pods of {selected}")
    return problems


# --- the generator -----------------------------------------------------------------------------------

def test_committed_overlay_is_what_the_generator_writes(generator):
    committed = {path: path.read_text() for path in SHARDS_DIR.rglob(KUSTOMIZATION)}
    written = generator.render(2)
    assert sorted(written) == sorted(committed), "run python deploy/k8s/overlays/shards/generate.py --shards 2"
    for path, text in written.items():
        assert committed[path] == text, f"{path.relative_to(K8S)} is stale: run generate.py --shards 2"


@pytest.mark.parametrize(("shards", "index"), [(1, "0"), (0, "0"), (2, "x")])
def test_the_generator_refuses_one_shard_and_a_bad_database_index(generator, shards, index):
    with pytest.raises(ValueError):
        generator.render(shards, database_index=index)


def test_the_generator_removes_the_shards_a_larger_n_wrote(generator, tmp_path):
    generator.write(generator.render(3, tmp_path), tmp_path)
    generator.write(generator.render(2, tmp_path), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [KUSTOMIZATION, "shard-0", "shard-1", "shared"]


# --- the rendered overlay ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_overlay_renders_valid_objects(sharded, version):
    for doc in sharded:
        errors = manifests.validation_errors(doc, version)
        assert not errors, f"{manifests.describe(doc)} (Kubernetes {version}):\n" + "\n".join(errors)


def test_each_shard_runs_its_workers_on_its_own_keys(sharded):
    assert _shard_problems(sharded, 2) == []
    # spelled out for shard 1 of 2, so the check above cannot pass vacuously
    scaled = manifests.by_kind(sharded, "ScaledObject")["mnemos-query-shard-1"]
    assert [_key(t) for t in scaled["spec"]["triggers"]] == [
        (Queue.redis_queue_namespace_prefix + sharding.queue_name(SETTINGS.queue_name, 1, 2), None)]
    for worker in WORKERS:
        deployment = manifests.by_kind(sharded, "Deployment")[f"mnemos-{worker}-shard-1"]
        assert deployment["spec"]["selector"]["matchLabels"][SHARD_LABEL] == "1"
        assert {"MNEMOS_SHARDS": "2", "MNEMOS_SHARD": "1"}.items() <= _pod_env(deployment, sharded).items()


def test_every_shard_key_carries_the_shards_hash_tag(sharded):
    """Redis Cluster hashes only the text inside the first {...}: a shard's keys share one slot."""
    for name, scaled in manifests.by_kind(sharded, "ScaledObject").items():
        shard = name.rsplit("-", 1)[1]
        for trigger in scaled["spec"]["triggers"]:
            key = _key(trigger)[0]
            assert key[key.index("{") + 1:key.index("}")] == f"shard-{shard}", key


def test_shared_objects_exist_once(sharded):
    assert sorted(manifests.by_kind(sharded, "Job")) == [f"mnemos-migrate-0.1.0-shard-{n}" for n in range(2)], \
        "each shard migrates its own database"
    assert list(manifests.by_kind(sharded, "ServiceAccount")) == ["mnemos"]
    for deployment in manifests.by_kind(sharded, "Deployment").values():
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "mnemos"
    assert not [n for n in manifests.by_kind(sharded, "ConfigMap") if n.startswith("mnemos-keda")], "local-config"


def _swap_query_lists(docs: list[dict]) -> None:
    scaled = manifests.by_kind(docs, "ScaledObject")
    first, second = (scaled[f"mnemos-query-shard-{n}"]["spec"]["triggers"][0]["metadata"] for n in (0, 1))
    first["listName"], second["listName"] = second["listName"], first["listName"]


def _retarget(docs: list[dict]) -> None:
    manifests.by_kind(docs, "ScaledObject")["mnemos-ingest-shard-1"]["spec"]["scaleTargetRef"]["name"] = \
        "mnemos-ingest-shard-0"


def _wrong_shard_setting(docs: list[dict]) -> None:
    for name, config_map in manifests.by_kind(docs, "ConfigMap").items():
        if name.startswith("mnemos-settings-shard-1-"):
            config_map["data"]["MNEMOS_SHARD"] = "0"


def _unsharded_stream(docs: list[dict]) -> None:
    trigger = manifests.by_kind(docs, "ScaledObject")["mnemos-suppression-shard-0"]["spec"]["triggers"][0]
    trigger["metadata"]["stream"] = SETTINGS.outcomes_stream


def _shared_selector(docs: list[dict]) -> None:
    manifests.by_kind(docs, "PodDisruptionBudget")["mnemos-query-shard-0"]["spec"]["selector"]["matchLabels"].pop(
        SHARD_LABEL)


def _other_shard_s_redis(docs: list[dict]) -> None:
    auth = manifests.by_kind(docs, "TriggerAuthentication")["mnemos-redis-shard-1"]
    auth["spec"]["secretTargetRef"][0]["name"] = "mnemos-connections-shard-0"


def _unsharded_secret(docs: list[dict]) -> None:
    container = manifests.by_kind(docs, "Deployment")["mnemos-query-shard-1"]["spec"]["template"]["spec"]["containers"][0]
    next(s for s in container["envFrom"] if "secretRef" in s)["secretRef"]["name"] = "mnemos-connections"


@pytest.mark.parametrize("mutate", [_swap_query_lists, _retarget, _wrong_shard_setting, _unsharded_stream,
                                    _shared_selector, _other_shard_s_redis, _unsharded_secret],
                         ids=lambda f: f.__name__.strip("_"))
def test_the_checks_catch_a_miswired_shard(sharded, mutate: Callable[[list[dict]], None]):
    docs = copy.deepcopy(sharded)
    mutate(docs)
    assert _shard_problems(docs, 2)


def test_the_generator_writes_any_number_of_shards(generator, kustomize, tmp_path):
    generator.write(generator.render(3, tmp_path, database_index="2"), tmp_path)
    docs = kustomize(tmp_path)
    assert _shard_problems(docs, 3) == []
    assert {t["metadata"]["databaseIndex"] for so in manifests.by_kind(docs, "ScaledObject").values()
            for t in so["spec"]["triggers"]} == {"2"}
