"""Structure checks over the source: who may import whom, where SQL may be, how long a module or a
function may be, and no machine paths in committed files.

docs/architecture.md "Modules" states the layering these tests hold: the pure core (``mnemos``)
imports none of the other parts; the service (``workers``) and the client (``api``) never import
the benchmark part (``bench``), which reaches the CLI only as an entry-point plugin. Inside the
service and the benchmark part, the rooms (sub-packages) are layered: a room imports only rooms below
it, never a sibling (``WORKERS_LAYERS``, ``BENCH_LAYERS``). Every SQL statement lives in the store
(``workers/store/``) or in ``migrations/``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tempfile
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
    assert {"click", "workers.launch.supervisor"} <= found  # the second one inside a command function


@pytest.mark.parametrize("package", ["workers", "api"])
def test_the_service_and_the_client_never_import_bench(package: str) -> None:
    assert _offenders(package, {"bench"}) == []


def test_the_core_imports_no_other_part() -> None:
    assert _offenders("mnemos", {"workers", "api", "bench", "tests"}) == []


def test_the_client_does_not_import_the_service_or_the_core() -> None:
    assert _offenders("api", {"workers", "mnemos"}) == []


@pytest.mark.parametrize("package", ["mnemos", "workers", "api", "bench"])
def test_nothing_of_the_project_imports_the_integrations(package: str) -> None:
    assert _offenders(package, {"integrations"}) == []


def test_the_integrations_reach_the_workers_only_through_the_client() -> None:
    """integrations/ use the client (api) and the core never; of the service, the MCP command reads its
    settings and serves metrics like a worker, the LangChain adapters nothing (docs/architecture.md "Agents")."""
    assert _offenders("integrations", {"mnemos", "bench", "tests"}) == []
    allowed = {"workers.settings", "workers.runtime.errors", "workers.runtime.metrics", "workers.runtime.connections"}
    used = {name for path in _modules("integrations") for _, name in _imported(path) if name.startswith("workers")}
    assert used <= allowed, used - allowed
    assert _offenders("integrations/langchain", {"workers"}) == []


WORKERS_TOP = {"__init__.py", "__main__.py", "cli.py", "settings.py"}
WORKERS_WINGS = {"ingest", "query", "suppression", "ops", "launch", "runtime", "store"}


def test_the_service_top_holds_only_the_command_and_the_settings() -> None:
    """docs/architecture.md "Modules": every other module of ``workers/`` lives in the sub-package of
    what it runs with (the entry point ``workers.cli:main`` and ``workers/settings.py`` stay on top)."""
    top = REPO / "workers"
    assert {p.name for p in top.glob("*.py")} == WORKERS_TOP
    assert {p.name for p in top.iterdir() if (p / "__init__.py").is_file()} == WORKERS_WINGS


# The rooms of a part, bottom first (docs/architecture.md "Modules"): a room is a sub-package (a wing of
# workers/, a package of bench/) or a module at the part's top. A room imports only itself and rooms of
# lower layers: never one above it, never a sibling of its own layer. The base of the service is one
# room in two places: settings.py checks its URLs and shard map with runtime/ helpers, and runtime/
# reads Settings (test_import_cycles.py keeps the modules themselves out of circles).
WORKERS_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"runtime", "settings"}),  # what every process runs on
    frozenset({"store"}),  # Postgres
    frozenset({"ingest", "query", "suppression"}),  # the three workers
    frozenset({"ops"}),  # the operator commands' glue
    frozenset({"launch"}),  # the workers' entry points and mnemos up (which migrates first)
    frozenset({"cli"}),  # the mnemos command
    frozenset({"__main__"}),
)
WORKERS_ONE_ROOM = frozenset({"runtime", "settings"})
BENCH_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"common"}),  # what several benchmarks share, the service harness included
    frozenset({"training"}),  # the reranker's training, which the quality benchmark evaluates
    frozenset({"quality", "service", "speed", "scale", "faults", "packets"}),  # one package per benchmark
    frozenset({"commands"}),  # the front door: mnemos bench, reranker, data
)


def _room(path: Path, root: Path) -> str | None:
    """The room of the module at ``path`` under its part's folder ``root``: its sub-package, or the top
    module's own name (None for the part's ``__init__.py``)."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else (None if path.stem == "__init__" else path.stem)


def _imported_rooms(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, room) of every import in ``path`` of a module of ``package`` (``from package import x``
    counts as importing room ``x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = ([node.module] if "." in node.module
                     else [f"{node.module}.{alias.name}" for alias in node.names])
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == package and len(parts) > 1:
                yield node.lineno, parts[1]


def _crossings(root: Path, layers: tuple[frozenset[str], ...], one_room: frozenset[str] = frozenset()) -> list[str]:
    """Every import in the part at ``root`` of a room above the importer's or of a sibling in its layer,
    and every room no layer names."""
    layer_of = {room: i for i, rooms in enumerate(layers) for room in rooms}
    found = []
    for path in sorted(root.rglob("*.py")):
        room = _room(path, root)
        if room is None:
            continue
        if room not in layer_of:
            found.append(f"{path.relative_to(root.parent).as_posix()}: room {room} is in no layer")
            continue
        for line, other in _imported_rooms(path, root.name):
            if other == room or (room in one_room and other in one_room):
                continue
            if layer_of.get(other, len(layers)) >= layer_of[room]:
                found.append(f"{path.relative_to(root.parent).as_posix()}:{line}: {room} imports {other}")
    return found


def test_the_layer_check_sees_upward_and_sideways_imports(tmp_path: Path) -> None:
    part = tmp_path / "part"
    for room in ("low", "left", "right", "up"):
        (part / room).mkdir(parents=True)
        (part / room / "__init__.py").write_text("", encoding="utf-8")
    (part / "low" / "a.py").write_text("def f():\n    from part.up import b\n", encoding="utf-8")
    (part / "left" / "a.py").write_text("import part.low.a\nfrom part.right import a\n", encoding="utf-8")
    (part / "up" / "b.py").write_text("from part.left import a\nfrom part import low\n", encoding="utf-8")
    (part / "stray.py").write_text("", encoding="utf-8")
    layers = (frozenset({"low"}), frozenset({"left", "right"}), frozenset({"up"}))
    assert _crossings(part, layers) == [
        "part/left/a.py:2: left imports right", "part/low/a.py:2: low imports up", "part/stray.py: room stray is in no layer"]


def test_the_service_wings_import_only_downwards() -> None:
    """docs/architecture.md "Modules": runtime/ (with settings.py) at the bottom, then store/, then the three
    workers (none imports another), then ops/, then launch/, then the mnemos command."""
    assert _crossings(REPO / "workers", WORKERS_LAYERS, WORKERS_ONE_ROOM) == []
    assert {room for layer in WORKERS_LAYERS for room in layer} == WORKERS_WINGS | {"settings", "cli", "__main__"}


def test_a_benchmark_imports_no_sibling_benchmark() -> None:
    """docs/architecture.md "Modules": a benchmark's package imports bench/common/ and bench/training/,
    never another benchmark; common/ imports no other package of bench/, training/ only common/."""
    assert _crossings(REPO / "bench", BENCH_LAYERS) == []
    packages = {p.name for p in (REPO / "bench").iterdir() if (p / "__init__.py").is_file()}
    assert packages | {"commands"} == {room for layer in BENCH_LAYERS for room in layer}


# A string constant is SQL when, after leading whitespace, it opens like a statement: a keyword
# followed by what only SQL puts after it (so "Create the database" or "Select a model" in a help
# text is not SQL, while "SELECT 1", "UPDATE t SET", "DROP DATABASE {}" and "SET ROLE {}" are).
_SQL = re.compile(
    r"""\A\s*(?:
        SELECT\s+(?:\*|\d|DISTINCT\b|[\w.]+\s*(?:\(|,|\bAS\b|\bFROM\b))
      | INSERT\s+(?:OR\s+\w+\s+)?INTO\b
      | UPDATE\s+[\w.]+\s+(?:AS\s+\w+\s+)?SET\b
      | DELETE\s+FROM\b
      | (?:CREATE|DROP|ALTER|TRUNCATE)\s+(?:OR\s+REPLACE\s+|UNIQUE\s+|TEMP(?:ORARY)?\s+)?
        (?:TABLE|INDEX|DATABASE|ROLE|SCHEMA|VIEW|FUNCTION|POLICY|SEQUENCE|EXTENSION|TRIGGER|TYPE|USER)\b
      | WITH\s+(?:RECURSIVE\s+)?\w+\s*(?:\([^)]*\)\s*)?AS\s*\(
      | SET\s+(?:ROLE|SESSION|LOCAL|TRANSACTION|search_path|statement_timeout|row_security)\b
      | (?:GRANT|REVOKE)\s+[\w, ]+\s+ON\b
      | PRAGMA\s+\w+
    )""",
    re.IGNORECASE | re.VERBOSE,
)
SQL_HOMES = ("workers/store/", "migrations/")
"""Where SQL text may live. ``tests/`` is not scanned: tests check the real database (row-level
security, what the workers committed) with statements of their own, independent of the store."""


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring constant in ``tree`` (they document; they are not statements)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _sql_strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, first words) of every string constant in ``path`` that reads as SQL (f-string parts included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                and _SQL.match(node.value)):
            yield node.lineno, " ".join(node.value.split())[:60]


def _python_sources() -> Iterator[Path]:
    """The repository's Python files, except ``tests/``, hidden folders (a virtual environment) and
    build outputs."""
    for top in sorted(REPO.iterdir()):
        if top.name.startswith(".") or top.name in {"tests", "build", "dist"}:
            continue
        if top.is_dir():
            yield from sorted(top.rglob("*.py"))
        elif top.suffix == ".py":
            yield top


@pytest.mark.parametrize("text", [
    "SELECT 1", "select count(*) FROM entries", "SELECT entry_id, score FROM suppression WHERE x = %s",
    "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", "  INSERT INTO entries (a) VALUES (%s)",
    "INSERT OR REPLACE INTO t VALUES (?)", "UPDATE tenants SET memory_version = 1", "DELETE FROM t",
    "DROP DATABASE IF EXISTS {} WITH (FORCE)", "CREATE TABLE IF NOT EXISTS t (x int)", "SET ROLE {}",
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY", "WITH new AS (SELECT 1) SELECT * FROM new",
    "ALTER TABLE entries ENABLE ROW LEVEL SECURITY", "PRAGMA journal_mode=WAL", "SELECT version FROM t",
])
def test_the_sql_recogniser_sees_statements(text: str) -> None:
    assert _SQL.match(text)


@pytest.mark.parametrize("text", [
    "Create the database if needed and apply pending migrations.", "Delete every job of the queue",
    "Select the arm to run", "Update the README when a setting changes", "Commit time", "commit",
    "Truncate a sentence-transformers CrossEncoder", "with --data give exactly one of --conversations",
    "Drop the cache", "Set the weight to 2", "select", "Select models", "Do you want ideas for things to do?",
])
def test_the_sql_recogniser_ignores_prose(text: str) -> None:
    assert not _SQL.match(text)


def test_the_sql_walker_skips_docstrings_and_reads_f_strings(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text('def f(table):\n    """SELECT 1 FROM documentation"""\n'
                      '    return f"DELETE FROM {table} WHERE x = 1"\n', encoding="utf-8")
    assert [line for line, _ in _sql_strings(source)] == [3]


def test_no_sql_outside_the_store_and_the_migrations() -> None:
    offenders = [f"{path.relative_to(REPO).as_posix()}:{line}: {text}"
                 for path in _python_sources() if not path.relative_to(REPO).as_posix().startswith(SQL_HOMES)
                 for line, text in _sql_strings(path)]
    assert offenders == [], "SQL outside workers/store/ and migrations/:\n" + "\n".join(offenders)


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"git is not usable here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return done.stdout


_SHARED_DIRS = frozenset({Path(tempfile.gettempdir()).resolve(), Path("/tmp"), Path("/var/tmp")})
"""Machine-wide directories: a checkout made in one (``mktemp -d``) has the checkout itself, not
the shared directory every deployment also uses (``/tmp/huggingface``), as its workspace."""


def _workspace_dirs() -> list[str]:
    """The parent directory of this checkout and, for a linked worktree, of the main checkout (the
    checkout itself where that parent is a machine-wide directory such as the temp directory)."""
    roots = {Path(_git("rev-parse", "--show-toplevel").strip())}
    common = Path(_git("rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    roots.add(common.parent)
    dirs = {root.resolve() if root.resolve().parent in _SHARED_DIRS else root.resolve().parent for root in roots}
    return sorted(str(p) for p in dirs if len(p.parts) > 1)  # a checkout at / has no workspace to leak


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


# Size limits (docs/architecture.md "Modules"): a longer module or function is split by responsibility. Lines are
# physical lines, blank lines and comments included, docstrings excluded: documentation never
# counts against a module or a function.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by the docstrings of ``tree``'s module, classes and functions."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str) and first.end_lineno is not None):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def _sizes(path: Path, root: Path = REPO) -> Iterator[tuple[str, int, int]]:
    """(name, lines without docstrings, limit) of the module at ``path`` and of each function in it
    (methods and nested functions by their qualified name, ``Class.method``); a function's lines
    run from ``def`` to its last line, nested functions included."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    docs = _docstring_lines(tree)
    module = path.relative_to(root).as_posix()
    yield module, len(text.splitlines()) - len(docs), MAX_MODULE_LINES

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                lines = set(range(child.lineno, child.end_lineno + 1)) - docs
                yield f"{module}:{prefix}{child.name}", len(lines), MAX_FUNCTION_LINES
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def test_the_size_walker_skips_docstrings_and_names_methods(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "sample.py"
    source.write_text('"""Module\ndoc."""\n\n\nclass A:\n    def f(self):\n        """One\n\n        doc."""\n'
                      '        return 1\n', encoding="utf-8")
    sizes = {name: lines for name, lines, _ in _sizes(source, root=tmp_path)}
    assert sizes == {"pkg/sample.py": 10 - 2 - 3, "pkg/sample.py:A.f": 2}


def test_no_module_over_400_lines_and_no_function_over_80() -> None:
    over = sorted(f"{name}: {lines} lines (limit {limit})"
                  for path in _python_sources() for name, lines, limit in _sizes(path) if lines > limit)
    assert over == [], "split these by responsibility:\n" + "\n".join(over)
