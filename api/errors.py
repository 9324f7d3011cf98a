"""Errors a Mnemos client sees (root: ``MnemosClientError``).

Validation errors carry a stable ``reason`` code (:class:`Reason`); the ingest worker writes the
same codes to its dead letters and to the ``mnemos_ingest_turns_rejected_total{reason}`` metric,
so a rejected turn reads the same on both sides of the stream.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a turn, a request or a stream message was refused (low-cardinality label values)."""

    EMPTY_TEXT = "empty_text"
    TEXT_TOO_LARGE = "text_too_large"
    CONTROL_CHARACTERS = "control_characters"
    INVALID_UTF8 = "invalid_utf8"
    MISSING_FIELD = "missing_field"
    BAD_ID = "bad_id"
    BAD_TIMESTAMP = "bad_timestamp"
    TIMESTAMP_WITHOUT_ZONE = "timestamp_without_zone"
    TIMESTAMP_IN_FUTURE = "timestamp_in_future"
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_METADATA = "bad_metadata"
    METADATA_TOO_LARGE = "metadata_too_large"
    EMPTY_QUERY = "empty_query"
    QUERY_TOO_LARGE = "query_too_large"
    K_OUT_OF_RANGE = "k_out_of_range"
    BUDGET_OUT_OF_RANGE = "budget_out_of_range"  # a retrieval's evidence packet budget (tokens)
    BAD_FILTER = "bad_filter"  # a retrieval filter: unknown key, wrong type, empty list, empty time range
    BAD_FORGET = "bad_forget"  # a forget event: unknown scope, or ids that do not fit its scope
    REQUEST_ID_REUSED = "request_id_reused"  # a tenant's request id already names another retrieval
    BAD_TIMEOUT = "bad_timeout"  # a client call's wait: not a number of seconds in (0, MAX_WAIT_S]
    # worker side only
    TURN_ID_CONFLICT = "turn_id_conflict"  # same (tenant, turn_id) again with different content
    MALFORMED_MESSAGE = "malformed_message"  # not a turn at all (unparseable fields)
    FORBIDDEN_JOB = "forbidden_job"  # a queue job that names a function other than the query worker's jobs
    TRIMMED_BEFORE_ACK = "trimmed_before_ack"  # a pending stream entry was deleted by a trim
    PROCESSING_ERROR = "processing_error"  # the worker failed on this message alone (a bug): kept for replay


class MnemosClientError(Exception):
    """Base class of every error raised by :mod:`api`."""


class InvalidInputError(MnemosClientError, ValueError):
    """Raised when a turn or a retrieval request fails validation (before anything is sent).

    ``reason`` is the :class:`Reason` code, ``field`` the offending field, ``detail`` a
    human-readable explanation (never the full text, which may be large or private).
    """

    def __init__(self, reason: Reason, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail} ({reason.value})")
        self.reason = reason
        self.field = field
        self.detail = detail


class RequestIdReused(InvalidInputError):
    """Raised by ``retrieve`` before anything is enqueued when the tenant's ``request_id`` already
    names a different request (another query, ``k``, ``as_of``, ``filters`` or ``budget_tokens``)
    whose job or result may still exist: both would share one rq job, so one caller would read the
    other's hits and suppression would see two outcomes under one id. The same request sent again
    under its id (a retry) is not refused.
    """

    def __init__(self, tenant_id: str, request_id: str) -> None:
        super().__init__(Reason.REQUEST_ID_REUSED, "request_id",
                         f"{request_id!r} already names another request of this tenant; use a new request id "
                         "per request (the same request may be retried under its id)")
        self.tenant_id = tenant_id
        self.request_id = request_id


class ServiceUnavailable(MnemosClientError):
    """Raised when Redis cannot be reached or refuses a command; the cause is chained."""


class ShardUnavailable(ServiceUnavailable):
    """Raised when the Redis of one shard (of a deployment with more than one) cannot be reached or
    refuses a command: only the tenants of ``shard`` are affected; the cause is chained."""

    def __init__(self, shard: int, detail: str) -> None:
        super().__init__(f"shard {shard} is unavailable: {detail}")
        self.shard = shard


class TenantMoving(ShardUnavailable):
    """Raised when a tenant stayed frozen by a move between shards (``mnemos reshard move``) for longer
    than the client waits: its publishes, forgets and retrievals are held while its rows and pending
    turns are copied, and nothing of this call was sent. Retry once the move has finished."""

    def __init__(self, shard: int, tenant_id: str, waited_s: float) -> None:
        super().__init__(shard, f"tenant {tenant_id!r} is being moved to another shard (waited {waited_s:g}s); "
                                "nothing was sent, retry when the move has finished")
        self.tenant_id = tenant_id


class NoQueryWorker(ServiceUnavailable):
    """Raised by ``retrieve`` at once, before anything is enqueued, when no query worker of the
    client's queue has a live heartbeat (none runs, or all stopped longer ago than their TTL)."""

    def __init__(self, queue_name: str, stream_prefix: str) -> None:
        super().__init__(f"no query worker is running for queue {queue_name!r} (no live heartbeat under "
                         f"{stream_prefix}:heartbeat:query:*): start one with `mnemos worker query`, or, if one "
                         "runs, give it and this client the same queue name and stream prefix "
                         "(MNEMOS_QUEUE_NAME, MNEMOS_STREAM_PREFIX); nothing was sent")
        self.queue_name = queue_name
        self.stream_prefix = stream_prefix


class RetrievalTimeout(MnemosClientError, TimeoutError):
    """Raised when no result arrived within the client's timeout (no worker, or a killed one).

    The job is cancelled if it had not started, so it will not run after the caller gave up.
    """

    def __init__(self, request_id: str, timeout_s: float, status: str | None, shard: int | None = None) -> None:
        # %g: a sub-second timeout reads as given ("0.05s"), never rounded to "0.0s"
        on = "" if shard is None else f" on shard {shard}"
        super().__init__(f"retrieval {request_id}{on} got no result within {timeout_s:g}s (job status {status})")
        self.request_id = request_id
        self.timeout_s = timeout_s
        self.status = status
        self.shard = shard  # None: an unsharded deployment


class RetrievalFailed(MnemosClientError):
    """Raised when the query worker ran the request and it failed (``detail`` has the last line;
    ``shard``, with more than one, the shard whose worker ran it: e.g. that shard's Postgres is down)."""

    def __init__(self, request_id: str, status: str, detail: str, shard: int | None = None) -> None:
        on = "" if shard is None else f" on shard {shard}"
        super().__init__(f"retrieval {request_id}{on} failed ({status}): {detail}")
        self.request_id = request_id
        self.status = status
        self.detail = detail
        self.shard = shard  # None: an unsharded deployment
