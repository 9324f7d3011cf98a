"""Fixtures of the deploy tests: the metric series the code registers, and rendered kustomizations."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest

from tests.deploy import manifests


def _registries_of(module) -> list:
    """Registries holding the module's metrics: the default one, plus any built by a public factory
    that takes a ``registry`` argument (metrics kept off the global registry)."""
    from prometheus_client import REGISTRY, CollectorRegistry

    registries = [REGISTRY]
    for name, obj in vars(module).items():
        if name.startswith("_") or not callable(obj) or getattr(obj, "__module__", None) != module.__name__:
            continue
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        if "registry" not in params:
            continue
        others = [p for n, p in params.items() if n != "registry" and p.default is inspect.Parameter.empty
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if others:
            continue
        registry = CollectorRegistry()
        obj(registry=registry)
        registries.append(registry)
    return registries


@pytest.fixture(scope="session")
def registered_series() -> set[str]:
    """Every mnemos_* series name workers/runtime/metrics.py registers (histograms with _bucket/_sum/_count,
    counters with _total). Skips while the module does not exist yet."""
    if importlib.util.find_spec("workers.runtime.metrics") is None:
        pytest.skip("workers/runtime/metrics.py does not exist yet: expressions are only checked against the contract's names")
    from tests.deploy.promql import series_of_registry

    module = importlib.import_module("workers.runtime.metrics")
    names: set[str] = set()
    for registry in _registries_of(module):
        names |= {n for n in series_of_registry(registry) if n.startswith("mnemos_")}
    assert names, "workers.runtime.metrics registers no mnemos_* metric (neither globally nor through a factory)"
    return names


@pytest.fixture(scope="session")
def kustomize():
    """A function rendering a kustomization directory; skips when no kustomize binary is installed."""
    if manifests.kustomize_command() is None:
        pytest.skip("neither kustomize nor kubectl is installed: structural checks in test_k8s_structure cover it")
    return manifests.kustomize_build
