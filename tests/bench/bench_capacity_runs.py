"""Capacity runs through Celery: what sharding over workers costs and keeps.

Starts two real Celery workers (concurrency 1 each) and a fast loopback HTTP server, then, through
the same services the API calls:
  - runs the same open-loop plan with 1 shard and with 2 shards, and compares achieved rate, rate
    error against the plan, p50/p99, and the shards' start skew (how side by side they ran);
  - counts live progress writes per second on the run row while a run is going;
  - cancels a long run and times how long until every shard has stopped;
  - times request -> first load and last load -> results (the Celery overhead).

Zero setup by default: a temporary SQLite database and kombu's SQLite broker (what `make run`
uses). Set BENCH_DATABASE_URL / BENCH_REDIS_URL to use PostgreSQL / Redis instead (the database
must exist and be disposable: it is migrated and written to). Loopback only; every process is
stopped by PID.

    python tests/bench/bench_capacity_runs.py [--rate 1000] [--seconds 3]

Last line: ``RESULT rate_error_pct_1shard=... rate_error_pct_2shards=... cancel_ms=... ...``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def configure(var_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPILLWAY_VAR_DIR"] = str(var_dir)
    env["DEBUG"] = "1"
    env["LOG_LEVEL"] = "WARNING"
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    if os.environ.get("BENCH_DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["BENCH_DATABASE_URL"]
    if os.environ.get("BENCH_REDIS_URL"):
        env["REDIS_URL"] = os.environ["BENCH_REDIS_URL"]
    os.environ.clear()
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    return env


def start_workers(env: dict[str, str], var_dir: Path, count: int) -> list[subprocess.Popen]:
    procs = []
    for i in range(count):
        log = open(var_dir / f"worker-{i}.log", "wb")  # noqa: SIM115 (closed by the OS at exit)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "prefork", "--concurrency",
             "1", "--hostname", f"bench{i}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        # Staggered: two processes creating the embedded broker's tables at once can race.
        deadline = time.monotonic() + 60
        while b"ready." not in (var_dir / f"worker-{i}.log").read_bytes():
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((var_dir / f"worker-{i}.log").read_text())
            time.sleep(0.1)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1000.0, help="total planned req/s")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    var_dir = Path(tempfile.mkdtemp(prefix="spw-bench-cap-"))
    env = configure(var_dir)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from apps.accounts.models import Organization
    from apps.accounts.principal import Principal
    from apps.balancers.models import IpPool, Listener, LoadBalancer, StaticIP
    from apps.capacity import services
    from apps.capacity.models import CapacityShard, CapacityTest, TargetAllowlist
    from tests.capacity.servers import ServerProcess

    org, _ = Organization.objects.get_or_create(slug="bench", defaults={"name": "Bench", "max_test_rate": 100_000,
                                                                        "max_test_concurrency": 2000})
    principal = Principal(org=org, role="owner", user_id=None)
    lb, _ = LoadBalancer.objects.get_or_create(name="bench-lb", defaults={"org": org})
    ip_pool, _ = IpPool.objects.get_or_create(name="bench-loop", defaults={"cidr": "127.0.0.0/24"})
    vip, _ = StaticIP.objects.get_or_create(address="127.0.0.1", defaults={"pool": ip_pool, "state": "assigned"})
    TargetAllowlist.objects.get_or_create(cidr="127.0.0.0/8", org=None)

    procs = start_workers(env, var_dir, 2)
    server = ServerProcess("ok").start()
    try:
        listener = Listener.objects.create(lb=lb, name="http", port=server.port, static_ip=vip)

        def run(name: str, shards: int, steps: list[list[float]], cancel_after_s: float | None = None) -> dict:
            test = services.capacity_test_save(principal=principal, test=CapacityTest(), data={
                "org": org, "name": name, "listener_id": listener.pk, "steps": steps, "shards": shards,
                "slo_p99_ms": 100, "max_connections": 200})
            t0 = time.monotonic()
            run = services.capacity_run_start(principal=principal, test=test)
            first_load_s = None
            progress_marks: set = set()
            cancel_t = None
            stopped_s = None
            while True:
                run.refresh_from_db()
                now = time.monotonic()
                if run.status == "running" and run.progress_at is not None:
                    progress_marks.add(run.progress_at)
                    if first_load_s is None and run.sent > 0:
                        first_load_s = now - t0
                if cancel_after_s is not None and cancel_t is None and first_load_s is not None \
                        and now - t0 - first_load_s >= cancel_after_s:
                    services.capacity_run_cancel(principal=principal, run=run)
                    cancel_t = time.monotonic()
                if cancel_t is not None and stopped_s is None and \
                        CapacityShard.objects.filter(run=run, finished_at__isnull=True).count() == 0:
                    stopped_s = time.monotonic() - cancel_t
                if not run.is_active and run.shards_done >= run.shards_total:
                    break
                if now - t0 > 120:
                    raise RuntimeError(f"run {name} did not finish: {run.status} {run.error}")
                time.sleep(0.02)
            total_s = time.monotonic() - t0
            shards_rows = list(CapacityShard.objects.filter(run=run))
            steps_rows = list(run.step_results.filter(shard__isnull=True).order_by("index"))
            window_s = (run.finished_at - run.started_at).total_seconds() if run.finished_at else 0.0
            return {"run": run, "steps": steps_rows, "shards": shards_rows, "first_load_s": first_load_s,
                    "total_s": total_s, "progress_writes": len(progress_marks), "stopped_s": stopped_s,
                    "window_s": window_s}

        # Warm-up: first task in each worker pays imports and connections.
        run("warmup", 2, [[50, 0.5]])
        results = {}
        for shards in (1, 2):
            r = run(f"rate-{shards}", shards, [[args.rate, args.seconds]])
            step = r["steps"][0]
            planned = args.rate * args.seconds
            results[shards] = r
            skew = max((s.start_skew_s or 0.0) for s in r["shards"])
            print(f"{shards} shard(s): planned {args.rate:.0f} req/s x {args.seconds:g} s = {planned:.0f} requests; "
                  f"ok {step.ok}, errors {step.error_count}, achieved {step.achieved_rate:.1f} req/s "
                  f"({(step.achieved_rate - args.rate) / args.rate * 100:+.2f}%), p50 {step.p50_ms} ms, "
                  f"p99 {step.p99_ms} ms, max start skew {skew * 1000:.0f} ms, workers "
                  f"{sorted({s.worker for s in r['shards']})}")
            print(f"    request -> first load {r['first_load_s']:.2f} s (includes the 1 s start lead), "
                  f"request -> results {r['total_s']:.2f} s; progress writes on the run row: "
                  f"{r['progress_writes']} in {args.seconds:g} s of load")
        long = run("cancel", 2, [[200, 30]], cancel_after_s=1.0)
        print(f"cancel: all shards stopped {long['stopped_s'] * 1000:.0f} ms after the cancel was written; "
              f"{long['run'].sent} of 6000 planned requests sent; status {long['run'].status}")
        rate_err = {k: abs(v["steps"][0].achieved_rate - args.rate) / args.rate * 100 for k, v in results.items()}
        skew_ms = max((s.start_skew_s or 0.0) for s in results[2]["shards"]) * 1000
        writes_per_s = results[2]["progress_writes"] / args.seconds
        print(f"RESULT rate_error_pct_1shard={rate_err[1]:.2f} rate_error_pct_2shards={rate_err[2]:.2f} "
              f"p99_ms_1shard={results[1]['steps'][0].p99_ms} p99_ms_2shards={results[2]['steps'][0].p99_ms} "
              f"shard_skew_ms={skew_ms:.0f} progress_writes_per_s={writes_per_s:.1f} "
              f"cancel_ms={long['stopped_s'] * 1000:.0f} overhead_s={results[2]['total_s'] - args.seconds:.2f}")
    finally:
        server.stop()
        stop(procs)


if __name__ == "__main__":
    main()
