"""``MnemosStore`` over a stub client: what it refuses before anything is sent, and what it says when
the ingest worker does not commit a write in time (the real workers: tests/integrations/test_langchain.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langchain extra is not installed")

from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp  # noqa: E402

from integrations.langchain import MnemosStore  # noqa: E402


class _Client:
    """Records what the store sends; ``acknowledged`` is what ``wait_acknowledged`` answers."""

    def __init__(self, acknowledged: bool) -> None:
        self.acknowledged = acknowledged
        self.sent: list[tuple[str, Any]] = []

    def replace_turn(self, turn: dict[str, Any]) -> str:
        self.sent.append(("replace", turn["turn_id"]))
        return "5-0"

    def forget(self, tenant_id: str, *, turn_ids: list[str]) -> str:
        self.sent.append(("forget", turn_ids))
        return "6-0"

    def turns(self, tenant_id: str, turn_ids: list[str]) -> tuple[()]:
        self.sent.append(("turns", turn_ids))
        return ()

    def wait_acknowledged(self, tenant_id: str, stream_id: str, timeout_s: float) -> bool:
        return self.acknowledged


@pytest.mark.parametrize("bad", [PutOp(("a.b",), "k", {"text": "overwritten"}), GetOp(("x..y",), "z"),
                                 PutOp(("a", ""), "k", {"text": "x"})])
def test_batch_refuses_a_label_that_would_address_another_namespace_before_any_op_runs(bad: Any) -> None:
    # found by a break-it session: batch([PutOp(("a.b",), ...)]) overwrote the item of ("a", "b")
    client = _Client(acknowledged=True)
    store = MnemosStore(client, "alice")  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(("a",), "first", {"text": "a valid put before the bad op"}), bad])
    assert client.sent == []
    store.batch([PutOp(("a", "b"), "k", {"text": "fine"})])
    assert client.sent == [("replace", "a.b..k")]


def test_a_write_no_ingest_worker_commits_in_time_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    # found by a break-it session: put and delete returned silently, and the next get missed the write
    store = MnemosStore(_Client(acknowledged=False), "alice", ingest_wait_s=0.5)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="integrations.langchain.store"):
        store.put(("notes",), "k", {"text": "a new note"})
        store.delete(("notes",), "k")
    assert ["put of 'notes..k'" in m or "delete of 'notes..k'" in m for m in caplog.messages] == [True, True]
    assert all("no ingest worker committed it within 0.5 s" in m for m in caplog.messages)
    caplog.clear()
    committed = MnemosStore(_Client(acknowledged=True), "alice")  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="integrations.langchain.store"):
        committed.put(("notes",), "k", {"text": "a new note"})
    assert caplog.messages == []


@pytest.mark.parametrize("wait", [1e6, float("nan"), -1.0, True])
def test_an_ingest_wait_out_of_range_is_refused_before_anything_is_sent(wait: Any) -> None:
    # break-it round 14: a wait over a day passed, then the put was published and reported invalid
    from api.errors import InvalidInputError, Reason
    from integrations.mcp_server.tools import MemoryTools

    client = _Client(acknowledged=True)
    for build in (lambda: MnemosStore(client, "t1", ingest_wait_s=wait),  # type: ignore[arg-type]
                  lambda: MemoryTools(client, ingest_wait_s=wait)):  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError) as info:
            build()
        assert info.value.reason is Reason.BAD_TIMEOUT and info.value.field == "ingest_wait_s"
    assert client.sent == []
    assert MnemosStore(client, "t1", ingest_wait_s=0).ingest_wait_s == 0  # type: ignore[arg-type]
