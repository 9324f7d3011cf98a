"""Mnemos client API: wire schemas, validation and the client (the public surface is ``__all__``)."""

from api.client import MnemosClient
from api.errors import (
    InvalidInputError,
    MnemosClientError,
    NoQueryWorker,
    Reason,
    RequestIdReused,
    RetrievalFailed,
    RetrievalTimeout,
    ServiceUnavailable,
    ShardUnavailable,
)
from api.forget import ForgetRequest, ForgetScope
from api.schemas import Hit, Outcome, PoolRow, RetrievalFilters, RetrievalRequest, RetrievalResult, Turn
from api.validation import SCHEMA_VERSION, Limits

__all__ = [
    "SCHEMA_VERSION",
    "ForgetRequest",
    "ForgetScope",
    "Hit",
    "InvalidInputError",
    "Limits",
    "MnemosClient",
    "MnemosClientError",
    "NoQueryWorker",
    "Outcome",
    "PoolRow",
    "Reason",
    "RequestIdReused",
    "RetrievalFailed",
    "RetrievalFilters",
    "RetrievalRequest",
    "RetrievalResult",
    "RetrievalTimeout",
    "ServiceUnavailable",
    "ShardUnavailable",
    "Turn",
]
