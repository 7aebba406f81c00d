"""The real `make run`, as README.md shows it, on a scratch var/ (SQLite and the embedded broker, as on a
fresh machine): a live demo fleet, the README's curl and mktoken as written, a quiet console, a second
`make run` refused naming what holds the port, and Ctrl-C stopping everything it started.

The web server goes to a free port (`RUN_BIND`) so a developer's own `make run` on :8000 does not
matter; the demo fleet's addresses are fixed, so this holds them (`demo_fleet_addresses`) as
tests/fleets/test_demo.py does, and a running demo fleet skips both.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from apps.core import ports
from apps.fleets import demo
from tests import readme
from tests.netutil import http_get, pick_free_port
from tests.processes import REPO

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]

START_TIMEOUT_S = 300.0  # pip check, migrations on SQLite and the first roll-out, on a loaded 2-core machine
BANNER = re.compile(r"Spillway on http://(\S+)/")


def _env(var: Path) -> dict[str, str]:
    """A fresh machine's environment: none of the suite's settings, a var/ of its own."""
    dropped = ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "FIELD_ENCRYPTION_KEY", "SPILLWAY_TESTING",
               "DJANGO_SETTINGS_MODULE", "MAKEFLAGS", "MAKELEVEL")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PYTEST_")}
    env["SPILLWAY_VAR_DIR"] = str(var)
    return env


def _children(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def _wait_for(path: Path, pattern: re.Pattern[str], proc: subprocess.Popen, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = pattern.search(path.read_text(errors="replace"))
        if found:
            return found
        assert proc.poll() is None, f"make run exited with {proc.returncode}:\n{path.read_text()}"
        time.sleep(1)
    raise AssertionError(f"no {pattern.pattern!r} within {timeout_s:.0f} s:\n{path.read_text()}")


def test_make_run_as_shown_serves_the_demo_fleet_and_refuses_a_second_run(haproxy_bin, demo_fleet_addresses,
                                                                          tmp_path) -> None:
    addresses = demo.demo_addresses()
    env = _env(tmp_path / "var")
    port = pick_free_port()
    bind = f"127.0.0.1:{port}"
    run = [*shlex.split(readme.command("make run")), f"RUN_BIND={bind}"]
    console = tmp_path / "console.log"
    with console.open("wb") as out:
        # A session of its own: Ctrl-C in a terminal signals the whole foreground group, and so does the test.
        proc = subprocess.Popen(run, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert _wait_for(console, BANNER, proc, START_TIMEOUT_S).group(1) == bind
        text = console.read_text()
        assert "demo fleet: 4/4 HAProxy nodes serving `edge`" in text, text
        assert "admin / spillway-admin-demo" in text  # the logins

        # README's curl, as written, through a demo node.
        curl = subprocess.run(shlex.split(readme.command("curl ")), capture_output=True, text=True, timeout=30)
        assert curl.returncode == 0 and curl.stdout.startswith("acme-us-east-"), curl

        # README's mktoken, as written (var/local.env from make run; no DEBUG=1), used on the live server.
        line = readme.command(".venv/bin/python manage.py mktoken")
        token = subprocess.run(shlex.split(line), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert token.returncode == 0 and "Traceback" not in token.stderr, token.stderr
        status, body = http_get(f"http://{bind}/api/v1/load-balancers/", timeout_s=30,
                                headers={"Authorization": f"Bearer {token.stdout.strip()}"})
        assert status == 200 and [lb["name"] for lb in json.loads(body)["results"]] == ["edge"]

        read = {"Authorization": f"Bearer {token.stdout.strip()}"}
        # Golden signals out of the box, before any change (the start's own roll-out is what the nodes serve):
        # requests through the demo nodes show on the LB's chart within seconds.
        lb_id = json.loads(http_get(f"http://{bind}/api/v1/load-balancers/", timeout_s=30, headers=read)[1])[
            "results"][0]["id"]
        for _ in range(10):
            subprocess.run(shlex.split(readme.command("curl ")), capture_output=True, text=True, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            chart = json.loads(http_get(f"http://{bind}/api/v1/signals/?scope=lb&id={lb_id}", timeout_s=30,
                                        headers=read)[1])
            if chart["totals"]["requests"] >= 10:
                break
            assert time.monotonic() < deadline, f"no requests on the LB's chart: {chart['totals']}"
            time.sleep(1)

        # A real change: one line on the console when every node applied it (the event), nothing per second.
        applied = re.compile(r"event change\.applied \[ops\]: edge is applied on every node \(revision (\d+)\)")
        before = {int(r) for r in applied.findall(console.read_text())}  # the start's own roll-out
        auth = {"Authorization": f"Bearer {token.stdout.strip()}", "Content-Type": "application/json"}
        member = json.loads(http_get(f"http://{bind}/api/v1/members/", timeout_s=30, headers=auth)[1])["results"][0]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("PATCH", f"/api/v1/members/{member['id']}/", body=json.dumps({"weight": 50}), headers=auth)
        assert conn.getresponse().status == 200
        conn.close()
        deadline = time.monotonic() + 120
        while not {int(r) for r in applied.findall(console.read_text())} - before:
            assert time.monotonic() < deadline, f"no event line for the change:\n{console.read_text()}"
            time.sleep(1)

        # A second `make run` while this one runs: refused before starting anything, naming the holder.
        second = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        refused = re.search(rf"cannot start: {re.escape(bind)} held by gunicorn \(pid \d+\).*, a `make run` "
                            r"\(manage.py runall, pid (\d+)\) is running\. Stop it first",
                            second.stdout + second.stderr)
        assert refused, second.stdout + second.stderr
        # ... before it touched the database the first run is using: no migrate, no demo load.
        assert "manage.py migrate" not in second.stdout and "loaddemo" not in second.stdout, second.stdout
        assert int(refused.group(1)) in _children(proc.pid)  # the runall this `make run` started
        curl = subprocess.run(shlex.split(readme.command("curl ")), capture_output=True, text=True, timeout=30)
        assert curl.stdout.startswith("acme-us-east-"), "the second run disturbed the first one's fleet"

        # The console: no per-second INFO of beat or the worker (those stay in var/log/).
        after = console.read_text().split("Spillway on http://", 1)[1]
        assert "Sending due task" not in after and " succeeded in " not in after, after
        assert "Sending due task" in (tmp_path / "var" / "log" / "beat.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # Everything it started is gone: the web port and every demo address are free again.
    time.sleep(1)
    assert ports.is_free("127.0.0.1", port)
    assert [a for a in addresses if not ports.is_free(*a)] == []
