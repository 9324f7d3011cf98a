"""``mnemos demo``: a small two-tenant conversation written for this project, ingested and queried.

Two people talk to their assistant over several sessions in spring 2024. The demo publishes
every turn, waits until the ingest worker has stored them all, asks each tenant a few questions
and prints the hits. Turn ids are fixed, so running the demo twice stores nothing twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from api.client import MnemosClient
from api.schemas import RetrievalResult
from workers.store import Store

# (tenant, session, day offset from 2024-04-02, role, text)
CONVERSATION: tuple[tuple[str, str, int, str, str], ...] = (
    ("maya", "m-s1", 0, "user", "I just signed up for a pottery class on Thursday evenings."),
    ("maya", "m-s1", 0, "assistant", "Nice! Is it wheel throwing or hand building?"),
    ("maya", "m-s1", 0, "user", "Wheel throwing. The studio is called Clay Corner, near the river."),
    ("maya", "m-s2", 9, "user", "My landlord finally fixed the leaking kitchen tap."),
    ("maya", "m-s2", 9, "user", "Also, my sister Lena is visiting from Vienna at the end of May."),
    ("maya", "m-s2", 9, "assistant", "Do you want ideas for things to do with Lena?"),
    ("maya", "m-s2", 9, "user", "Yes, she loves botanical gardens and anything with old trams."),
    ("maya", "m-s3", 23, "user", "I made my first bowl at Clay Corner, it is wobbly but I love it."),
    ("maya", "m-s3", 23, "user", "I am allergic to penicillin, please remember that if I ask about medicine."),
    ("maya", "m-s3", 23, "user", "I made my first bowl at Clay Corner, it is wobbly but I love it!"),
    ("theo", "t-s1", 1, "user", "I am training for a half marathon in Lisbon in October."),
    ("theo", "t-s1", 1, "assistant", "How many days a week are you running?"),
    ("theo", "t-s1", 1, "user", "Four days, with a long run on Sunday mornings."),
    ("theo", "t-s2", 12, "user", "My knee started hurting after the 18 km run, the physio said rest for a week."),
    ("theo", "t-s2", 12, "user", "I switched my running shoes to a pair with more cushioning."),
    ("theo", "t-s3", 30, "user", "Back to running. My daughter Ana wants to join the 5 km fun run."),
    ("theo", "t-s3", 30, "user", "We are vegetarian at home, so race-day breakfast ideas should be meat-free."),
    ("theo", "t-s3", 30, "assistant", "Oats with banana and peanut butter is a classic before a race."),
    ("theo", "t-s4", 41, "user", "I also signed up for a pottery class, but I quit after two weeks."),
    ("theo", "t-s4", 41, "user", "The Lisbon race starts at 8:30 at Praca do Comercio."),
)

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("maya", "Where do I take my pottery class?"),
    ("maya", "What does my sister like to do?"),
    ("maya", "Which medicine should I avoid?"),
    ("theo", "What did the physio tell me about my knee?"),
    ("theo", "When and where does the race start?"),
    ("theo", "What kind of breakfast should I have before the race?"),
)

START = datetime(2024, 4, 2, 18, 0, tzinfo=UTC)


def demo_turns() -> list[dict[str, object]]:
    turns = []
    for index, (tenant, session, day, role, text) in enumerate(CONVERSATION):
        turns.append({"tenant_id": f"demo-{tenant}", "session_id": session, "turn_id": f"{tenant}-{index:02d}",
                      "role": role, "text": text,
                      "occurred_at": (START + timedelta(days=day, minutes=index)).isoformat()})
    return turns


def stored_turns(store: Store, tenant_id: str) -> int:
    """How many turns of ``tenant_id`` are stored (StoreError when Postgres fails)."""
    with store.tenant(tenant_id) as tx:
        return tx.count_entries()


def run_demo(client: MnemosClient, store: Store | Sequence[Store], *, wait_s: float = 60.0, k: int = 3,
             echo: Callable[[str], None] = print) -> int:
    """Publish, wait until stored and a query worker is up, ask, print; returns an exit code (1 if
    ingestion did not finish or no query worker came up within ``wait_s``). ``store`` is the one
    store, or each shard's (in shard order) when every shard has its own Postgres."""
    stores = list(store) if isinstance(store, (list, tuple)) else [store] * client.shards
    turns = demo_turns()
    client.publish_turns(turns, readd=True)  # a rerun after `mnemos forget --tenant demo-maya` stores them again
    expected: dict[str, int] = {}
    for turn in turns:
        expected[str(turn["tenant_id"])] = expected.get(str(turn["tenant_id"]), 0) + 1
    echo(f"published {len(turns)} turns for {len(expected)} tenants; waiting for the ingest worker ...")
    deadline = time.monotonic() + wait_s
    while any(stored_turns(stores[client.shard_of(t)], t) < n for t, n in expected.items()):
        if time.monotonic() > deadline:
            echo("the turns were not stored in time: is an ingest worker running (`mnemos up`)?")
            return 1
        time.sleep(0.25)
    while not all(client.query_workers(t) for t in expected):  # one started with the demo may still be loading
        if time.monotonic() > deadline:
            echo("no query worker has a live heartbeat: is one running (`mnemos up`)?")
            return 1
        time.sleep(0.25)
    for tenant, question in QUESTIONS:
        result = client.retrieve(f"demo-{tenant}", question, k=k)
        echo(format_result(f"demo-{tenant}", question, result))
    return 0


def format_result(tenant: str, question: str, result: RetrievalResult) -> str:
    """The hits as text, one line each with its score to 4 decimals.

    Scores are rerank logits when the pool was reranked, else fused RRF scores (about 1/60 and
    close together, hence 4 decimals); ``pool_size`` 0 with hits means no reranker ran.
    """
    if result.pool_size:
        how = f"pool {result.pool_size}, deep pass {result.deep_pass}"
    else:
        how = "no reranker: fused order" if result.hits else "no hits"
    lines = [f"\n[{tenant}] {question}  ({how}, "
             f"{result.stage_seconds.get('total', 0.0) * 1000:.0f} ms in the worker)"]
    for hit in result.hits:
        alias = f"  (+ aliases {', '.join(hit.aliases)})" if hit.aliases else ""
        lines.append(f"  {hit.rank}. {hit.score:+.4f}  {hit.occurred_at:%Y-%m-%d} {hit.role}: {hit.text}{alias}")
    packet = result.packet
    if packet is not None:
        lines.append(f"  evidence packet: {len(packet.items)} items, {packet.used_tokens}/{packet.budget_tokens} tokens")
        lines.extend(f"    {line}" for line in packet.prompt_text().splitlines())
        for o in packet.omitted:
            why = f"{o.reason} ({o.because_of})" if o.because_of else o.reason
            lines.append(f"    left out {o.turn_id}: {why}")
    return "\n".join(lines)
