"""``MnemosRetriever`` and ``MnemosStore`` (real LangChain and LangGraph classes) over real ingest and
query workers, plus LangChain's own standard retriever tests."""

from __future__ import annotations

import copy as copy_module
import dataclasses
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
import redis

pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
pytest.importorskip("langgraph", reason="the langchain extra is not installed")

from langchain_core.documents import Document  # noqa: E402
from langgraph.config import get_store  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from api.client import MnemosClient  # noqa: E402
from integrations.langchain import MnemosRetriever, MnemosStore  # noqa: E402
from tests.integration.factories import client_for, conversation_turns  # noqa: E402
from tests.support import wait_until  # noqa: E402
from workers.settings import Settings  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(service: Settings, redis_client: redis.Redis) -> Iterator[MnemosClient]:
    """A client of the running workers with alice's and bob's conversations stored."""
    value = client_for(service, redis_client)
    ids = value.publish_turns(conversation_turns("alice", "a") + conversation_turns("bob", "b"))
    wait_until(lambda: value.acknowledged("bob", ids[-1]), 60, "the conversations' ingestion")
    yield value


def test_retriever_invoke_and_batch_return_documents_of_its_tenant_only(client: MnemosClient) -> None:
    retriever = MnemosRetriever(client=client, tenant_id="alice", k=3)
    documents = retriever.invoke("grey cat Pixel")
    assert [d.metadata["turn_id"] for d in documents][0] == "a0" and len(documents) == 3
    first = documents[0]
    assert isinstance(first, Document) and first.page_content == "I adopted a grey cat named Pixel last spring"
    assert first.id == "a0"
    assert {"speaker": "user", "session_id": "s1", "timestamp": "2024-03-01T09:00:00+00:00", "rank": 1,
            "aliases": []}.items() <= first.metadata.items()
    assert isinstance(first.metadata["score"], float)
    batches = retriever.batch(["grey cat Pixel", "cello teacher", "sourdough bread Porto"])
    assert [b[0].metadata["turn_id"] for b in batches] == ["a0", "a7", "a5"]
    assert all(d.metadata["turn_id"].startswith("a") for b in batches for d in b)
    assert len(retriever.invoke("cat", k=1)) == 1
    only_s3 = retriever.invoke("cat", filters={"session_ids": ["s3"]})
    assert {d.metadata["session_id"] for d in only_s3} == {"s3"}
    early = MnemosRetriever(client=client, tenant_id="alice", k=10, as_of="2024-03-01T09:01:00Z")
    assert {d.metadata["turn_id"] for d in early.invoke("cat")} == {"a0", "a1"}
    with pytest.raises(TypeError, match="tenant"):
        retriever.invoke("cat", tenant_id="bob")
    assert MnemosRetriever(client=client, tenant_id="nobody").invoke("cat") == []


def test_store_put_get_search_delete_and_its_limits(client: MnemosClient) -> None:
    store = MnemosStore(client, "carol")
    namespace = ("memories", "carol-chat")
    store.put(namespace, "k1", {"text": "Carol is allergic to peanuts", "speaker": "carol", "source": "intake"})
    store.put(("memories", "other"), "k1", {"text": "Carol's bike is red", "timestamp": "2024-05-01T10:00:00Z"})
    item = store.get(namespace, "k1")
    assert item is not None and item.key == "k1" and item.namespace == namespace
    assert item.value == {"text": "Carol is allergic to peanuts", "speaker": "carol", "source": "intake",
                          "timestamp": item.created_at.isoformat()}
    found = store.search(("memories",), query="peanut allergy", limit=2)
    assert [(i.namespace, i.key) for i in found][0] == (namespace, "k1") and found[0].score is not None
    assert [i.key for i in store.search(("memories", "other"), query="peanut allergy")] == ["k1"]
    assert [i.value["text"] for i in store.search(("memories",), query="allergy", filter={"speaker": "carol"})] == [
        "Carol is allergic to peanuts"]
    assert store.search(("nothing",), query="peanuts") == []
    assert sorted(store.list_namespaces()) == [("memories", "carol-chat"), ("memories", "other")]
    store.put(namespace, "k1", {"text": "Carol is allergic to peanuts and cashews"})  # an update
    updated = store.get(namespace, "k1")
    assert updated is not None and updated.value["text"] == "Carol is allergic to peanuts and cashews"
    store.delete(namespace, "k1")
    assert store.get(namespace, "k1") is None
    assert "k1" not in [i.key for i in store.search(namespace, query="peanuts cashews")]
    with pytest.raises(ValueError, match="string 'text'"):
        store.put(namespace, "k2", {"title": "no text"})
    for call, reason in ((lambda: store.search(("memories",)), "query="),
                         (lambda: store.search(("memories",), query="x", filter={"source": "intake"}), "speaker"),
                         (lambda: store.list_namespaces(prefix=("memories",)), "not supported"),
                         (lambda: store.put(namespace, "k3", {"text": "x"}, ttl=5), "TTL"),
                         # break-it round 12: hits past MNEMOS_MAX_K were cut silently, and limit 0 named "k"
                         (lambda: store.search(("memories",), query="x", offset=95, limit=10), "MNEMOS_MAX_K")):
        with pytest.raises(NotImplementedError, match=reason):
            call()
    assert store.search(("memories",), query="peanut allergy", limit=0) == []
    assert MnemosStore(client, "alice").get(("memories", "other"), "k1") is None  # another tenant's item


def test_store_writes_are_last_write_wins_and_search_stays_in_its_namespaces(client: MnemosClient) -> None:
    # found by a break-it session: a put after a delete was dropped by the forget's tombstone, an
    # overwrite of a put still in the stream was lost, and a memory deduplicated across namespaces
    # was returned as the other namespace's item
    store = MnemosStore(client, "dave")
    store.put(("x",), "k", {"text": "first value about kites"})
    store.delete(("x",), "k")
    store.put(("x",), "k", {"text": "second value about llamas"})
    again = store.get(("x",), "k")
    assert again is not None and again.value["text"] == "second value about llamas"
    eager = MnemosStore(client, "dave", ingest_wait_s=0)  # nothing waits for the ingest worker
    eager.put(("prefs",), "drink", {"text": "I drink coffee every morning"})
    eager.put(("prefs",), "drink", {"text": "I switched to tea, no more coffee"})
    store.put(("prefs",), "marker", {"text": "the marker turn"})  # waits: everything before it is applied
    latest = store.get(("prefs",), "drink")
    assert latest is not None and latest.value["text"] == "I switched to tea, no more coffee"
    # two writers of one key: the put published last wins (test_client_replace_turn checks that each
    # put's forget and re-add are adjacent on the stream, so no interleaving can keep the first)
    other = MnemosStore(client, "dave", ingest_wait_s=0)
    eager.put(("prefs",), "colour", {"text": "my favourite colour is green"})
    other.put(("prefs",), "colour", {"text": "my favourite colour is blue"})
    store.put(("prefs",), "marker", {"text": "the marker turn again"})
    colour = store.get(("prefs",), "colour")
    assert colour is not None and colour.value["text"] == "my favourite colour is blue"
    store.put(("work",), "a", {"text": "Meeting with the dentist on Friday"})
    store.put(("private",), "b", {"text": "Meeting with the dentist on Friday"})  # deduplicated into work's
    found = store.search(("private",), query="dentist meeting")
    assert [(i.namespace, i.key) for i in found] == [(("private",), "b")]
    assert found[0].value["text"] == "Meeting with the dentist on Friday"
    assert [(i.namespace, i.key) for i in store.search(("work",), query="dentist meeting")] == [(("work",), "a")]
    for member in ("ann", "ben", "cy"):
        store.put(("team", member), "note", {"text": f"{member} prefers tea"})
    narrow = MnemosStore(client_for_limits(client, max_filter_values=2), "dave")
    with pytest.raises(NotImplementedError, match=r"at most 2 namespaces at once; \(.team.,\) holds 3"):
        narrow.search(("team",), query="prefers tea")
    assert len(store.search(("team",), query="prefers tea")) == 3


def client_for_limits(client: MnemosClient, **limits: int) -> MnemosClient:
    """The same client with other validation limits (a copy: the fixture's client is shared)."""
    copy = copy_module.copy(client)
    copy.limits = dataclasses.replace(client.limits, **limits)
    return copy


def test_a_langgraph_graph_uses_the_store_as_its_long_term_memory(client: MnemosClient) -> None:
    class State(TypedDict):
        question: str
        answer: str

    def remember(state: State) -> dict[str, Any]:
        get_store().put(("profile", "dan"), "city", {"text": "Dan lives in Ghent since 2021"})
        return {}

    def recall(state: State) -> dict[str, Any]:
        items = get_store().search(("profile",), query=state["question"], limit=1)
        return {"answer": items[0].value["text"] if items else ""}

    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("recall", recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    app = graph.compile(store=MnemosStore(client, "dan"))
    assert app.invoke({"question": "Where does Dan live?", "answer": ""})["answer"] == "Dan lives in Ghent since 2021"


try:
    from langchain_tests.integration_tests import RetrieversIntegrationTests
except ImportError:  # langchain-tests is a dev extra
    RetrieversIntegrationTests = None

if RetrieversIntegrationTests is not None:

    class TestMnemosRetrieverStandard(RetrieversIntegrationTests):
        """LangChain's standard retriever tests over alice's stored conversation."""

        @pytest.fixture(autouse=True)
        def _memory(self, client: MnemosClient) -> None:
            self._params = {"client": client, "tenant_id": "alice"}

        @property
        def retriever_constructor(self) -> type[MnemosRetriever]:
            return MnemosRetriever

        @property
        def retriever_constructor_params(self) -> dict[str, Any]:
            return self._params

        @property
        def retriever_query_example(self) -> str:
            return "Who is the cello teacher?"
