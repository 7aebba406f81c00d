"""Child processes a test starts (workers, dispatchers, servers): their environment and how they are stopped."""

from __future__ import annotations

import os
import signal
import subprocess
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
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
