"""Run web, Celery workers and beat together (what `make run` starts), until Ctrl-C."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.core import ports, webserver
from apps.core.discovery import app_modules
from apps.core.shutdown import stop_on_signals


class Command(BaseCommand):
    help = "Start web (gunicorn), the Celery workers, beat and the enforcer; stop them all on Ctrl-C."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument("--check", action="store_true",
                            help="only say whether a run could start here (`make run` asks before it migrates)")

    def handle(self, *args, **opts) -> None:
        py = sys.executable
        self._check_ports(opts["bind"])
        if opts["check"]:
            return
        procs: list[tuple[str, subprocess.Popen]] = []
        # Every process started below renders with it (the demo nodes run on this machine), and so does this
        # one: its settings were read before, and the demo's first roll-out runs here (start_demo_processes),
        # which left every demo node without a request log and every chart empty.
        os.environ.setdefault("SPILLWAY_SIGNALS_TARGET", settings.SIGNALS_LISTEN)
        settings.SIGNALS_TARGET = os.environ["SPILLWAY_SIGNALS_TARGET"]

        log_dir = Path(settings.VAR_DIR) / "log"
        log_dir.mkdir(parents=True, exist_ok=True)

        def spawn(name: str, cmd: list[str]) -> None:
            # Everything a child prints goes to var/log/<name>.log; the console shows only what a
            # person needs (warnings, errors, real events), not beat's and the worker's per-second INFO.
            proc = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            threading.Thread(target=_pump, args=(proc, log_dir / f"{name}.log", name, self.stdout),
                             daemon=True).start()
            procs.append((name, proc))

        # One worker first, then the others and beat: two processes creating the embedded broker's
        # tables in the same instant can race (measured), so stagger them.
        sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
        for i, (name, cmd) in enumerate(worker_commands(py, sqlite=sqlite)):
            spawn(name, cmd)
            if i == 0:
                time.sleep(3)
        spawn("beat", [py, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO"])
        # Overflow shares follow ingress within ~0.5 s (beat's enforce_task, every 1 s, is its fallback).
        spawn("enforcer", [py, str(Path(settings.BASE_DIR) / "manage.py"), "enforcer"])
        # Golden signals: the demo's loopback nodes send their request log here (SPILLWAY_SIGNALS_TARGET).
        signals_log = log_dir / "signals.log"
        seen = signals_log.stat().st_size if signals_log.exists() else 0  # the log is appended to, run after run
        spawn("signals", [py, str(Path(settings.BASE_DIR) / "manage.py"), "runsignals"])
        # Listening before anything is served: a node's log lines sent before the bind are lost (UDP), which
        # lost the first second of the demo's requests from every chart.
        _wait_for_line(signals_log, "listening on", after=seen, timeout_s=30)
        start_demo = _demo_hook("start_demo_processes")
        if start_demo is not None:
            message = start_demo()
            if message:
                self.stdout.write(message)
        spawn("web", webserver.gunicorn_command(opts["bind"]))
        self.stdout.write(self.style.SUCCESS(f"Spillway on http://{opts['bind']}/  (API docs: /api/v1/docs/)"))
        self.stdout.write(f"logs: {log_dir}/<process>.log (the console shows warnings, errors and events)")
        self.stdout.write(f"database: {settings.DATABASES['default']['ENGINE']}, broker: {settings.CELERY_BROKER_URL}")

        stopping = stop_on_signals()
        try:
            while not stopping.is_set():
                for name, proc in procs:
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping the rest")
                        stopping.set()
                stopping.wait(0.5)
        finally:
            for _name, proc in reversed(procs):
                if proc.poll() is None:
                    proc.terminate()
            for _name, proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            stop_demo = _demo_hook("stop_demo_processes")
            if stop_demo is not None:
                stop_demo()

    def _check_ports(self, bind: str) -> None:
        """Stop before starting anything when another run (or its leftovers) holds our ports."""
        host, _, port = bind.rpartition(":")
        busy = ports.taken([(host or "127.0.0.1", int(port))])
        if busy:
            runall = ports.runall_holding(int(port))
            if runall is not None:
                raise CommandError(f"cannot start: {busy[0]}, a `make run` (manage.py runall, pid {runall}) is "
                                   f"running. Stop it first: Ctrl-C in its terminal, or kill {runall}.")
            raise CommandError(f"cannot start: {busy[0]}. Is `make run` already running? Stop it first "
                               "(Ctrl-C in its terminal, or kill that pid), or serve elsewhere: "
                               "make run RUN_BIND=127.0.0.1:8001.")
        # The web port is free, so no runall is alive: demo processes recorded by an earlier run that
        # was killed hard are leftovers; stop them (by their recorded PIDs) before checking the rest.
        stop_demo = _demo_hook("stop_demo_processes")
        if stop_demo is not None:
            stop_demo()
        demo_addresses = _demo_hook("demo_addresses")
        busy = ports.taken(demo_addresses()) if demo_addresses is not None else []
        if busy:
            raise CommandError("cannot start the demo fleet, its addresses are taken:\n  " + "\n  ".join(busy)
                               + "\nStop those processes (by pid) and run `make run` again.")


def worker_commands(py: str, *, sqlite: bool) -> list[tuple[str, list[str]]]:
    """The Celery workers of `make run`, one per queue (settings.CELERY_TASK_ROUTES), as (log name, command).

    - `celery`: health, jobs, capacity runs, member changes (processes: CPU-bound work).
    - `events`: event webhook deliveries, threads, as a delivery mostly waits on I/O. SQLite takes one
      writer at a time, so few threads there.
    - `fleets.0`, `fleets.1`, ...: fleet reconciles (render, then roll out) by fleet id, ONE process each
      (threads, for fleets sharing a shard): each fleet's route lane lives in the process that last
      rendered it (apps.fleets.rollout.queues). In production a second worker per queue stands by on a lease
      (apps.fleets.rollout.shards); `make run` (one host, SQLite broker) starts one and restarts none.
    - `acme`: certificate orders and their deployment, one slot: a task orders every due certificate
      together, so a request never waits behind fleet work nor fleet work behind a batch of orders.
    """
    # No mingle or gossip: Spillway uses neither (remote control is the pidbox), and mingle's sync cost a restarted
    # worker ~1 s before it took a task.
    celery = [py, "-m", "celery", "-A", "controlplane", "worker", "--loglevel", "INFO", "--without-mingle",
              "--without-gossip"]
    fleets = [(f"fleets-worker-{shard}", [*celery, "--queues", queue, "--pool", "threads", "--concurrency",
                                          "2", "--hostname", f"fleets{shard}@%h"])
              for shard, queue in enumerate(settings.FLEET_QUEUES)]
    return [
        ("worker", [*celery, "--concurrency", "2", "--queues", "celery"]),
        *fleets,
        ("events-worker", [*celery, "--queues", "events", "--pool", "threads",
                           "--concurrency", "2" if sqlite else "8", "--hostname", "events@%h"]),
        ("acme-worker", [*celery, "--queues", "acme", "--concurrency", "1", "--hostname", "acme@%h"]),
    ]


# Lines worth a person's attention on the console (warnings, errors, one line per event, a fleet
# re-converging); everything else stays in var/log/. A client's 4xx is answered to that client (django.request
# logs it as a WARNING): on the console it would be noise, e.g. a browser's /favicon.ico.
_CONSOLE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback|: converging |Error:|\bevent [a-z_]+(\.[a-z_]+)* \[")
_QUIET = re.compile(r"\bWARNING django\.request\b")


def _pump(proc: subprocess.Popen, path: Path, name: str, console: Any) -> None:
    """Copy a child's output to its log file, echoing the lines that matter (and a traceback's body)."""
    with path.open("ab") as log:
        in_traceback = False
        for raw in iter(proc.stdout.readline, b""):
            log.write(raw)
            log.flush()
            line = raw.decode(errors="replace").rstrip()
            starts_record = line.startswith("[") or line[:4].isdigit()
            if _QUIET.search(line):
                in_traceback = False
                continue
            if _CONSOLE.search(line) or (in_traceback and not starts_record):
                console.write(f"{name}: {line}")
                in_traceback = in_traceback or "Traceback" in line or "ERROR" in line
            if starts_record and not _CONSOLE.search(line):
                in_traceback = False


def _demo_hook(name: str) -> Callable[[], Any] | None:
    """The demo processes' start/stop function of whichever app provides one (fleets: the demo fleet)."""
    for module in app_modules("demo"):
        hook = getattr(module, name, None)
        if hook is not None:
            return hook
    return None


def _wait_for_line(path: Path, text: str, *, after: int, timeout_s: float) -> bool:
    """Until `text` is in what `path` got past byte `after`; False when the time is up (the run goes on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            with path.open("rb") as f:
                f.seek(after)
                if text.encode() in f.read():
                    return True
        time.sleep(0.2)
    return False
