"""`make run` (manage.py runall) refuses to start over a running one and names what holds the ports."""

from __future__ import annotations

import os
import socket

import pytest
from django.core.management import CommandError, call_command

from apps.core import ports
from apps.fleets import demo
from tests.netutil import pick_free_port


def test_a_taken_port_is_reported_with_the_process_holding_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not ports.is_free("127.0.0.1", port)
        assert ports.taken([("127.0.0.1", port)])[0].endswith(f" (pid {os.getpid()})")
        expected = rf"cannot start: 127.0.0.1:{port} held by \S+ \(pid {os.getpid()}\)\. Is `make run` already"
        with pytest.raises(CommandError, match=expected):
            call_command("runall", "--bind", f"127.0.0.1:{port}")
    assert ports.is_free("127.0.0.1", port)


def test_a_taken_demo_address_stops_the_start_naming_it(monkeypatch, settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path  # the leftover clean-up reads the demo's pid file under VAR_DIR
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        free_web = pick_free_port()
        monkeypatch.setattr(demo, "demo_addresses", lambda: [("127.0.0.1", port)])
        with pytest.raises(CommandError, match=rf"demo fleet, its addresses are taken:\n  127.0.0.1:{port} held by "
                                               rf"\S+ \(pid {os.getpid()}\)"):
            call_command("runall", "--bind", f"127.0.0.1:{free_web}")


def test_the_console_shows_warnings_errors_and_events_and_the_log_keeps_everything(tmp_path) -> None:
    """GIVEN a child printing beat's per-second INFO, a client's 404, an event, an error with its traceback
    WHEN runall pumps its output THEN the console shows only what a person needs, var/log/ all of it."""
    import io
    import subprocess
    import sys

    from django.core.management.base import OutputWrapper

    from apps.core.management.commands.runall import _pump

    lines = [
        "[2026-11-23 01:02:25,296: INFO/MainProcess] Scheduler: Sending due task fleets-enforce (fleets.enforce_task)",
        "2026-11-23 01:03:12,624 WARNING django.request request_id=- Not Found: /favicon.ico",
        "[2026-11-23 01:01:56,946: INFO/ForkPoolWorker-1] event change.applied [ops]: edge is applied on every node",
        "[2026-11-23 01:01:57,000: INFO/ForkPoolWorker-1] fleet demo-us-east: converging rollout 5",
        "[2026-11-23 01:01:58,000: ERROR/ForkPoolWorker-1] Task fleets.push_task raised: boom",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "[2026-11-23 01:01:59,000: INFO/ForkPoolWorker-1] Task fleets.enforce_task succeeded",
    ]
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(("\n".join(lines) + "\n").encode())
    proc.stdin.close()
    out = io.StringIO()
    _pump(proc, tmp_path / "worker.log", "worker", OutputWrapper(out))
    proc.wait()
    assert out.getvalue().splitlines() == [f"worker: {line}" for line in (lines[2], lines[3], *lines[4:7])]
    assert (tmp_path / "worker.log").read_text().splitlines() == lines


def test_a_running_make_run_is_named_with_the_pid_to_stop() -> None:
    """GIVEN a `manage.py runall` whose child (here `python -m http.server`) holds the web port
    WHEN a second one starts THEN it names the holder as a person would and the runall pid to stop."""
    import signal
    import subprocess
    import sys
    import time

    port = pick_free_port()
    code = ("import subprocess, sys; c = subprocess.Popen([sys.executable, '-m', 'http.server', '--bind', "
            f"'127.0.0.1', '{port}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(c.pid, flush=True); "
            "c.wait()")
    # Its command line reads `python -c ... manage.py runall`, as runall's does: what runall_of looks for.
    parent = subprocess.Popen([sys.executable, "-c", code, "manage.py", "runall"], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while ports.is_free("127.0.0.1", port):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert ports.describe(child) == "http.server"
        assert ports.runall_of(child) == parent.pid
        expected = (rf"cannot start: 127.0.0.1:{port} held by http.server \(pid {child}\), a `make run` "
                    rf"\(manage.py runall, pid {parent.pid}\) is running\. Stop it first: Ctrl-C in its terminal, "
                    rf"or kill {parent.pid}\.")
        with pytest.raises(CommandError, match=expected):
            call_command("runall", "--bind", f"127.0.0.1:{port}")
    finally:
        os.kill(child, signal.SIGTERM)
        parent.wait(timeout=30)


def test_make_run_starts_one_worker_per_queue_and_acme_has_one_slot() -> None:
    """Every queue a task can be routed to (and the default one) has a worker of its own: ACME orders never
    wait behind fleet work; one slot, as a task orders every due certificate together. Each fleet shard's
    queue has exactly one process (its fleets' route lanes live there), and every fleet has a shard."""
    from django.conf import settings

    from apps.core.management.commands.runall import worker_commands
    from apps.fleets.rollout.queues import fleet_queue
    from controlplane.celery import app as celery_app

    commands = dict(worker_commands("python", sqlite=False))
    queues = {cmd[cmd.index("--queues") + 1]: cmd for cmd in commands.values()}
    assert len(queues) == len(commands)  # one worker per queue
    route = celery_app.amqp.router.route
    routed = {route({}, name, args=(fleet_id,))["queue"].name
              for name in ("fleets.reconcile_task", "fleets.converge_fleet_task")
              for fleet_id in range(1, 9)}
    routed |= {route({}, name)["queue"].name for name in ("events.deliver_task", "acme.renew_due_task",
                                                          "fleets.converge_task", "scheduling.run_job_task")}
    assert routed == set(queues) == {"celery", "events", "acme", *settings.FLEET_QUEUES}
    assert len(settings.FLEET_QUEUES) >= 2 and {fleet_queue(i) for i in range(1, 9)} == set(settings.FLEET_QUEUES)
    acme = queues["acme"]
    assert acme[acme.index("--concurrency") + 1] == "1"
    for queue in settings.FLEET_QUEUES:
        assert queues[queue][queues[queue].index("--pool") + 1] == "threads"  # one process
    hostnames = [cmd[cmd.index("--hostname") + 1] for cmd in queues.values() if "--hostname" in cmd]
    assert len(hostnames) == len(set(hostnames)) == len(queues) - 1
