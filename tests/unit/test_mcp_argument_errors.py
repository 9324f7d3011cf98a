"""The MCP server's argument-schema refusals read as one sentence per argument (no pydantic report)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

pytest.importorskip("mcp.server.mcpserver", reason="the mcp extra is not installed")

from integrations.mcp_server.server import argument_errors  # noqa: E402


class _Recall(BaseModel):
    query: str
    k: int | None = Field(default=None, strict=True)
    metadata: dict[str, Any] | None = None


def _refusal(**arguments: Any) -> str:
    with pytest.raises(ValidationError) as info:
        _Recall.model_validate(arguments)
    return argument_errors(info.value)


def test_each_wrong_argument_is_one_sentence_without_its_value() -> None:
    assert _refusal(k=3) == "Missing argument query."
    assert _refusal(query="q", k="5") == "Invalid k: Input should be a valid integer."
    both = _refusal(query=7, metadata="secret-value")
    assert both.startswith("Invalid query: ") and "Invalid metadata: " in both
    assert "\n" not in both and "secret-value" not in both and "pydantic.dev" not in both


def test_a_wire_field_is_named_by_the_tool_argument_it_came_from() -> None:
    from integrations.mcp_server.tools import argument_of

    # found by a break-it session: forget with a 300-character turn_id answered "Invalid turn_ids"
    assert [argument_of(f) for f in ("turn_ids[0]", "turns[0].occurred_at", "filters.session_ids[2]", "text",
                                     "filters.roles", "query")] == [
        "turn_id", "timestamp", "session_id", "text", "speaker", "query"]
