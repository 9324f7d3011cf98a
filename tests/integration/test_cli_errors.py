"""Every CLI failure is one line on stderr with its exit code, and no configured password is ever printed.

The commands run as subprocesses (``python -m workers``), so their stderr holds exactly what an
operator sees: the log lines (timestamped) and, for a failed command, one ``Error: ...`` line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from click.testing import CliRunner
from psycopg import sql

from api.heartbeats import live_workers
from tests.integration.factories import conversation_turns, ingest_turns
from tests.support import PG_ADMIN_URL, REDIS_URL, REPO, process_env
from workers.cli import cli
from workers.ops.migrate import ensure_database
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

SECRET = "pw-Ub3rS3cret"  # trust authentication and a password-less Redis accept and ignore it
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _with_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    user, _, host = rest.rpartition("@")
    return f"{scheme}://{user}:{SECRET}@{host}" if user else f"{scheme}://:{SECRET}@{host}"


def _mnemos(settings: Settings, *args: str, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workers", *args], env=process_env(settings, **extra), cwd=REPO,
                          input=stdin, capture_output=True, text=True, timeout=120)


def _one_error(out: subprocess.CompletedProcess) -> str:
    """The single non-log line a failed command printed on stderr (it must be the only one)."""
    lines = [line for line in out.stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr
    return lines[0]


def _one_worker_error(out: subprocess.CompletedProcess) -> str:
    """A worker that cannot start logs exactly one ERROR line and no traceback."""
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert not [line for line in out.stderr.splitlines() if line.strip() and not LOG_LINE.match(line)], out.stderr
    return errors[0]


@pytest.fixture
def bare_settings(settings: Settings) -> Iterator[Settings]:
    """Settings whose database exists but was never migrated."""
    name = f"mnemos_test_{uuid.uuid4().hex[:12]}"
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    ensure_database(url)
    yield settings.replace(database_url=url)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_an_unmigrated_database(bare_settings: Settings) -> None:
    out = _mnemos(bare_settings, "worker", "ingest")
    assert out.returncode == 2
    assert "mnemos migrate" in _one_worker_error(out)
    out = _mnemos(bare_settings, "reindex", "--no-progress")
    assert out.returncode == 2 and "not up to date" in _one_error(out) and "mnemos migrate" in out.stderr
    out = _mnemos(bare_settings, "health", "--no-models")
    assert out.returncode == 2  # as every command: an operator must act first
    assert [line for line in out.stdout.splitlines() if line.startswith("FAIL")] == [
        "FAIL postgres: the database schema is not up to date (no migration was ever applied): run `mnemos migrate`"]
    assert _one_error(out) == ("Error: postgres: the database schema is not up to date (no migration was ever "
                               "applied): run `mnemos migrate`")


def test_a_database_that_does_not_exist(settings: Settings) -> None:
    missing = settings.replace(database_url=f"postgresql://postgres@127.0.0.1:5432/mnemos_test_{uuid.uuid4().hex[:12]}")
    out = _mnemos(missing, "worker", "query")
    assert out.returncode == 2
    line = _one_worker_error(out)
    assert "does not exist" in line and "mnemos migrate" in line
    out = _mnemos(missing, "health", "--no-models")
    assert out.returncode == 2 and "FAIL postgres: database" in out.stdout and "mnemos migrate" in out.stdout
    line = _one_error(out)
    assert line.startswith("Error: postgres: database") and "does not exist" in line and "mnemos migrate" in line


def test_stored_embeddings_of_another_dimension(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a"))  # dimension 64
    other = settings.replace(fake_encoder_dim=32)
    for kind in ("ingest", "query"):
        out = _mnemos(other, "worker", kind)
        assert out.returncode == 2
        line = _one_worker_error(out)
        assert "rendering 1, dimension 64 but this worker makes rendering 1, dimension 32" in line
        assert "mnemos reindex" in line
    out = _mnemos(other, "health")
    assert out.returncode == 2 and "FAIL embeddings: stored embeddings of 1 tenant are" in out.stdout
    assert _one_error(out).startswith("Error: embeddings: stored embeddings of 1 tenant are")
    out = _mnemos(other, "reindex", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "reindexed 1 tenant(s) to rendering 1, dimension 32: 8 turns embedded" in out.stdout
    assert _mnemos(other, "health").returncode == 0


def test_retrieve_without_a_query_worker_says_so_at_once(settings: Settings) -> None:
    """Refused before anything is enqueued, so the client never waits for its (long) timeout."""
    settings = settings.replace(retrieve_timeout_s=600.0)
    started = time.monotonic()
    out = _mnemos(settings, "retrieve", "--tenant", "alice", "where is Pixel")
    assert out.returncode == 1
    assert "no query worker is running" in _one_error(out)
    assert time.monotonic() - started < settings.retrieve_timeout_s  # it did not wait for the timeout
    queue_keys = redis.Redis.from_url(REDIS_URL).keys(f"rq:queue:{settings.queue_name}*")
    assert queue_keys == []  # nothing was enqueued


def test_publish_to_an_unreachable_redis(settings: Settings) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{_free_port()}/0"
    line = '{"tenant_id": "a", "session_id": "s", "turn_id": "t", "role": "user", "text": "hi", ' \
           '"occurred_at": "2024-01-01T00:00:00Z"}\n'
    out = _mnemos(settings.replace(redis_url=url), "publish", stdin=line)
    assert out.returncode == 1
    assert "Connection refused" in _one_error(out)
    assert SECRET not in out.stdout + out.stderr


GOOD_LINE = '{"tenant_id": "a", "session_id": "s", "turn_id": "t", "role": "user", "text": "hi", ' \
            '"occurred_at": "2024-01-01T00:00:00Z"}\n'


@pytest.mark.parametrize(("lines", "message"), [
    ("not json\n", "line 1: not JSON"),
    (GOOD_LINE + "[1, 2]\n", "line 2: a turn is a JSON object, not list"),
    (GOOD_LINE + "\n" + GOOD_LINE.replace('"occurred_at": "2024-01-01T00:00:00Z"', '"occurred_at": null'),
     "line 3: occurred_at: is missing"),
])
def test_a_bad_publish_line_is_refused_with_its_line_number_and_exit_2(settings: Settings, redis_client: redis.Redis,
                                                                      lines: str, message: str) -> None:
    """Found by a new-user session: these exited 1, one as an internal TypeError, and a bad field was
    named by a 0-based index while JSON errors named 1-based lines."""
    before = redis_client.xlen(settings.turns_stream) if redis_client.exists(settings.turns_stream) else 0
    out = _mnemos(settings, "publish", stdin=lines)
    assert out.returncode == 2, out.stderr[-2000:]
    error = _one_error(out)
    assert error.startswith("Error: nothing published: ") and message in error
    assert (redis_client.xlen(settings.turns_stream) if redis_client.exists(settings.turns_stream) else 0) == before


def test_a_line_that_is_not_utf8_is_refused_with_its_number_and_empty_input_says_so(
        settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    """Break-it round 12: invalid UTF-8 ended as an internal UnicodeDecodeError with exit 1 (a
    service failure), and an empty input printed "published 0 turns to ;"."""
    source = tmp_path / "turns.jsonl"
    source.write_bytes(GOOD_LINE.encode() + GOOD_LINE.replace('"hi"', '"caf\\u00e9"').encode()
                       + b'{"text": "caf\xe9"}\n')
    out = _mnemos(settings, "publish", str(source))
    assert out.returncode == 2, out.stderr[-2000:]
    assert _one_error(out).startswith("Error: nothing published: line 3: not UTF-8")
    assert not redis_client.exists(settings.turns_stream)
    source.write_text("[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")  # break-it round 15: RecursionError
    deep = _mnemos(settings, "publish", str(source))
    assert deep.returncode == 2 and _one_error(deep) == "Error: nothing published: line 1: not JSON (nested too deeply)"
    empty = _mnemos(settings, "publish", stdin="\n")
    assert empty.returncode == 0 and empty.stdout.strip() == "nothing published: the input holds no turns"
    # break-it round 14: reading bytes lost text mode's lone-CR line ends; a byte order mark is skipped
    source.write_bytes(b"\xef\xbb\xbf" + GOOD_LINE.replace("\n", "\r").encode() * 2)
    both = _mnemos(settings, "publish", str(source))
    assert both.returncode == 0 and both.stdout.startswith("published 2 turns"), both.stderr[-2000:]


@pytest.mark.parametrize(("variable", "value"), [
    ("MNEMOS_REDIS_URL", f"redis//:{SECRET}@127.0.0.1/0"),
    ("MNEMOS_REDIS_URL", f"redis://:{SECRET}@127.0.0.1:six/0"),
    ("MNEMOS_REDIS_URL", f"redis:/:{SECRET}@127.0.0.1:6379/0"),  # one slash: redis-py's ValueError, exit 1 before
    ("MNEMOS_DATABASE_URL", f"postgresql//postgres:{SECRET}@127.0.0.1/x"),
    ("MNEMOS_DATABASE_URL", f"postgresql://postgres:{SECRET}@127.0.0.1:five/x"),
    ("MNEMOS_DATABASE_URL", f"mysql://root:{SECRET}@127.0.0.1/x"),
])
def test_malformed_urls_are_one_line_without_the_password(variable: str, value: str) -> None:
    for command in (["migrate"], ["health", "--no-models"], ["worker", "ingest"]):
        result = CliRunner().invoke(cli, command, env={variable: value})
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"Error: {variable}="), result.output
        assert SECRET not in result.output and "***" in lines[0]


def test_migrate_an_unreachable_database(settings: Settings) -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{_free_port()}/mnemos_nowhere"
    out = _mnemos(settings.replace(database_url=url), "migrate")
    assert out.returncode == 1
    assert "Connection refused" in _one_error(out)
    assert SECRET not in out.stdout + out.stderr
    debug = _mnemos(settings.replace(database_url=url), "--debug", "migrate")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_no_configured_password_is_ever_printed(settings: Settings, redis_client: redis.Redis) -> None:
    secret = settings.replace(redis_url=_with_password(REDIS_URL), database_url=_with_password(settings.database_url),
                              heartbeat_ttl_s=3.0)
    assert SECRET in secret.redis_url and SECRET in secret.database_url
    outputs = []
    outputs.append(_mnemos(secret, "--log-level", "DEBUG", "migrate"))
    turn = ('{"tenant_id": "alice", "session_id": "s", "turn_id": "t1", "role": "user", "text": "my cat is grey", '
            '"occurred_at": "2024-01-01T00:00:00Z"}\n')
    outputs.append(_mnemos(secret, "--log-level", "DEBUG", "publish", stdin=turn))
    outputs.append(_mnemos(secret, "--log-level", "DEBUG", "retrieve", "--tenant", "alice", "cat"))  # no worker
    assert outputs[-1].returncode == 1
    worker = subprocess.Popen([sys.executable, "-m", "workers", "--log-level", "DEBUG", "worker", "ingest"],
                              env=process_env(secret), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 60
        while not live_workers(redis_client, secret.stream_prefix, "ingest") and time.monotonic() < deadline:
            assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
            time.sleep(0.2)
        outputs.append(_mnemos(secret, "health"))
        assert outputs[-1].returncode == 0, outputs[-1].stdout
        assert "ingest workers: 1 live" in outputs[-1].stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        worker_log, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0 and "redis://:***@" in worker_log
    down = secret.replace(redis_url=f"redis://:{SECRET}@127.0.0.1:{_free_port()}/0",
                          database_url=f"postgresql://postgres:{SECRET}@127.0.0.1:{_free_port()}/x")
    outputs.append(_mnemos(down, "health", "--no-models"))
    outputs.append(_mnemos(down, "worker", "suppression"))
    outputs.append(_mnemos(down, "migrate"))
    assert [o.returncode for o in outputs] == [0, 0, 1, 0, 1, 2, 1]
    last = outputs[4].stderr.strip().splitlines()[-1]  # psycopg's pool logs multi-line warnings before it
    assert last.startswith("Error: redis: ") and last.endswith("(1 more failed check above)")
    for out in outputs:
        assert SECRET not in out.stdout + out.stderr, out.stdout + out.stderr
    assert SECRET not in worker_log


def test_a_benchmark_that_cannot_reach_its_database_is_one_line(settings: Settings, tmp_path: Path) -> None:
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([{
        "sample_id": "conv-x", "qa": [{"question": "Who has a cat?", "answer": "Ann", "evidence": ["D1:1"],
                                       "category": 4}],
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bo", "session_1_date_time": "1:56 pm on 8 May, 2023",
                         "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I have a grey cat."},
                                       {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely."}]}}]))
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{_free_port()}/mnemos_nowhere"
    out = _mnemos(settings.replace(database_url=url), "bench", "service", "--data", str(data), "--reranker", "fake")
    assert out.returncode == 1
    assert "Connection refused" in _one_error(out)
    assert SECRET not in out.stdout + out.stderr
    data.write_text('{"not": "LoCoMo"}')  # break-it round 15: exit 1 with "(run with --debug ...)"
    wrong = _mnemos(settings.replace(database_url=url), "bench", "service", "--data", str(data), "--reranker", "fake")
    assert wrong.returncode == 2 and "error: " in wrong.stdout + wrong.stderr and "--debug" not in wrong.stderr


def test_a_killed_reindex_resumes_where_it_stopped(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a"))  # creates the tenant at dimension 64
    with psycopg.connect(settings.database_url, autocommit=True) as conn:  # many more rows, fast
        conn.execute("INSERT INTO entries (tenant_id, turn_id, session_id, role, text, occurred_at, embedding)"
                     " SELECT 'alice', 'bulk' || i, 's9', 'user', 'bulk turn number ' || i, now(), %s"
                     " FROM generate_series(1, 3000) AS i", (b"\0" * 4 * 64,))

    def staged() -> int:
        with psycopg.connect(settings.database_url) as conn:
            return int(conn.execute("SELECT count(*) FROM entries WHERE reindex_embedding IS NOT NULL").fetchone()[0])

    other = settings.replace(fake_encoder_dim=32, reindex_batch_size=5)
    child = subprocess.Popen([sys.executable, "-m", "workers", "reindex"], env=process_env(other), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while staged() < 50:
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)
    child.kill()
    child.communicate()
    done = staged()
    while True:  # a COMMIT sent just before the kill may still land
        time.sleep(0.3)
        if staged() == done:
            break
        done = staged()
    with psycopg.connect(settings.database_url) as conn:
        assert conn.execute("SELECT embedding_dim FROM tenants").fetchone() == (64,)  # not swapped yet
    out = _mnemos(other, "reindex", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert f"{3008 - done} turns embedded, {done} already done by an earlier run" in out.stdout
    with psycopg.connect(settings.database_url) as conn:
        assert conn.execute("SELECT embedding_dim FROM tenants").fetchone() == (32,)
        assert conn.execute("SELECT DISTINCT octet_length(embedding) FROM entries").fetchall() == [(128,)]


def _probe_command() -> list[str]:
    """The readiness probe the manifests run in every worker pod (``mnemos health ...``), as a module call."""
    import yaml

    commands = set()
    for worker in ("ingest", "query", "suppression"):
        doc = yaml.safe_load((REPO / "deploy" / "k8s" / "base" / f"deployment-{worker}.yaml").read_text())
        commands.add(tuple(doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]))
    (command,) = commands
    assert command[0] == "mnemos"
    return list(command[1:])


AT_SECRET = "Ub3r@S3cr3t-pw"  # an unencoded '@': redis-py takes the password up to the host's '@'


@pytest.mark.parametrize(("redis_url", "database_url", "code"), [
    (f"redis://:{AT_SECRET}@127.0.0.1:{{r}}/0", f"postgresql://postgres:{SECRET}@127.0.0.1:{{p}}/x", 1),
    (f"rediss://default:{AT_SECRET}@127.0.0.1:{{r}}/0", f"host=127.0.0.1 port={{p}} password={SECRET} dbname=x", 1),
    (f"redis://127.0.0.1:{{r}}/0?password={SECRET}", f"postgresql://127.0.0.1:{{p}}/x?password={SECRET}", 1),
    (REDIS_URL, f"postgresql://postgres:{AT_SECRET}@127.0.0.1:{{p}}/x", 2),  # libpq would cut at the first '@'
])
def test_the_readiness_probe_never_prints_a_password(redis_url: str, database_url: str, code: int) -> None:
    """kubelet copies a failed probe's output into pod events: no part of a configured password may be in it."""
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "MNEMOS_REDIS_URL": redis_url.format(r=_free_port()), "MNEMOS_DATABASE_URL": database_url.format(p=_free_port())}
    out = subprocess.run([sys.executable, "-m", "workers", *_probe_command()], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == code, out.stdout + out.stderr
    printed = out.stdout + out.stderr
    for fragment in (SECRET, AT_SECRET, *AT_SECRET.split("@")):
        assert fragment not in printed, printed
    assert "***" in printed


def test_a_burst_that_loses_redis_fails_instead_of_ending(settings, caplog: pytest.LogCaptureFixture) -> None:
    from workers.launch import process

    lost = settings.replace(redis_url="redis://127.0.0.1:1/0", metrics_enabled=False)  # nothing listens there
    assert process.run_query(lost, burst=True) == 1  # the queue was never emptied: not a success
    assert "lost Redis before the queue was empty" in caplog.text


def test_commands_without_a_running_service_say_so_at_once(settings: Settings, redis_client: redis.Redis) -> None:
    """New-user trial and break-it round 15: `demo --no-spawn` waited 2 minutes before naming the
    missing workers, a forget with no ingest worker looked applied, `demo --wait -1` was accepted and
    `reshard where --tenant ''` named a shard."""
    demo = _mnemos(settings, "demo", "--no-spawn")
    assert demo.returncode == 1 and "no query worker has a live heartbeat" in _one_error(demo)
    assert not redis_client.exists(settings.turns_stream)  # nothing published before saying so
    for wait in ("-1", "nan"):
        bad = _mnemos(settings, "demo", "--no-spawn", "--wait", wait)
        assert bad.returncode == 2 and "--wait" in _one_error(bad)
    where = _mnemos(settings, "reshard", "where", "--tenant", "")
    assert where.returncode == 2 and "--tenant" in _one_error(where)
    forgot = _mnemos(settings, "forget", "--tenant", "alice")
    assert forgot.returncode == 0 and forgot.stdout.startswith("published forget of the whole tenant alice to ")
    assert "no ingest worker has a live heartbeat on this shard" in forgot.stderr


def test_up_without_an_answering_redis_stops_at_once(settings: Settings) -> None:
    """Break-it round 15: `mnemos up --no-embedded` with a Redis that does not answer migrated, then
    ran workers that retried for ever, and never exited."""
    out = _mnemos(settings.replace(redis_url="redis://127.0.0.1:1/0"), "up", "--no-embedded")
    assert out.returncode == 1 and _one_error(out).startswith("Error: Redis: ")


def test_a_burst_ends_with_0_only_when_it_emptied_the_queue(settings, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Break-it round 16: rq ends its loop on a Redis timeout as on an empty queue, and the burst
    exited 0 with 3,967 jobs still queued."""
    import rq.worker.base

    from workers.launch import process

    quiet = settings.replace(metrics_enabled=False)
    assert process.run_query(quiet, burst=True) == 0  # an empty queue: done

    def stalled(self, timeout, max_idle_time=None):
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(rq.worker.base.BaseWorker, "dequeue_job_and_maintain_ttl", stalled)
    assert process.run_query(quiet, burst=True) == 1
    assert "the work loop ended before the queue was empty" in caplog.text
