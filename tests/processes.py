"""Child processes a test starts (workers, dispatchers, servers): their environment and how they are stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def process_env(**extra: str) -> dict[str, str]:
    """Environment for a child process (worker, dispatcher) that must see the *test* database.

    pytest-django renames the database to test_<name>; children get a DATABASE_URL
    pointing at that name so they read and write the rows the test made (use
    `transactional_db` so those rows are committed).
    """
    from django.db import connection

    env = dict(os.environ)
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
        env["DATABASE_URL"] = f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    else:
        env["DATABASE_URL"] = f"sqlite:///{s['NAME']}"
    env["SPILLWAY_TESTING"] = "1"
    env["CELERY_TASK_ALWAYS_EAGER"] = "0"
    # A Celery worker runs Django's system checks at start (~0.3 s of CPU, the URLconf imported for them): over
    # the suite's ~50 worker starts, ~15 s. tests/core/test_system_checks.py runs them once instead.
    env["CELERY_SKIP_CHECKS"] = "1"
    env.update(extra)
    return env


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop a child we started, by PID: SIGTERM, then SIGKILL."""
    stop_processes([proc], timeout_s)


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Stop children we started, by PID, together: SIGTERM to all, then SIGKILL to any still running after
    `timeout_s` (a Celery worker's warm shutdown takes ~1.7 s here, and three of them one by one added up)."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass
class CeleryWorker:
    """A `celery worker` a test started (tests/conftest.celery_worker_factory), with its log."""

    proc: subprocess.Popen | ForkedProcess
    log: Path
    pool: str
    concurrency: int


# Workers done with every task, still exiting: reaped by reap_leaving.
_LEAVING: list[subprocess.Popen | ForkedProcess] = []


def stop_celery_workers(workers: list[CeleryWorker], timeout_s: float = 10.0) -> None:
    """Warm-stop workers together and return once each has exited or, for a prefork worker, once each of its
    pool processes has said it is done with its tasks (controlplane.celery.POOL_PROCESS_LEAVES): billiard keeps a
    pool process ~1 s after that, and its worker waits for it, ~2 s a stop that a test's teardown spent waiting.
    Such a worker runs no task any more and takes none: it is reaped later (reap_leaving: before the next workers
    start, and at the end of the session), by PID."""
    from controlplane.celery import POOL_PROCESS_LEAVES

    running = [w for w in workers if w.proc.poll() is None and w.proc not in _LEAVING]  # not stopped already
    since = {w.proc.pid: w.log.stat().st_size for w in running}
    for worker in running:
        worker.proc.send_signal(signal.SIGTERM)
    marker = POOL_PROCESS_LEAVES.encode()  # then " <pid> (exit code N)"
    deadline = time.monotonic() + timeout_s
    while running and time.monotonic() < deadline:
        waiting = []
        for worker in running:
            if worker.proc.poll() is not None:
                continue
            if worker.pool == "prefork":
                with worker.log.open("rb") as log:
                    log.seek(since[worker.proc.pid])
                    said = {int(pid) for pid in re.findall(re.escape(marker) + rb" (\d+)", log.read())}
                # Every pool process alive now has said so (one billiard replaced after its word would not have).
                if said and children(worker.proc.pid) <= said:
                    _LEAVING.append(worker.proc)
                    continue
            waiting.append(worker)
        running = waiting
        if running:
            time.sleep(0.02)
    for worker in running:
        worker.proc.kill()
        worker.proc.wait(timeout=5)


def children(pid: int) -> set[int]:
    """PIDs whose parent is `pid` (/proc/<pid>/task/*/children is not on every kernel)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def reap_leaving(timeout_s: float = 10.0) -> None:
    """Wait for the workers stop_celery_workers left exiting (SIGKILL past `timeout_s`)."""
    while _LEAVING:
        proc = _LEAVING.pop()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class ForkedProcess:
    """What subprocess.Popen gives the tests, for a worker tests/forkserver.py forked (the server's child, not ours:
    the server reaps it and tells its exit status)."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a PID that may have been given to another process
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """tests/forkserver.py, started once per test process, for workers whose environment is `env`."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self._lock = threading.Lock()
        self._log = tempfile.NamedTemporaryFile(prefix="spillway-forkserver-", suffix=".log", delete=False)  # noqa: SIM115
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver"], cwd=REPO, env=env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        if not self._proc.stdout.readline():
            self._proc.wait(timeout=10)
            raise RuntimeError(f"the fork server did not start:\n{Path(self._log.name).read_text()}")

    def _ask(self, request: dict) -> dict:
        with self._lock:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            answer = self._proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server is gone:\n{Path(self._log.name).read_text()}")
        return json.loads(answer)

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
        log.touch()  # there before the child opens it, as Popen's caller opened it
        pid = self._ask({"spawn": argv, "env": env, "log": str(log), "cwd": str(REPO)})["pid"]
        return ForkedProcess(self, pid, argv)

    def status(self, pid: int) -> int | None:
        return self._ask({"status": pid})["returncode"]

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=10)
        self._log.close()
        os.unlink(self._log.name)


# Read when used, never at import or by settings: a process forked under other values gets the caller's in os.environ.
_READ_AT_RUNTIME = frozenset({"PYTEST_CURRENT_TEST", "DJANGO_ALLOW_ASYNC_UNSAFE"})
_FORK_SERVERS: dict[tuple[tuple[str, str], ...], ForkServer] = {}  # by the environment they imported under
_STARTS: dict[tuple[tuple[str, str], ...], int] = {}


def start_python(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen | ForkedProcess:
    """`python <argv>` in the checkout, for `-m celery ...` or `manage.py ...`, its output in `log`.

    The second start under one environment (but for variables read when used) starts a fork server for it
    (tests/forkserver.py), and that start and every later one fork from it with the imports done; a first start
    runs cold, as most environments a test adds to are used once."""
    if argv[:2] != ["-m", "celery"] and Path(argv[0]).name != "manage.py":
        raise ValueError(f"the fork server runs `-m celery` and `manage.py` only, not {argv[:2]}")
    key = tuple(sorted((k, v) for k, v in env.items() if k not in _READ_AT_RUNTIME))
    _STARTS[key] = _STARTS.get(key, 0) + 1
    if key not in _FORK_SERVERS and _STARTS[key] >= 2:
        _FORK_SERVERS[key] = ForkServer(env)
    if key in _FORK_SERVERS:
        return _FORK_SERVERS[key].spawn(argv, env, log)
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def close_fork_servers() -> None:
    """At the end of the session (their children are stopped and reaped by then)."""
    while _FORK_SERVERS:
        _FORK_SERVERS.popitem()[1].close()
