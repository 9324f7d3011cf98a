"""Bearer tokens of ``mnemos mcp --transport http``: parsing, refusals and the comparison."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the mcp extra is not installed")

from integrations.mcp_server import tokens as tokens_module  # noqa: E402
from integrations.mcp_server.tokens import TenantTokenVerifier, TokenTable  # noqa: E402
from workers.runtime.errors import SettingsError  # noqa: E402
from workers.settings import Settings  # noqa: E402

A = "a" * 16 + "-alice"
B = "b" * 16 + "-bob"


def test_each_token_names_its_tenant_and_every_entry_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    table = TokenTable({A: "alice", B: "bob", "c" * 20: "carol"})
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(x: bytes, y: bytes) -> bool:
        calls.append(1)
        return real(x, y)

    monkeypatch.setattr(tokens_module.hmac, "compare_digest", counting)
    assert table.tenant_of(A) == "alice"
    assert len(calls) == 3  # no early exit at the first match
    assert table.tenant_of(B) == "bob" and table.tenant_of(A[:-1]) is None and table.tenant_of("") is None
    access = asyncio.run(TenantTokenVerifier(table).verify_token(B))
    assert access is not None and access.subject == "bob" and access.client_id == "bob"
    assert asyncio.run(TenantTokenVerifier(table).verify_token("nope" * 5)) is None


@pytest.mark.parametrize("tokens, message", [
    ({"short": "alice"}, "at least 16"), ({"with space in it ok": "alice"}, "whitespace"),
    ({A: ""}, "invalid tenant"), ({A: "bad\x00id"}, "invalid tenant"),
    ({A: "al\u200bice"}, "render as nothing"), ({A: "jose\u0301"}, "NFKC"),
])
def test_weak_tokens_and_bad_tenants_are_refused(tokens: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        TokenTable(tokens)


def test_tokens_come_from_the_file_and_the_setting_together(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({A: "alice"}), encoding="utf-8")
    table = TokenTable.from_settings(Settings(mcp_tokens_file=str(path), mcp_tokens=json.dumps({B: "bob"})))
    assert len(table) == 2 and table.tenant_of(B) == "bob"
    with pytest.raises(SettingsError, match="two tenants"):
        TokenTable.from_settings(Settings(mcp_tokens_file=str(path), mcp_tokens=json.dumps({A: "mallory"})))
    with pytest.raises(SettingsError, match="needs bearer tokens"):
        TokenTable.from_settings(Settings())
    with pytest.raises(SettingsError, match="cannot read"):
        TokenTable.from_settings(Settings(mcp_tokens_file=str(tmp_path / "missing.json")))
    for text in ("[1, 2]", "{}", "not json", json.dumps({A: 7})):
        with pytest.raises(SettingsError, match="MNEMOS_MCP_TOKENS"):
            TokenTable.from_settings(Settings(mcp_tokens=text))


def test_a_token_repeated_inside_one_file_is_refused(tmp_path: Path) -> None:
    # found by a break-it session: JSON keeps the last of a repeated key, so alice's token acted for bob
    path = tmp_path / "tokens.json"
    path.write_text(f'{{"{A}": "alice", "{B}": "carol", "{A}": "bob"}}', encoding="utf-8")
    with pytest.raises(SettingsError, match="a token appears twice") as info:
        TokenTable.from_settings(Settings(mcp_tokens_file=str(path)))
    assert "'alice' and 'bob'" in str(info.value) and A not in str(info.value)  # never the whole token
    with pytest.raises(SettingsError, match="appears twice"):
        TokenTable.from_settings(Settings(mcp_tokens=f'{{"{B}": "bob", "{B}": "bob"}}'))


def test_a_tokens_file_others_can_read_is_loaded_with_one_warning(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({A: "alice"}), encoding="utf-8")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        TokenTable.from_settings(Settings(mcp_tokens_file=str(path)))
    assert caplog.records == []
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert TokenTable.from_settings(Settings(mcp_tokens_file=str(path))).tenant_of(A) == "alice"
    assert [r.getMessage() for r in caplog.records] == [
        f"MNEMOS_MCP_TOKENS_FILE {path} can be read by other users (mode 644): chmod 600 it"]
