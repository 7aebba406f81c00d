"""The control path at 100k routes: 2 fleets x 3 local HAProxy nodes (loopback), real gunicorn + Celery.

1. 100k routes (5k hostnames x 20 paths, one LB served by both fleets) are written to the database; in this
   process, one fleet's snapshot + render + `haproxy -c -dW` (render_validate), while the workers are idle;
   then the routes are rolled out.
2. A reload of one node at that size, timed through the master socket (`show proc`), and every
   node's worker memory (VmRSS).
3. `--changes` route creations through the REST API, each waited for with the `applied` long-poll
   (POST -> every node serves it): change_p50/p99.
4. Sustained: `--rate` route creations per minute for `--sustained-s` seconds while `wrk` loads one
   node (wrk and the backends at nice 19: they stand for other machines); each change's latency is
   POST -> every node's applied revision covers it (read from the database every 20 ms, the same rule
   as the `applied` endpoint). Socket errors / non-2xx from wrk.

    python tests/bench/bench_scale.py [--routes 100000] [--changes 20] [--rate 1000] [--sustained-s 180]

Last line: RESULT render_validate_ms_100k=... change_p50_ms_100k=... change_p99_ms_100k=...
sustained_changes_per_min=... sustained_p99_ms=... errors=... (sustained_changes_per_min is what went live a minute,
from the first change due to the last one live, not what was offered: `--rate` offers)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")

from _fleetbench import FleetBench
from bench_propagation import percentile, stage_report

HOST_ROUTES = 20  # paths per hostname
TENANT_ROUTES = 5_000  # routes per tenant (a multiple of HOST_ROUTES: a hostname has one owner)


def seed_routes(fb: FleetBench, count: int) -> None:
    """`count` routes of `count // TENANT_ROUTES` tenants on the LB (written past the API: the bench is about
    delivery, and priorities are per tenant, at most 50,000 each)."""
    from django.db.models import F

    from apps.accounts.models import Organization
    from apps.balancers.models import LoadBalancer, Route, RouteTarget

    lb, pool = fb.lb, fb.pools["old"]
    tenants = [Organization.objects.create(slug=f"t{k}", name=f"T{k}", kind="customer")
               for k in range((count + TENANT_ROUTES - 1) // TENANT_ROUTES)]
    batch = 10_000
    for start in range(0, count, batch):
        routes = Route.objects.bulk_create([
            Route(lb=lb, org=tenants[i // TENANT_ROUTES], hosts=[f"h{i // HOST_ROUTES}.scale.test"],
                  path=f"/p{i % HOST_ROUTES}", path_match="prefix", priority=1 + i % TENANT_ROUTES)
            for i in range(start, min(count, start + batch))])
        RouteTarget.objects.bulk_create([RouteTarget(route=r, pool=pool, weight=100) for r in routes])
    LoadBalancer.objects.filter(pk=lb.pk).update(revision=F("revision") + 1)


def rollout_all(fb: FleetBench, timeout_s: int) -> float:
    started = time.monotonic()
    from apps.fleets.services import fleet_mark_changed

    for fleet in fb.fleets:
        # The routes were bulk-written past the services, so nothing recorded the change: record it, and
        # the reconcile runs on the worker (`POST .../reconcile/` renders 100k routes inside the request
        # and ran past the HTTP client's timeout; a bare reconcile task renders nothing unrecorded).
        fleet_mark_changed(fleet=fleet)
    fb.wait_applied(timeout_s)
    return time.monotonic() - started


def render_validate(fb: FleetBench) -> tuple[float, float]:
    from django.conf import settings

    from apps.fleets import selectors
    from apps.fleets.config.check import validate_bundle
    from apps.fleets.config.render import render

    fleet = fb.fleets[0]
    started = time.monotonic()
    snap, _ = selectors.fleet_snapshot(fleet, 999_999)
    snapshot_s = time.monotonic() - started
    started = time.monotonic()
    bundle = render(snap, selectors.reference_node(fleet))
    result = validate_bundle(bundle, settings.HAPROXY_BIN)
    assert result.ok, result.output
    return snapshot_s * 1000.0, (time.monotonic() - started) * 1000.0


def reload_and_memory(fb: FleetBench) -> tuple[float, list[int]]:
    from apps.fleets.models import Node
    from apps.fleets.node.runtime_api import MasterSocket

    nodes = list(Node.objects.filter(fleet__in=fb.fleets).order_by("fleet_id", "name"))
    rss = []
    for node in nodes:
        pid = MasterSocket(f"{node.runtime_dir}/master.sock").show_proc().current_worker.pid
        status = Path(f"/proc/{pid}/status").read_text()
        rss.append(int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) // 1024)
    master = MasterSocket(f"{nodes[0].runtime_dir}/master.sock", timeout_s=30)
    started = time.monotonic()
    result = master.reload_and_verify(timeout_s=30)
    assert result.ok, result
    return (time.monotonic() - started) * 1000.0, rss


def lb_revision(fb: FleetBench) -> int:
    from apps.balancers.models import LoadBalancer

    return LoadBalancer.objects.values_list("revision", flat=True).get(pk=fb.lb.pk)


POST_MS: list[float] = []  # the API's share of each change: POST until its 201
SENT_WAIT_MS: list[float] = []  # sustained run: due until a sender took it
SENT_POST_MS: list[float] = []  # sustained run: POST until its 201
SLOWEST: list[tuple[float, float]] = []  # sustained run: (latency ms, due at s after the start)


def one_change(fb: FleetBench, i: int, marks: list[tuple[float, float]]) -> float:
    started = time.monotonic()
    marks.append((time.time(), started))
    fb.add_route(f"/c{i}", 1 + i, redirect_url=f"https://c.test/{i}")
    POST_MS.append((time.monotonic() - started) * 1000.0)
    revision = lb_revision(fb)
    status, body = fb.api("GET", f"/api/v1/load-balancers/{fb.lb.pk}/applied/?revision={revision}&timeout=60",
                          timeout_s=75)  # the long-poll answers before the client gives up
    if status != 200:
        raise RuntimeError(f"change {i} not applied: {status} {body}")
    return (time.monotonic() - started) * 1000.0


def sustained(fb: FleetBench, rate_per_min: int, duration_s: float,
              senders_n: int = 4) -> tuple[int, list[float], int, str]:
    """Open loop: a change is due every 60/rate s and is sent then by one of a few concurrent senders (as
    several pipelines would), so a slow answer does not lower the rate; each latency runs from the moment
    the change was due (a change waiting for a free sender counts that wait too)."""
    from concurrent.futures import ThreadPoolExecutor

    from apps.fleets import selectors

    interval = 60.0 / rate_per_min
    pending: list[tuple[int, float]] = []  # (lb revision, due at)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = 0
    stop = threading.Event()
    started_at = time.monotonic()

    def watch() -> None:
        while not stop.is_set() or pending:
            with lock:
                waiting = list(pending)
            if waiting:
                newest = max(r for r, _ in waiting)
                done, nodes = selectors.lb_applied_state(fb.lb, newest)
                covered = min(n["lb_revision"] for n in nodes) if nodes else 0
                now = time.monotonic()
                with lock:
                    for item in [p for p in pending if done or p[0] <= covered]:
                        latencies.append((now - item[1]) * 1000.0)
                        SLOWEST.append(((now - item[1]) * 1000.0, item[1] - started_at))
                        pending.remove(item)
            if stop.is_set() and time.monotonic() > deadline + 60:
                break
            time.sleep(0.02)

    def send(n: int, due: float) -> None:
        nonlocal errors
        try:
            started = time.monotonic()
            fb.add_route(f"/s{n}", 1_000 + n, redirect_url=f"https://s.test/{n}")
            revision = lb_revision(fb)
            with lock:
                pending.append((revision, due))
                SENT_WAIT_MS.append((started - due) * 1000.0)
                SENT_POST_MS.append((time.monotonic() - started) * 1000.0)
        except (RuntimeError, OSError):  # refused, or no answer within the client's timeout
            with lock:
                errors += 1

    node = fb.node_addresses[0]
    # The load generator and the backends stand for other machines (clients, servers): at the lowest CPU
    # priority they take what the control plane and the nodes leave of this box's 2 cores, instead of
    # half of them whatever the control plane needs (closed-loop wrk runs as fast as it is let).
    for proc in fb.procs:
        if "backends" in proc.args:
            os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
    wrk = subprocess.Popen(["nice", "-n", "19", "wrk", "-t1", "-c8", f"-d{int(duration_s) + 5}s",
                            f"http://{node}:{fb.port}/"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + duration_s
    cpu_before = cpu_by_process()
    busy_before = machine_cpu_s()
    watcher = threading.Thread(target=watch, daemon=True)  # a failed run must not hang on it
    watcher.start()
    sent = 0
    due = time.monotonic()
    senders = ThreadPoolExecutor(max_workers=senders_n)
    try:
        while due < deadline:
            time.sleep(max(0.0, due - time.monotonic()))
            senders.submit(send, sent, due)
            sent += 1
            due += interval
        # Read at the deadline, before waiting for the senders' backlog: what was used over `duration_s` seconds
        # (read after the backlog it counted a minute or more of sending as 30 s, and reported 1.3-1.9 cores for
        # processes that used 0.4-0.5). wrk is still running: its share is counted too.
        cpu_after = cpu_by_process()
        busy = machine_cpu_s() - busy_before
    except BaseException:
        senders.shutdown(wait=False, cancel_futures=True)  # a failed run does not send its backlog first
        raise
    senders.shutdown(wait=True)
    print(f"CPU while changes were sent ({duration_s:.0f} s), cores: " + ", ".join(
        f"{kind} {(cpu_after[kind] - cpu_before.get(kind, 0.0)) / duration_s:.2f}"
        for kind in sorted(cpu_after, key=lambda k: cpu_before.get(k, 0.0) - cpu_after[k]))
        + f"; the whole machine {busy / duration_s:.2f} of {os.cpu_count()}")
    stop.set()
    watcher.join()
    out = wrk.communicate()[0]
    return sent, latencies, errors + len(pending), out


def pipeline_report(since: float) -> None:
    """What the worker did since `since`: revisions by kind, rollouts, node results (hot, reloaded, failed)."""
    import datetime as dt

    from django.db.models import Avg, Count, Q

    from apps.fleets.models import ConfigRevision, NodeResult, Rollout

    at = dt.datetime.fromtimestamp(since, dt.UTC)
    revisions = ConfigRevision.objects.filter(created_at__gte=at).aggregate(
        lane=Count("pk", filter=Q(base__isnull=False)), full=Count("pk", filter=Q(base__isnull=True)))
    rollouts = (Rollout.objects.filter(created_at__gte=at).values("status")
                .annotate(n=Count("pk"), ms=Avg("duration_ms")))
    results = NodeResult.objects.filter(rollout__created_at__gte=at).aggregate(
        n=Count("pk"), reloaded=Count("pk", filter=Q(reload_ms__isnull=False)),
        failed=Count("pk", filter=Q(status="failed")), push_ms=Avg("push_ms"), ms=Avg("duration_ms"))
    print(f"pipeline: revisions {revisions}; rollouts "
          + ", ".join(f"{r['status']} {r['n']} (avg {r['ms'] or 0:.0f} ms)" for r in rollouts)
          + f"; node results {results}")


def stalls_report(since: float) -> None:
    """Where the slowest sustained changes waited: their due times, each fleet's longest rollouts and the
    longest gaps between one rollout's end and the next one's start (a reconcile busy elsewhere)."""
    import datetime as dt

    from apps.fleets.models import Rollout

    worst = sorted(SLOWEST, reverse=True)[:8]
    print("slowest sustained changes (ms @ due s): " + ", ".join(f"{ms:.0f} @ {at:.1f}" for ms, at in worst))
    at = dt.datetime.fromtimestamp(since, dt.UTC)
    rows = list(Rollout.objects.filter(created_at__gte=at, started_at__isnull=False, finished_at__isnull=False)
                .order_by("fleet_id", "started_at").values_list("fleet_id", "started_at", "finished_at",
                                                                  "revision__created_at"))
    for fleet_id in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == fleet_id]
        runs = sorted(mine, key=lambda r: r[2] - r[1], reverse=True)[:4]
        gaps = sorted(((b[1] - a[2]).total_seconds() * 1000.0, (a[2] - at).total_seconds())
                      for a, b in pairwise(mine))[::-1][:4]
        waits = sorted(((r[1] - r[3]).total_seconds() * 1000.0, (r[3] - at).total_seconds()) for r in mine)[::-1][:4]
        print(f"fleet {fleet_id}: longest rollouts (ms @ s) "
              + ", ".join(f"{(r[2] - r[1]).total_seconds() * 1000:.0f} @ {(r[1] - at).total_seconds():.1f}"
                          for r in runs)
              + "; longest idle gaps " + ", ".join(f"{ms:.0f} @ {s:.1f}" for ms, s in gaps)
              + "; revision stored -> rollout started " + ", ".join(f"{ms:.0f} @ {s:.1f}" for ms, s in waits))


PROCESS_KINDS = (("gunicorn", "web (gunicorn)"), ("celery", "worker (celery)"), ("haproxy", "nodes (haproxy)"),
                 ("postgres", "postgres"), ("redis", "redis"), ("wrk", "wrk"), ("bench_scale", "bench client"))


def cpu_by_process(kinds: tuple[tuple[str, str], ...] = PROCESS_KINDS) -> dict[str, float]:
    """CPU seconds used so far by each kind of process on this machine (live processes only): the first kind whose
    key is in the command line, else "other"."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = next((name for key, name in kinds if key in cmdline), "other")
        used[kind] = used.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return used


def machine_cpu_s() -> float:
    """CPU seconds every process on this machine has used so far (/proc/stat: user, nice, system, irq, softirq)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:8]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def wrk_errors(out: str) -> int:
    total = 0
    match = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if match:
        total += sum(int(g) for g in match.groups())
    match = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if match:
        total += int(match.group(1))
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--routes", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--sustained-s", type=float, default=180.0, help="0: the single changes only")
    parser.add_argument("--senders", type=int, default=4, help="sustained: changes in flight at most")
    parser.add_argument("--no-beat", action="store_true",
                        help="without Celery beat (no periodic converge/drift checks and health collection)")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    # With beat, as `make run` serves: converge (drift checks, live maps included) every 10 s and health
    # collection every 5 s run beside the changes, on the same fleets.
    fb = FleetBench("spillway_bench_i14", nodes_per_region=3, worker_concurrency=2, beat=not args.no_beat)
    try:
        fb.initial_rollout()
        seed_routes(fb, args.routes)
        # Before the rollout: after it, the shard workers set up their route lanes and the periodic drift check
        # reads every node's 200k-line maps for the first time, and this figure measured that contention too
        # (1.2-2.0 s over six runs, for ~1.0 s of its own on an idle machine).
        snapshot_ms, render_validate_ms = render_validate(fb)
        print(f"snapshot from the database {snapshot_ms:.0f} ms; render + haproxy -c {render_validate_ms:.0f} ms "
              f"(load {os.getloadavg()[0]:.1f})")
        first_s = rollout_all(fb, 900)
        print(f"{args.routes} routes rolled out to 6 nodes (first apply, reloads) in {first_s:.1f} s")
        reload_ms, rss = reload_and_memory(fb)
        print(f"reload of one node (show proc: new worker) {reload_ms:.0f} ms; worker RSS per node MB: {rss}")
        # Each worker process takes the route lane for a fleet once it has rendered that fleet in full
        # (apps.fleets.config.routelane); the first changes after start-up pay that render. Shown, not counted.
        warm = [one_change(fb, 10_000 + i, []) for i in range(args.warmup)]
        print(f"warm-up ({args.warmup} changes, the worker processes' first full renders), ms: "
              + " ".join(f"{w:.0f}" for w in warm))
        marks: list[tuple[float, float]] = []
        changes = [one_change(fb, i, marks) for i in range(args.changes)]
        stage_report(marks, changes)
        pipeline_report(marks[0][0])
        print(f"POST (201) ms: p50 {percentile(POST_MS[-args.changes:], 50):.0f} "
              f"p99 {percentile(POST_MS[-args.changes:], 99):.0f}")
        print(f"{args.changes} changes, POST -> applied on 6 nodes, ms: "
              f"p50 {percentile(changes, 50):.0f} p99 {percentile(changes, 99):.0f} max {max(changes):.0f}")
        if args.sustained_s <= 0:  # the single changes only (their stages above)
            print(f"RESULT render_validate_ms_100k={render_validate_ms:.0f} change_p50_ms_100k="
                  f"{percentile(changes, 50):.0f} change_p99_ms_100k={percentile(changes, 99):.0f}")
            return
        since = time.time()
        sent, latencies, change_errors, wrk_out = sustained(fb, args.rate, args.sustained_s, args.senders)
        pipeline_report(since)
        stalls_report(since)
        if SENT_POST_MS:
            print(f"sustained senders, ms: wait for a sender p50 {percentile(SENT_WAIT_MS, 50):.0f} "
                  f"p99 {percentile(SENT_WAIT_MS, 99):.0f}; POST p50 {percentile(SENT_POST_MS, 50):.0f} "
                  f"p99 {percentile(SENT_POST_MS, 99):.0f}")
        # What went live per minute from the first due change to the last one live: counted over the nominal
        # duration it read 5,998/min for a run whose senders needed 77 s to get 30 s of changes through.
        span_s = max([args.sustained_s, *(at + ms / 1000.0 for ms, at in SLOWEST)])  # due + latency: seen live
        per_min = len(latencies) / (span_s / 60.0)
        print(f"sustained: offered {args.rate:,}/min for {args.sustained_s:.0f} s; went live at {per_min:,.0f}/min "
              f"(the last one {span_s:.0f} s after the first was due)")
        errors = change_errors + wrk_errors(wrk_out)
        print(f"sustained: {sent} changes sent, {len(latencies)} live within the run", end="")
        if latencies:
            print(", due -> live on every node, ms: " + ", ".join(
                f"p{q} {percentile(latencies, q):.0f}" for q in (50, 90, 99)) + f", max {max(latencies):.0f}", end="")
        print(f"; wrk:\n{wrk_out}")
        print(f"load after: {os.getloadavg()}")
        print(f"RESULT render_validate_ms_100k={render_validate_ms:.0f} "
              f"change_p50_ms_100k={percentile(changes, 50):.0f} change_p99_ms_100k={percentile(changes, 99):.0f} "
              f"sustained_changes_per_min={per_min:.0f} "
              f"sustained_p99_ms={percentile(latencies, 99) if latencies else float('nan'):.0f} errors={errors}")
    finally:
        fb.close()


if __name__ == "__main__":
    main()
