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
