"""The catalog job of the query worker: a tenant's sessions, or its stored turns by id.

``catalog_job`` (``workers.query.catalog.catalog_job``, :data:`api.catalog.CATALOG_JOB`) runs in a
:class:`workers.query.worker.QueryWorker` like a retrieval and reads Postgres through the worker's store, in
one read-only snapshot scoped to the request's tenant (row-level security underneath), so an answer
never holds another tenant's row. It ranks nothing, sends no outcome and touches no cache; it is
counted in ``mnemos_query_catalog_jobs_total{status}``. The request is validated again here, as a
retrieval is (a raw job that bypassed the client's checks fails with InvalidInputError).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC
from typing import Any

from api.catalog import CatalogKind, CatalogRequest, CatalogResult
from api.errors import InvalidInputError, Reason
from workers.query.worker import bound_service
from workers.store import Store


def answer_catalog(store: Store, request: CatalogRequest) -> CatalogResult:
    """Read what ``request`` asks from ``store`` in one snapshot of its tenant (times in UTC)."""
    with store.tenant(request.tenant_id, snapshot=True) as tx:
        if request.kind is CatalogKind.SESSIONS:
            sessions = tuple(replace(r, first_at=r.first_at.astimezone(UTC), last_at=r.last_at.astimezone(UTC))
                             for r in tx.session_summaries())
            return CatalogResult(request.request_id, request.tenant_id, sessions=sessions)
        stored = {t.turn_id: t for t in tx.stored_turns(request.turn_ids)}
    turns = tuple(replace(t, occurred_at=t.occurred_at.astimezone(UTC), metadata=dict(t.metadata))
                  for t in (stored[i] for i in request.turn_ids if i in stored))
    return CatalogResult(request.request_id, request.tenant_id, turns=turns)


def catalog_job(payload: dict[str, Any]) -> dict[str, Any]:
    """The rq job function: validate ``payload`` (:class:`api.catalog.CatalogRequest`), answer, count.

    Raises OutsideQueryWorkerError outside a query worker, InvalidInputError for an invalid payload,
    StoreError when Postgres fails.
    """
    service = bound_service("catalog_job")
    try:
        if not isinstance(payload, dict):
            raise InvalidInputError(Reason.MALFORMED_MESSAGE, "payload", "must be a JSON object")
        result = answer_catalog(service.store, CatalogRequest.parse(payload, service.limits))
    except Exception:
        service.metrics.catalog_job("error")
        raise
    service.metrics.catalog_job("ok")
    return result.to_payload()
