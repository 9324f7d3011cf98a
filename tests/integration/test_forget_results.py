"""A forget reads none of another tenant's stored rq results (docs/architecture.md "Forget", "The streams").

Results are written here with rq's own ``Result.create`` under the ids the client gives jobs
(``api.client.job_id_for``); the connection is wrapped to record which result streams the forget read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from api.client import JOB_ID_PREFIX, job_id_for, tenant_job_prefix
from api.forget import ForgetRequest, ForgetScope
from workers.ingest.forget_streams import erase_results

pytestmark = pytest.mark.integration


class _Reads(redis.Redis):
    """A client that records the keys XRANGE read."""

    read: list[str]

    def xrange(self, name: Any, *args: Any, **kwargs: Any) -> Any:
        self.read.append(name.decode() if isinstance(name, bytes) else str(name))
        return super().xrange(name, *args, **kwargs)


@pytest.fixture
def reads(redis_client: redis.Redis) -> Iterator[_Reads]:
    connection = _Reads(connection_pool=redis_client.connection_pool)
    connection.read = []
    yield connection


def _store(connection: redis.Redis, job_id: str, value: dict[str, Any]) -> str:
    job = Job.create("workers.query.jobs.retrieve", id=job_id, connection=connection, serializer=JSONSerializer)
    Result.create(job, Result.Type.SUCCESSFUL, ttl=60, return_value=value)
    return Result.get_key(job_id)


def _answer(tenant: str, turn_id: str) -> dict[str, Any]:
    return {"tenant_id": tenant, "hits": [{"session_id": "s1", "turn_id": turn_id, "text": "secret"}]}


def test_a_forget_reads_its_own_tenant_s_results_only(reads: _Reads) -> None:
    alice, bob = f"alice-{uuid.uuid4().hex}", f"bob-{uuid.uuid4().hex}"
    keys = {name: _store(reads, job_id_for(tenant, name), _answer(tenant, turn))
            for name, tenant, turn in (("a-covered", alice, "t1"), ("a-other", alice, "t2"),
                                       ("b-same-ids", bob, "t1"), ("b-more", bob, "t1"))}
    legacy_id = JOB_ID_PREFIX + uuid.uuid4().hex  # a result stored before job ids named their tenant
    keys["legacy"] = _store(reads, legacy_id, _answer(alice, "t1"))
    # break-it session: a client of another language hashing the tenant and request id its own way
    keys["foreign"] = _store(reads, JOB_ID_PREFIX + uuid.uuid4().hex.upper() + "-x", _answer(alice, "t1"))
    try:
        assert erase_results(reads, ForgetRequest(alice, ForgetScope.TURNS, turn_ids=("t1",)), stream_prefix="mnemos") == 3
        lengths = {name: reads.xlen(key) for name, key in keys.items()}
        assert lengths == {"a-covered": 0, "a-other": 1, "b-same-ids": 1, "b-more": 1, "legacy": 0, "foreign": 0}
        assert not {keys["b-same-ids"], keys["b-more"]} & set(reads.read)  # bob's were never read
        assert job_id_for(alice, "x").startswith(tenant_job_prefix(alice))
        assert not job_id_for(bob, "x").startswith(tenant_job_prefix(alice))
    finally:
        reads.delete(*keys.values(), *(Job.key_for(k.removeprefix(Result.get_key(""))) for k in keys.values()))


def test_a_forget_in_one_deployment_leaves_another_deployment_s_results_alone(reads: _Reads) -> None:
    # break-it session, 2026-12-07: two deployments sharing one Redis database (two stream prefixes)
    # gave the same tenant and request id one rq job id, so a forget in one erased the other's
    # results; a result stored under the default prefix's form (before the upgrade) is still found
    alice = f"alice-{uuid.uuid4().hex}"
    assert job_id_for(alice, "r1", "blue") != job_id_for(alice, "r1", "green") != job_id_for(alice, "r1")
    assert job_id_for(alice, "r1") == job_id_for(alice, "r1", "mnemos")
    keys = {name: _store(reads, job_id_for(alice, "r1", *prefix), _answer(alice, "t1"))
            for name, prefix in (("blue", ("blue",)), ("green", ("green",)), ("before", ()))}
    try:
        forget = ForgetRequest(alice, ForgetScope.TURNS, turn_ids=("t1",))
        assert erase_results(reads, forget, stream_prefix="blue") == 2
        assert {name: reads.xlen(key) for name, key in keys.items()} == {"blue": 0, "green": 1, "before": 0}
        assert keys["green"] not in reads.read
    finally:
        reads.delete(*keys.values(), *(Job.key_for(k.removeprefix(Result.get_key(""))) for k in keys.values()))


def test_a_custom_prefix_reads_default_form_results_by_their_turns_only(reads: _Reads) -> None:
    # break-it round 10: a result of the default prefix's form may be a default-prefix deployment's
    # sharing the database, whose entry ids its own database numbers: a forget under another prefix
    # erased an answer of an unrelated turn by entry id, and a tenant move cut its time to live
    from workers.ingest.forget_streams import expire_results

    alice = f"alice-{uuid.uuid4().hex}"
    unrelated = {"tenant_id": alice, "hits": [{"session_id": "s9", "turn_id": "t9", "text": "other", "entry_id": 7}]}
    keys = {"default": _store(reads, job_id_for(alice, "r1"), unrelated),
            "blue": _store(reads, job_id_for(alice, "r1", "blue"), unrelated)}
    try:
        assert erase_results(reads, ForgetRequest(alice, ForgetScope.TURNS, turn_ids=("t1",)), [7],
                             stream_prefix="blue") == 1
        assert {name: reads.xlen(key) for name, key in keys.items()} == {"default": 1, "blue": 0}
        assert expire_results(reads, alice, 5, stream_prefix="blue") == 1  # its own (emptied) result
        assert reads.ttl(keys["default"]) > 50 and 0 < reads.ttl(keys["blue"]) <= 5
        assert erase_results(reads, ForgetRequest(alice, ForgetScope.TURNS, turn_ids=("t9",)),
                             stream_prefix="blue") == 1  # by its turn: it may be this deployment's, older
    finally:
        reads.delete(*keys.values(), *(Job.key_for(k.removeprefix(Result.get_key(""))) for k in keys.values()))


def test_a_forget_of_an_alias_alone_erases_the_results_that_name_it(reads: _Reads) -> None:
    # break-it session: a stored hit kept the id of an alias forgotten alone (its text is the
    # canonical turn's, which stays) until the result's TTL
    alice = f"alice-{uuid.uuid4().hex}"
    hit = {"session_id": "s1", "turn_id": "t1", "text": "I adopted a cat", "aliases": ["t2"]}
    item = {"turn_id": "t3", "text": "my sister is a nurse", "qualifiers": {"session_id": "s2", "aliases": ["t4"]}}
    keys = {name: _store(reads, job_id_for(alice, name), {"tenant_id": alice, **value}) for name, value in (
        ("hit", {"hits": [hit]}), ("packet", {"hits": [], "packet": {"items": [item]}}),
        ("other", {"hits": [{**hit, "aliases": ["t5"]}]}))}
    try:
        assert erase_results(reads, ForgetRequest(alice, ForgetScope.TURNS, turn_ids=("t2", "t4")), stream_prefix="mnemos") == 2
        assert {name: reads.xlen(key) for name, key in keys.items()} == {"hit": 0, "packet": 0, "other": 1}
        assert erase_results(reads, ForgetRequest(alice, ForgetScope.SESSION, session_id="s9"), stream_prefix="mnemos") == 0
    finally:
        reads.delete(*keys.values(), *(Job.key_for(k.removeprefix(Result.get_key(""))) for k in keys.values()))


def test_a_moved_tenant_s_results_expire_soon_on_the_shard_it_left(reads: _Reads) -> None:
    # break-it session: a forget made after a tenant move erases results on the new shard's Redis
    # only; those the old shard kept held the text until MNEMOS_RESULT_TTL_S
    from workers.ingest.forget_streams import expire_results

    alice, bob = f"alice-{uuid.uuid4().hex}", f"bob-{uuid.uuid4().hex}"
    keys = {"named": _store(reads, job_id_for(alice, "r1"), _answer(alice, "t1")),
            "legacy": _store(reads, JOB_ID_PREFIX + uuid.uuid4().hex, _answer(alice, "t2")),
            "bob": _store(reads, job_id_for(bob, "r1"), _answer(bob, "t1")),
            "bob-legacy": _store(reads, JOB_ID_PREFIX + uuid.uuid4().hex, _answer(bob, "t1"))}
    try:
        assert all(50 < reads.ttl(key) <= 60 for key in keys.values())  # _store's ttl
        assert expire_results(reads, alice, 5, stream_prefix="mnemos") == 2
        ttls = {name: reads.ttl(key) for name, key in keys.items()}
        assert 0 < ttls["named"] <= 5 and 0 < ttls["legacy"] <= 5 and ttls["bob"] > 50 and ttls["bob-legacy"] > 50
        assert expire_results(reads, alice, 30, stream_prefix="mnemos") == 0  # never later than before
    finally:
        reads.delete(*keys.values(), *(Job.key_for(k.removeprefix(Result.get_key(""))) for k in keys.values()))
