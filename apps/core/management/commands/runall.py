"""Run web, Celery worker and beat together (what `make run` starts), until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.discovery import app_modules


class Command(BaseCommand):
    help = "Start web (gunicorn), a Celery worker and beat; stop them all on Ctrl-C."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8000")

    def handle(self, *args, **opts) -> None:
        py = sys.executable
        procs: list[tuple[str, subprocess.Popen]] = []

        def spawn(name: str, cmd: list[str]) -> None:
            self.stdout.write(f"starting {name}: {' '.join(cmd)}")
            procs.append((name, subprocess.Popen(cmd, env=os.environ.copy())))

        # One worker first, then beat: two processes creating the embedded broker's
        # tables in the same instant can race (measured), so stagger them.
        spawn("worker", [py, "-m", "celery", "-A", "controlplane", "worker", "--loglevel", "INFO",
                         "--concurrency", "2"])
        time.sleep(3)
        spawn("beat", [py, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO"])
        start_demo = _demo_hook("start_demo_processes")
        if start_demo is not None:
            message = start_demo()
            if message:
                self.stdout.write(message)
        spawn("web", [py, "-m", "gunicorn", "controlplane.wsgi:application", "--bind", opts["bind"],
                      "--workers", "2", "--threads", "4", "--timeout", "120"])
        self.stdout.write(self.style.SUCCESS(f"Spillway on http://{opts['bind']}/  (API docs: /api/v1/docs/)"))
        self.stdout.write(f"database: {settings.DATABASES['default']['ENGINE']}, broker: {settings.CELERY_BROKER_URL}")

        stopping = False

        def stop(*_: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, proc in procs:
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping the rest")
                        stopping = True
                time.sleep(0.5)
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


def _demo_hook(name: str) -> Callable[[], str | None] | None:
    """The demo processes' start/stop function of whichever app provides one (fleets: the demo fleet)."""
    for module in app_modules("demo"):
        hook = getattr(module, name, None)
        if hook is not None:
            return hook
    return None
