"""Scheduling test helpers: jobs made through the service (as the API would), dispatcher processes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.scheduling import runner, services
from apps.scheduling.models import Job
from tests.processes import process_env, start_python, stop_processes


@pytest.fixture(autouse=True)
def _heartbeat_forgets_this_tests_runs() -> Iterator[None]:
    """Runs a test claimed in this process and never finished stay in the runner's heartbeat (a worker would
    finish them): the heartbeat thread would go on writing them to this worker's test database every 2 s, hold
    a connection to it when the suite drops it ("being accessed by other users"), and log its failures into
    streams pytest has closed. Idle, the thread gives its connection back at its next beat (within 2 s)."""
    yield
    with runner.HEARTBEAT._lock:
        left = list(runner.HEARTBEAT._runs)
    for run_id in left:
        runner.HEARTBEAT.discard(run_id)


@pytest.fixture
def make_job() -> Callable[..., Job]:
    def make(org, name: str = "job", **fields: Any) -> Job:
        secret = fields.pop("webhook_secret", None)
        data: dict[str, Any] = {"org": org, "name": name, "kind": "noop", "params": {},
                                "schedule_type": "interval", "interval_s": 60}
        data.update(fields)
        return services.job_save(principal=None, job=Job(), data=data, webhook_secret=secret)

    return make


@pytest.fixture
def dispatcher_factory(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start real `manage.py dispatcher` processes against the test database; stopped by PID."""
    procs: list[subprocess.Popen] = []

    def start(name: str = "d1", *args: str) -> subprocess.Popen:
        log_path = tmp_path / f"dispatcher-{name}.log"
        proc = start_python(["manage.py", "dispatcher", *args], process_env(LOG_LEVEL="INFO"), log_path)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if b"dispatcher ready" in log_path.read_bytes():
                return proc
            if proc.poll() is not None:
                raise RuntimeError(log_path.read_text())
            time.sleep(0.1)
        raise RuntimeError(f"dispatcher {name} did not start in 30 s")

    yield start
    stop_processes(procs)
