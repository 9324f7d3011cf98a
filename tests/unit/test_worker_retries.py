"""The workers' retry loops without servers: which errors back off, how long, and that a stop ends a wait.

:func:`workers.runtime.streams.run_consumer` and the query worker's restarts use redis-py's ``Retry`` with an
``ExponentialBackoff``; the same loops run against a real Redis that restarts in tests/faults/.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from workers.launch.process import _RestartBackoff, _WorkLoopEnded
from workers.runtime.errors import StoreError
from workers.runtime.streams import StreamMessage, run_consumer


class _RecordedStop(threading.Event):
    """A stop event whose waits return at once and are recorded (seconds asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


class _FailingConsumer:
    """A consumer whose reads go through ``outcomes`` in turn (an error is raised, ``None`` is an
    empty batch), then set ``stop`` (the loop ends)."""

    stream, group = "turns", "ingest"

    def __init__(self, outcomes: list[Exception | None], stop: threading.Event) -> None:
        self.outcomes = list(outcomes)
        self.stop = stop
        self.replays = 0
        self.recreated: list[redis.ResponseError] = []

    def ensure_group(self) -> bool:
        return True

    def recreate_group(self, cause: redis.ResponseError) -> None:
        self.recreated.append(cause)

    def replay_pending(self) -> None:
        self.replays += 1

    def read(self) -> list[StreamMessage]:
        if not self.outcomes:
            self.stop.set()
            return []
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return []

    def ack(self, stream_ids: list[str]) -> None:
        pass


def _run(consumer: _FailingConsumer, stop: threading.Event, max_backoff_s: float = 5.0) -> None:
    run_consumer(consumer, lambda batch: [], stop, poison=lambda message, exc: True,  # type: ignore[arg-type]
                 max_backoff_s=max_backoff_s)


def test_transient_errors_back_off_doubling_from_a_tenth_of_a_second_up_to_the_cap() -> None:
    stop = _RecordedStop()
    outcomes: list[Exception | None] = [redis.ConnectionError("down")] * 5
    consumer = _FailingConsumer([*outcomes, StoreError("pg down", transient=True)], stop)
    _run(consumer, stop, max_backoff_s=1.0)
    assert stop.waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert consumer.replays == 6  # each failed turn replays the consumer's own pending entries


def test_a_successful_turn_starts_the_backoff_over() -> None:
    stop = _RecordedStop()
    _run(_FailingConsumer([redis.TimeoutError("slow"), redis.TimeoutError("slow"), None,
                           redis.ConnectionError("down again")], stop), stop)
    assert stop.waits == pytest.approx([0.1, 0.2, 0.1])


def test_nogroup_recreates_the_group_without_a_wait() -> None:
    stop = _RecordedStop()
    nogroup = redis.ResponseError("NOGROUP No such key 'turns' or consumer group 'ingest'")
    consumer = _FailingConsumer([nogroup], stop)
    _run(consumer, stop)
    assert consumer.recreated == [nogroup] and stop.waits == []


@pytest.mark.parametrize("error", [StoreError("constraint violated", transient=False),
                                   redis.ResponseError("WRONGTYPE Operation against a key")])
def test_an_error_that_is_not_transient_propagates_without_a_retry(error: Exception,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    stop = _RecordedStop()
    with pytest.raises(type(error)):
        _run(_FailingConsumer([error], stop), stop)
    assert stop.waits == [] and "retrying" not in caplog.text


def test_a_stop_request_ends_a_long_wait_at_once() -> None:
    stop = threading.Event()
    consumer = _FailingConsumer([redis.ConnectionError("down")] * 100, stop)
    thread = threading.Thread(target=_run, args=(consumer, stop, 60.0), daemon=True)
    thread.start()
    time.sleep(1.0)  # 0.1 + 0.2 + 0.4 s of waits: the fourth (0.8 s) is under way
    began = time.monotonic()
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - began < 0.5


def test_the_query_worker_restarts_after_half_a_second_doubling_and_again_after_a_healthy_run(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="workers.launch.process")
    backoff = _RestartBackoff(cap=5.0)
    assert [backoff.compute(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 5.0]
    backoff.ended(_WorkLoopEnded(ran_s=61.0), 6)  # the sixth end came after a minute of work
    assert [backoff.compute(n) for n in range(6, 9)] == [0.5, 1.0, 2.0]
    backoff.ended(_WorkLoopEnded(ran_s=1.0), 7)  # a short run does not start the count over
    assert backoff.compute(7) == 1.0
    assert "restarting it in 1.0s" in caplog.records[-1].getMessage()


def test_a_failing_message_is_acknowledged_unless_its_poison_handler_leaves_it_pending() -> None:
    from workers.runtime.streams import _handle_guarded

    def handle(batch: list[StreamMessage]) -> list[str]:
        if any(m.stream_id == "2-0" or m.stream_id == "3-0" for m in batch):
            raise ValueError("a bug")
        return [m.stream_id for m in batch]

    batch = [StreamMessage(f"{n}-0", {}) for n in range(1, 5)]
    poisoned: list[str] = []

    def poison(message: StreamMessage, exc: Exception) -> bool:
        poisoned.append(message.stream_id)
        return message.stream_id != "3-0"  # 3-0: its tenant is moving away

    assert _handle_guarded(handle, batch, poison) == ["1-0", "2-0", "4-0"]
    assert poisoned == ["2-0", "3-0"]
