"""A gunicorn child serving the API the way `make run` does, on a free port, for API benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.netutil import pick_free_port

REPO = Path(__file__).resolve().parents[2]


def fresh_database(url: str) -> None:
    """Drop and re-create the benchmark database `url` names (never the suite's)."""
    import dj_database_url
    import psycopg

    from tests.bench._db import ensure_database

    cfg = dj_database_url.parse(url)
    admin = psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                            dbname="postgres", autocommit=True)
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{cfg["NAME"]}" WITH (FORCE)')
    ensure_database(url, "the API under test runs on PostgreSQL")


@contextmanager
def gunicorn() -> Iterator[str]:
    """Yield the base URL of the web server exactly as runall starts it (apps.core.webserver)."""
    port = pick_free_port()
    from apps.core.webserver import gunicorn_command

    cmd = gunicorn_command(f"127.0.0.1:{port}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=os.environ.copy(), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()  # in-flight long-polls would hold a graceful stop for a minute
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
