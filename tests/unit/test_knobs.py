"""One declaration per knob (docs/architecture.md "Where a knob's default lives").

The README's settings table and ``Settings`` agree both ways, with the same defaults; a default the
core or the client also has is written once, there, and ``workers/settings.py`` takes it by import
(no second literal anywhere); a request that names no ``k`` gets ``MNEMOS_DEFAULT_K``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import redis

import api.client
from api.client import MnemosClient
from api.schemas import RetrievalRequest
from api.validation import DEFAULT_K, MAX_K, Limits, limits_of
from mnemos.dedupe import DEFAULT_THRESHOLD
from mnemos.fusion import DEFAULT_RRF_K
from mnemos.packets import PacketConfig
from mnemos.pipeline import RetrievalConfig
from mnemos.suppression import DEFAULT_BOOTSTRAP_FACTOR, DEFAULT_CLUSTERS_K, DEFAULT_ETA, DEFAULT_UPDATE_RULE
from workers.settings import ENV_VARS, Settings

REPO = Path(__file__).resolve().parents[2]
SETTINGS_SOURCE = REPO / "workers" / "settings.py"
_ROW = re.compile(r"^\| `(MNEMOS_[A-Z0-9_]+)` \| `([^`]*)` \|", re.MULTILINE)

SERVICE_OWN = {"convex_weight": "0.6 was chosen for the service on LoCoMo's dev split; the core's 0.5 is the "
                                "bench arm's placeholder, replaced by each quality run's own choice"}
"""Settings fields named like a core knob whose default is deliberately the service's own."""


def _readme_table() -> dict[str, str]:
    """variable -> documented default, from the table of the README's "Configuration" section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = _ROW.findall(section)
    table = dict(rows)
    assert len(table) == len(rows), "a variable has two rows in the README's settings table"
    return table


def _knobs() -> list[str]:
    return [f.name for f in fields(Settings) if f.name != "from_environment"]


def test_every_documented_variable_is_read_by_the_settings() -> None:
    unread = sorted(set(_readme_table()) - set(ENV_VARS.values()))
    assert unread == [], f"the README documents variables no setting reads: {unread}"


def test_every_variable_the_settings_read_is_documented() -> None:
    undocumented = sorted(set(ENV_VARS.values()) - set(_readme_table()))
    assert undocumented == [], f"settings the README's table lacks: {undocumented}"


def test_every_documented_default_is_the_code_default() -> None:
    table, defaults = _readme_table(), Settings()
    wrong = {ENV_VARS[name]: (table[ENV_VARS[name]], f"{getattr(defaults, name)}") for name in _knobs()
             if ENV_VARS[name] in table and table[ENV_VARS[name]] != f"{getattr(defaults, name)}"}
    assert wrong == {}, f"README default != code default (documented, code): {wrong}"


def _core_twins() -> dict[str, object]:
    """Settings field -> the default the core or the client declares for the same knob, found by name:
    a ``RetrievalConfig`` or ``Limits`` field of the same name, a ``PacketConfig`` field behind ``packet_``,
    and the named constants of the knobs that have no config object."""
    twins: dict[str, object] = {}
    for name in _knobs():
        for owner, own in ((RetrievalConfig, name), (Limits, name), (PacketConfig, name.removeprefix("packet_"))):
            field = owner.__dataclass_fields__.get(own)
            if field is not None and field.default is not MISSING and name not in SERVICE_OWN:
                twins[name] = field.default
    twins["fusion"] = RetrievalConfig.fusion.value
    twins.update(default_k=DEFAULT_K, eta=DEFAULT_ETA, update_rule=DEFAULT_UPDATE_RULE.value,
                 clusters_k=DEFAULT_CLUSTERS_K, bootstrap_factor=DEFAULT_BOOTSTRAP_FACTOR, dedupe_threshold=DEFAULT_THRESHOLD)
    return twins


def test_the_twins_cover_the_knobs_the_issue_named() -> None:
    twins = _core_twins()
    assert {"rrf_k", "default_k", "max_k", "n_candidates", "pool_size", "alpha", "packet_mmr_lambda",
            "max_text_bytes", "eta"} <= set(twins)
    assert (twins["rrf_k"], twins["default_k"], twins["max_k"]) == (DEFAULT_RRF_K, DEFAULT_K, MAX_K)


@pytest.mark.parametrize("name", sorted(_core_twins()))
def test_a_settings_default_is_the_core_or_client_default_itself(name: str) -> None:
    """The very object (a float or a string written twice would be two objects; small ints are checked
    by the source walk below)."""
    assert Settings.__dataclass_fields__[name].default is _core_twins()[name]


def _settings_defaults() -> dict[str, ast.expr]:
    """Field name -> the default's expression, as written in ``class Settings``."""
    tree = ast.parse(SETTINGS_SOURCE.read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings").body
    return {n.target.id: n.value for n in body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None}


def _is_literal(node: ast.expr) -> bool:
    """A number, string or arithmetic of them (``32 * 1024``, ``-1``); None is "no value", not a literal."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) and _is_literal(node.right)
    return False


@pytest.mark.parametrize("name", sorted(_core_twins()))
def test_settings_name_the_twin_instead_of_writing_a_literal(name: str) -> None:
    default = _settings_defaults()[name]
    assert not _is_literal(default), (f"workers/settings.py restates {name} = {ast.unparse(default)}; "
                                      "take it from the core or api.validation")


KNOB_NAMES = {"rrf_k", "default_k", "max_k", "k"}
LITERAL_ALLOWED = {("mnemos/evaluation.py", "ndcg_at_k"): "the metric's cutoff (NDCG@10), not a request's k",
                   ("workers/ops/demo.py", "run_demo"): "the demo's own number of hits to show"}


def _literal_knobs(path: Path) -> list[str]:
    """``name = literal`` of a knob in ``path``: a parameter default, a class field or a call keyword."""
    rel = path.relative_to(REPO).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        pairs: list[tuple[str, ast.expr | None]] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if (rel, node.name) in LITERAL_ALLOWED:
                continue
            args = node.args.posonlyargs + node.args.args
            pairs += [(a.arg, d) for a, d in zip(args[len(args) - len(node.args.defaults):], node.args.defaults,
                                                 strict=True)]
            pairs += [(a.arg, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs.append((node.target.id, node.value))
        elif isinstance(node, ast.keyword) and node.arg in KNOB_NAMES - {"k"}:
            pairs.append((node.arg, node.value))
        found += [f"{rel}:{getattr(value, 'lineno', '?')}: {name} = {ast.unparse(value)}" for name, value in pairs
                  if name in KNOB_NAMES and value is not None and _is_literal(value)]
    return found


def test_no_source_restates_a_k_or_rrf_k_default() -> None:
    """``k``, ``default_k``, ``max_k`` and ``rrf_k`` are written once (api.validation, mnemos.fusion) and named
    everywhere else: in the core, the client, the service and the integrations."""
    offenders = [line for package in ("mnemos", "api", "workers", "integrations")
                 for path in sorted((REPO / package).rglob("*.py")) for line in _literal_knobs(path)]
    assert offenders == []


def test_the_walk_sees_a_restated_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    source = tmp_path / "sample.py"
    source.write_text("class C:\n    rrf_k: int = 60\n\ndef f(q, k=10, *, max_k=None):\n    return g(rrf_k=60)\n",
                      encoding="utf-8")
    assert sorted(line.split(": ", 1)[1] for line in _literal_knobs(source)) == ["k = 10", "rrf_k = 60", "rrf_k = 60"]
    assert _is_literal(ast.parse("32 * 1024", mode="eval").body) and not _is_literal(ast.parse("Limits.max_k",
                                                                                              mode="eval").body)


def test_a_request_without_k_gets_the_deployments_default_k() -> None:
    limits = limits_of(Settings(default_k=7))
    assert limits.default_k == 7
    assert RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "q"}, limits).k == 7  # the query worker's parse
    assert RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "q"}).k == DEFAULT_K
    assert RetrievalRequest("t", "q").k == DEFAULT_K


class _Sent(Exception):
    """Raised by the stand-in parse: carries the payload the client was about to validate and send."""


def test_the_client_fills_in_its_limits_default_k(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(payload: dict, limits: Limits) -> RetrievalRequest:
        raise _Sent(payload)

    monkeypatch.setattr(api.client.RetrievalRequest, "parse", staticmethod(parse))
    client = MnemosClient(redis.Redis(), limits=limits_of(Settings(default_k=7)))
    for kwargs, sent in (({}, 7), ({"k": 3}, 3), ({"k": None}, None)):  # an explicit None is refused by parse
        with pytest.raises(_Sent) as caught:
            client.retrieve("t", "q", **kwargs)
        assert caught.value.args[0]["k"] == sent
    with pytest.raises(_Sent) as caught:
        MnemosClient(redis.Redis()).retrieve("t", "q")
    assert caught.value.args[0]["k"] == DEFAULT_K


def test_the_mcp_tools_default_to_the_one_default_k() -> None:
    pytest.importorskip("mcp")
    import inspect

    from integrations.mcp_server.server import build_server
    from integrations.mcp_server.tools import MemoryTools

    assert inspect.signature(MemoryTools.__init__).parameters["default_k"].default is DEFAULT_K
    assert inspect.signature(build_server).parameters["max_k"].default is MAX_K
