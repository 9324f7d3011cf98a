"""Structure checks over the source: who may import whom, and no machine paths in committed files.

docs/architecture.md "Modules" states the layering these tests hold: the pure core (``mnemos``)
imports none of the other parts; the service (``workers``) and the client (``api``) never import
the benchmark part (``bench``), which reaches the CLI only as an entry-point plugin.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _modules(package: str) -> Iterator[Path]:
    yield from sorted((REPO / package).rglob("*.py"))


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import statement in ``path``, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def _offenders(package: str, forbidden: set[str]) -> list[str]:
    return [f"{path.relative_to(REPO)}:{line} imports {name}"
            for path in _modules(package) for line, name in _imported(path)
            if name.split(".")[0] in forbidden]


def test_the_walker_sees_imports_inside_functions() -> None:
    found = {name for _, name in _imported(REPO / "workers" / "cli.py")}
    assert {"click", "workers.supervisor"} <= found  # the second one inside a command function


@pytest.mark.parametrize("package", ["workers", "api"])
def test_the_service_and_the_client_never_import_bench(package: str) -> None:
    assert _offenders(package, {"bench"}) == []


def test_the_core_imports_no_other_part() -> None:
    assert _offenders("mnemos", {"workers", "api", "bench", "tests"}) == []


def test_the_client_does_not_import_the_service_or_the_core() -> None:
    assert _offenders("api", {"workers", "mnemos"}) == []


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"git is not usable here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return done.stdout


def _workspace_dirs() -> list[str]:
    """The parent directory of this checkout and, for a linked worktree, of the main checkout."""
    roots = {Path(_git("rev-parse", "--show-toplevel").strip())}
    common = Path(_git("rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    roots.add(common.parent)
    parents = {root.resolve().parent for root in roots}
    return sorted(str(p) for p in parents if len(p.parts) > 1)  # a checkout at / has no workspace to leak


def test_no_tracked_file_holds_an_absolute_path_of_the_workspace() -> None:
    needles = [d.rstrip("/") + "/" for d in _workspace_dirs()]
    if not needles:
        pytest.skip("the checkout sits directly under /")
    offenders = []
    for name in _git("ls-files", "-z").split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if any(needle in line for needle in needles):
                offenders.append(f"{name}:{number}: {line.strip()[:120]}")
    assert offenders == [], f"absolute paths of {needles} in tracked files:\n" + "\n".join(offenders[:40])
