"""Event delivery latency: from the change being recorded as applied to the webhook arriving.

Real parts: PostgreSQL, Redis, a real Celery worker started the way `runall` starts the event worker
(`-Q events --pool threads`), a loopback HTTP receiver in this process. The benchmark emits `change.applied`
events for a tenant's load balancer at a steady rate (default 50/s, from --emitters threads on one schedule)
the way the fleet engine does when the last node verified a revision (`event_emit` inside a transaction;
delivery enqueued on commit), and the receiver timestamps each signed webhook.
Latency = receive time - time just before `event_emit` (one clock: same process). The rate actually offered
(events / time from the first to the last emit) is printed and is in the RESULT line (`rate=`).

    python tests/bench/bench_events.py [--rate 50] [--seconds 20] [--concurrency 8] [--pool threads] [--emitters 4]

Needs DATABASE_URL (PostgreSQL; default postgres://postgres@127.0.0.1:5432/spw_bench_events, created
and migrated if missing) and REDIS_URL (default redis://127.0.0.1:6379/11).
Last line: ``RESULT event_p99_ms=... event_p50_ms=... rate=... delivered=... sent=... duplicates=...``.
Goal: p99 <= 1000 ms at 50 events/s, every event delivered once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._db import ensure_database  # noqa: E402

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spw_bench_events")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ["CELERY_TASK_ALWAYS_EAGER"] = "0"
os.environ.setdefault("SPILLWAY_TESTING", "1")  # dev-only secrets are fine for a benchmark database
os.environ["SCHEDULING_TENANT_URL_ALLOW_CIDRS"] = "127.0.0.0/8"  # the receiver is on loopback
ORG_SLUG = "bench-events"
SECRET = "bench-events-signing-key"


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100.0 * (len(ordered) - 1))))]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def receiver() -> tuple[ThreadingHTTPServer, dict[int, list[float]]]:
    arrivals: dict[int, list[float]] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            now = time.monotonic()
            with lock:
                arrivals.setdefault(json.loads(raw)["id"], []).append(now)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, arrivals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=50.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8, help="worker threads (runall starts 8)")
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork"],
                        help="the event worker's pool (runall: threads)")
    parser.add_argument("--emitters", type=int, default=4, help="threads emitting events, one schedule")
    args = parser.parse_args()

    ensure_database(os.environ["DATABASE_URL"], "the suite's real parts")
    import django

    django.setup()
    # event_emit logs one line per event (make run's console shows them); 1,000 of them would bury the figures.
    logging.getLogger("apps.events.services").setLevel(logging.WARNING)
    from django.core.management import call_command
    from django.db import connection, connections, transaction

    from apps.accounts.models import Organization
    from apps.balancers.models import LoadBalancer
    from apps.core import crypto
    from apps.events.models import Event, Subscription
    from apps.events.services import event_emit
    from controlplane.celery import app as celery_app

    call_command("migrate", verbosity=0)
    org, _ = Organization.objects.get_or_create(slug=ORG_SLUG, defaults={"name": "Bench events"})
    Event.objects.filter(org=org).delete()
    Subscription.objects.filter(org=org).delete()
    lb, _ = LoadBalancer.objects.get_or_create(org=org, name="bench-lb")
    server, arrivals = receiver()
    Subscription.objects.create(org=org, name="bench", url=f"http://127.0.0.1:{server.server_address[1]}/",
                                types=["change.applied"], secret_encrypted=crypto.encrypt(SECRET))
    celery_app.control.purge()
    connection.close()

    logs = Path(tempfile.mkdtemp(prefix="bench-events-"))
    log_path = logs / "worker.log"
    log = open(log_path, "wb")  # noqa: SIM115 (closed when the process ends)
    cmd = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--queues", "events", "--pool", args.pool,
           "--concurrency", str(args.concurrency), "--hostname", "benchevents@%h", "--without-gossip",
           "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]
    worker = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"ready." not in log_path.read_bytes() and time.monotonic() < deadline:
            if worker.poll() is not None:
                raise SystemExit(log_path.read_text())
            time.sleep(0.2)
        emitted: dict[int, float] = {}
        total = int(args.rate * args.seconds)
        start = time.monotonic() + 0.2
        last_emit = [start]
        max_behind_s = [0.0]

        def emit(first: int) -> None:
            # Slots first, first + emitters, ...: together the threads follow one schedule at --rate.
            try:
                for n in range(first, total, args.emitters):
                    due = start + n / args.rate
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    before = time.monotonic()
                    max_behind_s[0] = max(max_behind_s[0], before - due)
                    with transaction.atomic():
                        event = event_emit("change.applied", org=org, obj=lb,
                                           data={"revision": n + 1, "fleet": "bench"})
                    emitted[event.pk] = before
                    last_emit[0] = max(last_emit[0], time.monotonic())
            finally:
                connections.close_all()

        threads = [threading.Thread(target=emit, args=(i,)) for i in range(args.emitters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sent_s = max(last_emit[0] - start, 1e-9)
        wait_until = time.monotonic() + 30
        while len(arrivals) < total and time.monotonic() < wait_until:
            time.sleep(0.2)
        worker_cpu_s = _cpu_s(worker.pid)
        own_cpu_s = sum(os.times()[:2])
    finally:
        worker.terminate()
        worker.wait(30)
        server.shutdown()
    latencies = [(arrivals[pk][0] - t) * 1000.0 for pk, t in emitted.items() if pk in arrivals]
    duplicates = sum(len(v) - 1 for v in arrivals.values())
    rate = total / sent_s
    print(f"sent {total} change.applied events in {sent_s:.1f} s: {rate:.1f}/s offered (goal {args.rate:g}/s, "
          f"{args.emitters} emitter threads, at most {max_behind_s[0] * 1000:.0f} ms behind schedule); "
          f"event worker: {args.pool} pool, concurrency {args.concurrency}; delivered {len(latencies)}; "
          f"load {os.getloadavg()}")
    print(f"CPU per event: event worker {worker_cpu_s / total * 1000:.1f} ms, this process (emit + receive) "
          f"{own_cpu_s / total * 1000:.1f} ms (incl. start-up)")
    if latencies:
        print(f"latency ms: p50 {percentile(latencies, 50):.0f}  p90 {percentile(latencies, 90):.0f}  "
              f"p99 {percentile(latencies, 99):.0f}  max {max(latencies):.0f}")
    p99 = percentile(latencies, 99) if latencies else float("nan")
    p50 = percentile(latencies, 50) if latencies else float("nan")
    print(f"RESULT event_p99_ms={p99:.0f} event_p50_ms={p50:.0f} rate={rate:.1f} delivered={len(latencies)} "
          f"sent={total} duplicates={duplicates}")


if __name__ == "__main__":
    main()
