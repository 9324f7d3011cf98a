"""``mnemos retrieve`` with ``--as-of`` and filters: sent to the real query worker, or refused before sending."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from click.testing import CliRunner
from rq import Queue
from rq.serializers import JSONSerializer

from tests.integration.factories import (
    BASE_TIME,
    answered_by_worker,
    conversation_turns,
    ingest_turns,
    query_service,
    turn,
)
from workers.cli import cli
from workers.settings import Settings, to_environment
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def _invoke(settings: Settings, *args: str):
    return CliRunner().invoke(cli, ["retrieve", *args], env=to_environment(settings), catch_exceptions=False)


def test_cli_sends_as_of_and_filters_to_the_worker(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    turns = conversation_turns("alice", "a") + [turn("alice", "kyoto", "We booked a trip to Kyoto in October",
                                                      session="s4", minutes=99)]
    ingest_turns(settings, redis_client, store, turns)
    service = query_service(settings, redis_client, store)

    results = []
    for args in ([], ["--as-of", (BASE_TIME + timedelta(minutes=50)).isoformat()], ["--session", "s4"]):
        out = answered_by_worker(settings, redis_client, service, _invoke, settings, "--tenant", "alice", "--json",
                                 "-k", "10", *args, "trip Kyoto")
        assert out.exit_code == 0, out.output
        results.append([h["turn_id"] for h in json.loads(out.output)["hits"]])
    unfiltered, before, session = results
    assert unfiltered[0] == "kyoto"
    assert before and "kyoto" not in before
    assert session == ["kyoto"]


@pytest.mark.parametrize(("args", "reason"), [
    (["--as-of", "2024-01-01T00:00:00"], "timestamp"),  # no zone
    (["--as-of", "2024-01-01T00:00:00+00:00", "--after", "2024-02-01T00:00:00+00:00"], "bad_filter"),
])
def test_cli_refuses_bad_filters_before_sending(settings: Settings, redis_client: redis.Redis, args: list[str],
                                                reason: str) -> None:
    out = CliRunner().invoke(cli, ["retrieve", "--tenant", "alice", *args, "trip"], env=to_environment(settings))
    assert out.exit_code == 2  # the input must change first, not a failed service
    assert reason in out.output
    assert Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer).count == 0
