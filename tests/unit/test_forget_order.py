"""Property test (hypothesis): consumers of one group read a tenant's turns, replacements and
forgets in any order, and the stored memory is the one that stream order gives (docs/architecture.md
"Forget", "Tombstones").

A random stream of one tenant: new turns (fresh turn ids), replacements of one key (each may move
its key to another session), and forgets of a session, of keys or of the whole tenant. The reference
handles the messages one by one in stream order; the property handles the same messages one by one
in a random order (as several consumers may) and must store the same turns, with the same sessions
and texts. Plain re-adds and plain retries of a used turn id are left out: their known order effects
are listed in docs/architecture.md ("Forget", "Reading order").
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.unit.worker_fakes import RecordingRedis, forget_message, ingest_worker, turn_message
from workers.runtime.streams import StreamMessage
from workers.store import FakeStore

SESSIONS = ("s1", "s2")
KEYS = ("k",)  # one key, two sessions: the order effects need two messages of one key or session
TEXTS = ("I live in Lisbon", "My sister Ana is a nurse", "I play the cello on Mondays", "Our dog Rex is nine",
         "I moved to Porto in May", "My pin code is 4417")

replace = st.tuples(st.just("replace"), st.sampled_from(KEYS), st.sampled_from(SESSIONS), st.sampled_from(TEXTS))
op = st.one_of(  # replacements twice as likely: the order effects live between them and the forgets
    replace, replace,
    st.tuples(st.just("turn"), st.sampled_from(SESSIONS), st.sampled_from(TEXTS)),
    st.tuples(st.just("forget_session"), st.sampled_from(SESSIONS)),
    st.tuples(st.just("forget_keys"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True)),
    st.tuples(st.just("forget_tenant")),
)


def _messages(ops: list[tuple]) -> list[StreamMessage]:
    messages = []
    for i, (kind, *args) in enumerate(ops):
        stream_id = f"{i + 1}-0"
        if kind == "turn":
            messages.append(turn_message(stream_id, "alice", f"n{i}", args[1], session=args[0], minutes=i))
        elif kind == "replace":
            message = turn_message(stream_id, "alice", args[0], args[2], session=args[1], minutes=i)
            messages.append(StreamMessage(stream_id, {**message.fields, b"readd": b"replace"}))
        elif kind == "forget_session":
            messages.append(forget_message(stream_id, "alice", session=args[0]))
        elif kind == "forget_keys":
            messages.append(forget_message(stream_id, "alice", turn_ids=tuple(args[0])))
        else:
            messages.append(forget_message(stream_id, "alice"))
    return messages


def _stored(messages: list[StreamMessage]) -> dict[str, tuple[str, str]]:
    """turn id -> (session, text) after one consumer handled ``messages`` one at a time, in that order."""
    store = FakeStore()
    worker = ingest_worker(store, RecordingRedis())
    for message in messages:
        worker.handle([message])
    with store.tenant("alice") as tx:
        return {r.turn_id: (r.session_id, r.text) for r in tx.entries_after(0)}


def _delayed(messages: list[StreamMessage]) -> list[list[StreamMessage]]:
    """Every order in which one message is read late, after some later ones (a consumer held it
    pending, or died and another claimed it)."""
    orders = []
    for i, late in enumerate(messages):
        rest = messages[:i] + messages[i + 1:]
        orders += [rest[:j] + [late] + rest[j:] for j in range(i + 1, len(messages))]
    return orders


@st.composite
def stream_and_order(draw: st.DrawFn) -> tuple[list[StreamMessage], list[StreamMessage]]:
    messages = _messages(draw(st.lists(op, min_size=2, max_size=6)))
    return messages, draw(st.permutations(messages))


# the key moved out of s1, then s1 forgotten: a forget read before the move dropped the moved value
MOVED_OUT = _messages([("replace", "k", "s1", TEXTS[0]), ("replace", "k", "s2", TEXTS[1]), ("forget_session", "s1")])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream_and_order())
@example((MOVED_OUT, MOVED_OUT))
def test_any_reading_order_stores_what_stream_order_stores(case: tuple[list[StreamMessage], list[StreamMessage]]) -> None:
    in_order, shuffled = case
    expected = _stored(in_order)
    for order in [shuffled, *_delayed(in_order)]:
        assert _stored(order) == expected, [m.stream_id for m in order]
