"""Write the kustomize overlay that runs Mnemos as N shards, each scaled by KEDA on its own backlog.

    python deploy/k8s/overlays/shards/generate.py --shards 4 [--out DIR] [--redis-database-index 0]

writes under DIR (default: this directory, which holds the output for 2 shards):

* ``shared/``: what all shards use once: ../../base without its workers and migration Job (the
  ServiceAccount, the settings ConfigMap);
* ``shard-<n>/`` for each shard ``n`` in ``0 .. N-1``: ../../base's workers (Deployments, metrics
  Services, PodDisruptionBudgets) and ../../components/keda's ScaledObjects and
  TriggerAuthentication, every name suffixed ``-shard-<n>``, the label ``mnemos/shard: "<n>"`` on
  every object and selector (so no Service, budget or spread constraint reaches another shard's
  pods), ``MNEMOS_SHARDS=N`` and ``MNEMOS_SHARD=n`` in the shard's settings ConfigMap, every
  KEDA trigger rewritten to the shard's own stream or rq queue, and every reference to the Secret
  ``mnemos-connections`` (the workers' and the shard's migration Job's URLs, the TriggerAuthentication's
  Redis address and password) rewritten to the shard's own Secret ``mnemos-connections-shard-<n>``:
  each shard's workers and KEDA triggers reach that shard's Redis and Postgres only;
* ``kustomization.yaml``, listing them.

The names come from the code: a shard's streams and queue are what ``workers.settings.Settings``
(through ``api.sharding``) derives for shard ``n`` of ``N`` from ``MNEMOS_STREAM_PREFIX`` and
``MNEMOS_QUEUE_NAME`` in ../../base/settings.env, and the queue's list is rq's own
``rq:queue:<queue>`` key. Each rewrite is a JSON patch that first tests that the trigger holds the
unsharded name, so a trigger added, moved or renamed in components/keda fails the build instead of
watching the wrong key. tests/deploy/test_k8s_shards.py fails when the committed files drift from
this generator. Raises ``ValueError`` for fewer than 2 shards: one shard is ../dev or ../../base.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
K8S = HERE.parents[1]
sys.path.insert(0, str(K8S.parents[1]))  # the repository, for the naming code below

from rq import Queue  # noqa: E402 (after the path)

from workers.settings import Settings  # noqa: E402

KUSTOMIZATION = "kustomization.yaml"
SECRET = "mnemos-connections"
SHARD_LABEL = "mnemos/shard"
WORKER_COMPONENTS = "app.kubernetes.io/component in (ingest,query,suppression)"
HEADER = ("# Written by deploy/k8s/overlays/shards/generate.py --shards {shards}: edit the generator and rerun it\n"
          "# rather than editing this file (docs/scaling.md \"KEDA per shard\", deploy/README.md \"Shards\").\n")


class _Dumper(yaml.SafeDumper):
    """Indented lists and block style for multi-line strings (the inline patches), so the output
    reads like the hand-written kustomizations."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _dump(document: dict | list) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=110)


def base_settings() -> Settings:
    """The settings of ../../base/settings.env (``Settings.from_env`` of its ``KEY=value`` lines)."""
    pairs = {}
    for line in (K8S / "base" / "settings.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value
    return Settings.from_env(pairs)


def shard_keys(settings: Settings, shard: int, shards: int) -> dict[str, str]:
    """Each Redis key a single-shard trigger watches, mapped to shard ``shard``'s key: the turns
    and outcomes streams, and rq's list of the retrievals queue.

    Raises:
        SettingsError: if ``shard`` is not within ``0 .. shards - 1``.
    """
    one = settings.replace(shards=1, shard=0)
    mine = settings.replace(shards=shards, shard=shard)
    rq_list = Queue.redis_queue_namespace_prefix
    return {one.turns_stream: mine.turns_stream, one.outcomes_stream: mine.outcomes_stream,
            rq_list + one.retrieval_queue: rq_list + mine.retrieval_queue}


def keda_scaled_objects() -> list[dict]:
    """The ScaledObjects of ../../components/keda, in the order its kustomization lists them."""
    keda = K8S / "components" / "keda"
    spec = yaml.safe_load((keda / KUSTOMIZATION).read_text())
    docs = [doc for entry in spec["resources"] for doc in yaml.safe_load_all((keda / entry).read_text()) if doc]
    return [doc for doc in docs if doc["kind"] == "ScaledObject"]


def trigger_patches(settings: Settings, shard: int, shards: int) -> list[dict]:
    """One JSON patch per ScaledObject: test, then replace, the key of each of its triggers.

    Raises:
        ValueError: if a trigger watches a key that is not one of :func:`shard_keys`.
    """
    keys = shard_keys(settings, shard, shards)
    patches = []
    for scaled in keda_scaled_objects():
        ops = []
        for index, trigger in enumerate(scaled["spec"]["triggers"]):
            for field in ("stream", "listName"):
                if field not in trigger["metadata"]:
                    continue
                key = trigger["metadata"][field]
                if key not in keys:
                    raise ValueError(f"{scaled['metadata']['name']} trigger {trigger.get('name')} watches {key!r}, "
                                     f"which is none of {sorted(keys)}")
                path = f"/spec/triggers/{index}/metadata/{field}"
                ops += [{"op": "test", "path": path, "value": key},
                        {"op": "replace", "path": path, "value": keys[key]}]
        if ops:
            patches.append({"target": {"group": "keda.sh", "kind": "ScaledObject", "name": scaled["metadata"]["name"]},
                            "patch": _dump(ops)})
    return patches


def shard_secret(shard: int) -> str:
    """The Secret of shard ``shard``'s servers: the keys of ``mnemos-connections`` (deploy/README.md "Secrets")."""
    return f"{SECRET}-shard-{shard}"


def _secret_paths(node: object, path: str = "") -> list[str]:
    """JSON-pointer paths of every ``secretRef``/``secretKeyRef``/``secretTargetRef`` name that is :data:`SECRET`."""
    found = []
    if isinstance(node, dict):
        if node.get("name") == SECRET and (path.endswith(("/secretRef", "/secretKeyRef")) or "/secretTargetRef/" in path):
            found.append(f"{path}/name")
        for key, value in node.items():
            found += _secret_paths(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _secret_paths(value, f"{path}/{index}")
    return found


def secret_patches(shard: int) -> list[dict]:
    """One JSON patch per object of ../../base and ../../components/keda that names :data:`SECRET`:
    test, then replace, each reference with :func:`shard_secret` (the Secret is the operator's, not
    part of the build, so kustomize's nameSuffix leaves the references alone)."""
    patches = []
    for directory in (K8S / "base", K8S / "components" / "keda"):
        spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
        for entry in spec["resources"]:
            for doc in yaml.safe_load_all((directory / entry).read_text()):
                paths = _secret_paths(doc) if doc else []
                if not paths:
                    continue
                ops = [op for path in paths for op in ({"op": "test", "path": path, "value": SECRET},
                                                       {"op": "replace", "path": path, "value": shard_secret(shard)})]
                group = doc["apiVersion"].rpartition("/")[0]
                target: dict[str, str] = {"group": group} if group else {}
                if doc["kind"] == "Job":  # named after the image tag by a replacement: select it by label
                    target |= {"kind": "Job", "labelSelector": "app.kubernetes.io/component=migrate"}
                else:
                    target |= {"kind": doc["kind"], "name": doc["metadata"]["name"]}
                patches.append({"target": target, "patch": _dump(ops)})
    return patches


def _delete(api_version: str, kind: str, target: dict) -> dict:
    """A patch deleting every object of ``kind`` that ``target`` selects (the patch's name is ignored)."""
    patch = {"$patch": "delete", "apiVersion": api_version, "kind": kind, "metadata": {"name": "selected"}}
    return {"target": {"kind": kind, **target}, "patch": _dump(patch)}


def _relative(target: Path, directory: Path) -> str:
    return Path(os.path.relpath(target, directory)).as_posix()


def shared_kustomization(directory: Path) -> dict:
    """../../base without the workers and the migration Job (each shard migrates its own database):
    the objects every shard uses once."""
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [_relative(K8S / "base", directory)],
            "patches": [*(_delete(version, kind, {"labelSelector": WORKER_COMPONENTS}) for version, kind in (
                ("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"))),
                _delete("batch/v1", "Job", {"labelSelector": "app.kubernetes.io/component=migrate"})]}


def shard_kustomization(settings: Settings, shard: int, shards: int, directory: Path, database_index: str) -> dict:
    """Shard ``shard`` of ``shards``: the workers and their ScaledObjects (see the module docstring)."""
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [_relative(K8S / "base", directory)],
        "components": [_relative(K8S / "components" / "keda", directory)],
        "nameSuffix": f"-shard-{shard}",
        "labels": [{"pairs": {SHARD_LABEL: str(shard)}, "includeSelectors": True}],
        "configMapGenerator": [
            {"name": "mnemos-settings", "behavior": "merge",
             "literals": [f"MNEMOS_SHARDS={shards}", f"MNEMOS_SHARD={shard}"]},
            {"name": "mnemos-keda", "options": {"disableNameSuffixHash": True, "annotations": {
                "config.kubernetes.io/local-config": "true"}}, "literals": [f"REDIS_DATABASE_INDEX={database_index}"]},
        ],
        "patches": [_delete("v1", "ServiceAccount", {"name": "mnemos"}),
                    *trigger_patches(settings, shard, shards), *secret_patches(shard)],
    }


def render(shards: int, out: Path = HERE, database_index: str = "0") -> dict[Path, str]:
    """The text of every file the overlay for ``shards`` shards holds, keyed by its path under ``out``.

    Raises:
        ValueError: if ``shards`` < 2 or ``database_index`` is not a whole number.
    """
    if shards < 2:
        raise ValueError(f"a sharded overlay needs at least 2 shards, got {shards}: one shard is ../dev or ../../base")
    if not database_index.isdigit():
        raise ValueError(f"the Redis database index must be a whole number, got {database_index!r}")
    out = out.resolve()
    settings = base_settings()
    header = HEADER.format(shards=shards)
    files = {out / "shared" / KUSTOMIZATION: header + _dump(shared_kustomization(out / "shared"))}
    for shard in range(shards):
        directory = out / f"shard-{shard}"
        files[directory / KUSTOMIZATION] = header + _dump(
            shard_kustomization(settings, shard, shards, directory, database_index))
    top = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": ["shared", *(f"shard-{shard}" for shard in range(shards))]}
    files[out / KUSTOMIZATION] = header + _dump(top)
    return files


def write(files: dict[Path, str], out: Path = HERE) -> None:
    """Write ``files`` and remove the kustomization of every ``shard-<n>`` under ``out`` they do not hold
    (what a larger N wrote before)."""
    for stale in out.resolve().glob(f"shard-*/{KUSTOMIZATION}"):
        if stale not in files:
            stale.unlink()
            if not any(stale.parent.iterdir()):
                stale.parent.rmdir()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, required=True, help="number of shards N (at least 2)")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write (default: beside this script)")
    parser.add_argument("--redis-database-index", default="0",
                        help="the database of MNEMOS_REDIS_URL, which KEDA's triggers read (default 0)")
    args = parser.parse_args(argv)
    try:
        files = render(args.shards, args.out, args.redis_database_index)
    except ValueError as exc:
        parser.error(str(exc))
    write(files, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
