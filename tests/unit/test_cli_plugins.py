"""The service CLI finds the benchmark's command groups as entry-point plugins, never by import.

``pyproject.toml`` declares ``bench``, ``reranker`` and ``data`` (the benchmark part) and ``mcp`` (the
agents' MCP server, integrations/) under ``mnemos.commands``; :func:`workers.cli.register_plugins` adds
what loads and leaves out a group whose extra is missing. ``mnemos mcp`` loads without its extra and
says which one is missing when run.
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import bench.common.extras
from workers.cli import COMMANDS_GROUP, register_plugins

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _declared() -> list[EntryPoint]:
    table = PYPROJECT["project"]["entry-points"][COMMANDS_GROUP]
    return [EntryPoint(name, value, COMMANDS_GROUP) for name, value in table.items()]


def _service_group() -> click.Group:
    @click.group()
    def root() -> None:
        """A stand-in for the service CLI."""

    @root.command()
    def migrate() -> None:
        """A service command."""

    return root


def test_pyproject_declares_the_benchmark_groups_and_the_mcp_command() -> None:
    assert {point.name: point.value for point in _declared()} == {
        "bench": "bench.commands:bench", "reranker": "bench.commands:reranker", "data": "bench.commands:data",
        "mcp": "integrations.mcp_server.command:mcp"}


def test_declared_groups_load_and_register() -> None:
    root = _service_group()
    assert sorted(register_plugins(root, _declared())) == ["bench", "data", "mcp", "reranker"]
    assert {"quality", "service", "speed", "faults"} <= set(root.commands["bench"].commands)  # type: ignore[attr-defined]
    assert {"train", "check", "pools"} <= set(root.commands["reranker"].commands)  # type: ignore[attr-defined]
    out = CliRunner().invoke(root, ["bench", "faults", "--help"])
    assert out.exit_code == 0 and "--redis-restarts" in out.output


def test_a_missing_bench_extra_leaves_the_groups_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(bench.common.extras.EXTRA_MODULES, "bench", ("matplotlib", "mnemos_no_such_module"))
    monkeypatch.delitem(sys.modules, "bench.commands", raising=False)
    root = _service_group()
    assert register_plugins(root, _declared()) == ["mcp"]  # not part of the benchmark
    assert set(root.commands) == {"migrate", "mcp"}
    out = CliRunner().invoke(root, ["bench", "quality", "--help"])
    assert out.exit_code == 2 and "No such command 'bench'" in out.output


def test_require_extra_names_the_extra_and_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(bench.common.extras.EXTRA_MODULES, "train", ("json", "mnemos_no_such_module"))
    with pytest.raises(ModuleNotFoundError, match=r"'train' extra .*mnemos_no_such_module.*mnemos\[train\]"):
        bench.common.extras.require_extra("train")
    bench.common.extras.require_extra("bench")  # installed here (make test installs both extras)


def test_a_plugin_that_is_not_a_command_is_refused() -> None:
    with pytest.raises(TypeError, match="not a click command"):
        register_plugins(_service_group(), [EntryPoint("odd", "bench.common.extras:EXTRA_MODULES", COMMANDS_GROUP)])


def test_an_existing_command_is_never_replaced() -> None:
    root = _service_group()
    assert register_plugins(root, [EntryPoint("migrate", "bench.commands:bench", COMMANDS_GROUP)]) == []
    assert root.commands["migrate"].help == "A service command."


def test_extras_hold_what_only_the_benchmark_and_training_import() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    core = " ".join(PYPROJECT["project"]["dependencies"])

    def names(requirements: list[str]) -> tuple[str, ...]:
        return tuple(r.split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements)

    for extra, modules in bench.common.extras.EXTRA_MODULES.items():
        assert names(extras[extra]) == modules, f"pyproject [{extra}] and bench/common/extras.py differ"
        for module in modules:
            assert module not in core, f"{module} is a core dependency but only the {extra} extra needs it"
    assert "pydantic" not in core


def test_mcp_without_its_extra_says_which_install_brings_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from integrations.mcp_server.command import require_sdk
    from workers.runtime.errors import SettingsError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("mcp") else real(name, *a))
    with pytest.raises(SettingsError, match=r"'mcp' extra .*mnemos\[mcp\]"):
        require_sdk()
