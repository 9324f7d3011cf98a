"""The jobs a query worker runs, and nothing else.

rq resolves a job's function from the dotted name stored in the job, so anyone who can write to
the queue could otherwise make a query worker import and call any function on its path
(``os.listdir``, ``os.makedirs``), with the worker's database connection at hand. JSON jobs stop
pickled code, not that. :class:`QueryJob` is the job class of every
:class:`~workers.query.worker.QueryWorker`: before anything is imported it refuses a job whose
function is not one of :data:`ALLOWED_JOBS`, or that is bound to an instance, and it never runs
rq's success, failure or stopped callbacks, whose names are stored in the job as well and would
be imported and called the same way (the service sets none). docs/architecture.md "Pitfalls".
"""

from __future__ import annotations

from typing import Any

from rq.job import Job

from api.catalog import CATALOG_JOB
from api.client import RETRIEVAL_JOB
from api.errors import InvalidInputError, Reason

ALLOWED_JOBS = frozenset({RETRIEVAL_JOB, CATALOG_JOB})


def check_job(func_name: object, instance: object) -> None:
    """Refuse a job that the query worker must not run.

    Raises:
        InvalidInputError: ``forbidden_job`` when ``func_name`` is not one of :data:`ALLOWED_JOBS`
            (compared as stored, nothing is imported) or the job names an instance.
    """
    if instance is not None:
        raise InvalidInputError(Reason.FORBIDDEN_JOB, "job", "a job bound to an instance is not run here")
    if func_name not in ALLOWED_JOBS:
        shown = func_name if isinstance(func_name, str) and len(func_name) <= 120 else type(func_name).__name__
        raise InvalidInputError(Reason.FORBIDDEN_JOB, "job",
                                f"{shown!r} is not a query worker job (allowed: {', '.join(sorted(ALLOWED_JOBS))})")


class QueryJob(Job):
    """An rq job that runs only :data:`ALLOWED_JOBS` and ignores stored callbacks.

    A refused job fails like an invalid request: rq records the ``forbidden_job`` reason on it
    (``latest_result().exc_string``) and the worker logs one WARNING line.
    """

    def _execute(self) -> Any:
        check_job(self.func_name, self.instance)
        return super()._execute()

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None
