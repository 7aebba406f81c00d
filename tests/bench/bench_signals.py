"""Golden signals at 1,000 routes: 2 regions x 3 local HAProxy nodes (loopback) send their request log to the
real collector (`manage.py runsignals`, its own process); real gunicorn (the API) and Celery (the rollouts).

1. One LB served by both fleets, routes `/r0000`, `/r0001`, ... (prefix, any host, half to pool `old`, half to
   `new`) and `/lag`, written past the API (the bench is about signals, not route writes) and rolled out. The
   charted series get a history (7 days of 5 min buckets, the last hour of 5 s buckets), so the 1h/24h/7d charts
   read full windows.
2. Small size: `--small` routes, `--rps` requests/s for `--small-s` seconds from a load generator in its own
   process, spread over every route and all 6 nodes (keep-alive; every request's path is new below its route,
   `/r0123/i<n>`, so the collector's route cache never hides the route lookup). The load generator and the
   backends stand for other machines and run at nice 19 (as in bench_scale); a shortfall in the rate fails the run.
3. Full size: the other routes are added and rolled out. A request to a new route is probed until the collector
   counts it under that route (`new_route_counted_s`); when it does not within `--new-route-wait-s`, the
   collector is restarted (its directory is then loaded with the new routes) and the run goes on. Then
   `--rps` for `--seconds` over all routes, while
   - bursts of requests to `/lag` are sent every few seconds and the route's chart is polled through the API
     until it counts them: signal_lag_p99_s (from the burst's first request to the chart showing it);
   - GET /api/v1/signals/ for scope lb, route, pool x range 5m, 1h, 24h, 7d is timed: chart_p95_ms (and the
     same requests again once the load has stopped: chart_p95_ms_idle, for comparison).
After each run, once the collector's writes have settled: the 5 s buckets since the run started against the
nodes' own counters (`show stat` over the runtime socket: each frontend's req_tot, each server's hrsp_*) per
node and per member on each node, and each route's buckets against what the load generator got answered:
rate_error_max is the largest relative error. series = distinct (kind, id, node) written during the run;
collector_cpu_cores = the collector's utime+stime (/proc) from the start of the load until its writes settled,
over the load's seconds.

    python tests/bench/bench_signals.py [--routes 1000] [--small 250] [--rps 1500] [--seconds 60] [--small-s 30]

Goals: signal_lag_p99_s <= 10, rate_error_max <= 0.02, chart_p95_ms <= 300, and series and collector CPU
growing at most linearly with routes (full/small ratios <= routes ratio).
Last line: RESULT signal_lag_p99_s=... series=... collector_cpu_cores=... chart_p95_ms=... rate_error_max=...
(then routes, rps, the small size's series and CPU, chart_p95_ms_7d, chart_p95_ms_idle, new_route_counted_s).
Exits 1 when a goal is missed. About 3-4 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")

from tests.bench import _fleetbench
from tests.netutil import free_udp_port

DB_NAME = os.environ.get("BENCH_DB_NAME", "spillway_bench_signals")
STEP_S = 5  # services.FINE_STEP_S (asserted in main)
LAG_BURST = 5  # requests per /lag burst
CONNS_PER_NODE = 4
RANGES = ("5m", "1h", "24h", "7d")
GOALS = {"signal_lag_p99_s": 10.0, "rate_error_max": 0.02, "chart_p95_ms": 300.0}


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (q in 0..100): p99 of 20 samples is the largest."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q / 100) - 1))] if ordered else math.nan


# --- load generator (its own process: `bench_signals.py loadgen <json>`) ----------------------------------------
async def _loadgen(cfg: dict) -> dict:
    """Paced keep-alive GETs over all nodes and routes; counts what was answered, per route and per node."""
    nodes, port, routes, rps, seconds = cfg["nodes"], cfg["port"], cfg["routes"], cfg["rps"], cfg["seconds"]
    conns = [(node, j) for j in range(CONNS_PER_NODE) for node in nodes]
    interval = len(conns) / rps  # each connection sends one request every `interval` s
    per_route = [0] * routes
    per_node = dict.fromkeys(nodes, 0)
    counts = {"sent": 0, "ok": 0, "not_200": 0, "errors": 0}
    seq = iter(range(1 << 62))
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    stop = start + seconds

    async def one(node: str, slot: int) -> None:
        reader = writer = None
        next_at = start + slot * interval / len(conns)
        while next_at < stop:
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += interval
            k = next(seq)
            r = k % routes
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(node, port)
                writer.write(f"GET /r{r:04d}/i{k} HTTP/1.1\r\nHost: {node}\r\n\r\n".encode())
                counts["sent"] += 1
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                counts["errors"] += 1
                if writer is not None:
                    writer.close()
                reader = writer = None
                continue
            per_route[r] += 1
            per_node[node] += 1
            counts["ok" if status == 200 else "not_200"] += 1
        if writer is not None:
            writer.close()

    began = time.monotonic()
    await asyncio.gather(*(one(node, slot) for slot, (node, _) in enumerate(conns)))
    return {**counts, "seconds": time.monotonic() - began, "per_route": per_route, "per_node": per_node}


def loadgen_main(raw: str) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(_loadgen(json.loads(raw)))), flush=True)


# --- the collector process -------------------------------------------------------------------------------------
class CollectorProc:
    def __init__(self, fb: _fleetbench.FleetBench, port: int) -> None:
        self.fb, self.port, self.proc, self.starts = fb, port, None, 0
        self.log_path = ""

    def start(self) -> None:
        self.starts += 1
        self.log_path = f"{self.fb.base}/collector-{self.starts}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child keeps it)
        env = {**self.fb.env, "LOG_LEVEL": "INFO", "SPILLWAY_SIGNALS_STATS_S": "5"}
        self.proc = subprocess.Popen(
            [sys.executable, str(_fleetbench.REPO / "manage.py"), "runsignals", "--listen", f"127.0.0.1:{self.port}"],
            cwd=_fleetbench.REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        # A line sent before the collector listens is lost (UDP): wait for it, as an operator starts it first.
        self.fb._wait(lambda: b"listening on" in Path(self.log_path).read_bytes(), 60, "collector")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def last_report(self) -> str:
        lines = [x for x in Path(self.log_path).read_text(errors="replace").splitlines() if "signals:" in x]
        return lines[-1].split("signals:", 1)[1].strip() if lines else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.log_path:
            with open(self.log_path, "rb") as src, open(f"/tmp/spillway-bench-{os.getpid()}-collector-"
                                                         f"{self.starts}.log", "wb") as dst:
                dst.write(src.read())


# --- topology ------------------------------------------------------------------------------------------------------
def route_pool(fb: _fleetbench.FleetBench, i: int):
    return fb.pools["new" if i % 2 else "old"]


def seed_routes(fb: _fleetbench.FleetBench, first: int, count: int, extra: list[tuple[str, int]] = ()) -> list[int]:
    """Routes /r<first>... (and `extra` (path, priority) to pool new), past the API; their ids in order."""
    from django.db.models import F

    from apps.balancers.models import LoadBalancer, Route, RouteTarget

    specs = [(f"/r{i:04d}", 1 + i, route_pool(fb, i)) for i in range(first, first + count)]
    specs += [(path, priority, fb.pools["new"]) for path, priority in extra]
    routes = Route.objects.bulk_create([Route(lb=fb.lb, org=fb.ops, hosts=[], path=path, path_match="prefix",
                                              priority=priority) for path, priority, _ in specs])
    RouteTarget.objects.bulk_create([RouteTarget(route=r, pool=pool, weight=100)
                                     for r, (_, _, pool) in zip(routes, specs, strict=True)])
    LoadBalancer.objects.filter(pk=fb.lb.pk).update(revision=F("revision") + 1)
    return [r.pk for r in routes]


def rollout(fb: _fleetbench.FleetBench, probe_index: int) -> float:
    """Record the bulk-written change, wait for every node to apply it and to serve route `probe_index`."""
    from apps.fleets.services import fleet_mark_changed

    started = time.monotonic()
    for fleet in fb.fleets:
        fleet_mark_changed(fleet=fleet)
    fb.wait_applied(180)
    fb.wait_served(f"/r{probe_index:04d}/probe", route_pool(fb, probe_index).name, 60, 0.05)
    return time.monotonic() - started


def nodes(fb: _fleetbench.FleetBench) -> list:
    from apps.fleets.models import Node

    return list(Node.objects.filter(fleet__in=fb.fleets).select_related("fleet__region").order_by("address"))


def backfill_history(fb: _fleetbench.FleetBench, route_ids: list[int], before: int) -> int:
    """Rows the charted series would have had before the run: 5 min buckets for 7 days and 5 s buckets for the
    last hour, all ending before `before` (unix s), for the LB's listener on each node, each member on each node
    of its region, and `route_ids`."""
    from apps.balancers.models import Listener, Member
    from apps.signals import hist
    from apps.signals.aggregate import ALL_NODES
    from apps.signals.models import SignalBucket
    from apps.signals.services import COARSE_STEP_S, FINE_STEP_S

    lb, org = fb.lb, fb.ops.pk
    listener = Listener.objects.get(lb=lb)
    series = []  # (kind, ref_id, node, pool_id, region, share of the traffic)
    members = {}
    for node in nodes(fb):
        region = node.fleet.region.slug
        series.append(("listener", listener.pk, str(node), None, region, 1 / 6))
        for member in Member.objects.filter(pool__lb=lb, region__slug=region):
            series.append(("member", member.pk, str(node), member.pool_id, region, 1 / 12))
            members[member.pk] = (member.pool_id, region)
    # The all-nodes rows the collector and the roll-up write beside them (what the LB and pool charts read).
    series.append(("listener", listener.pk, ALL_NODES, None, "", 1.0))
    series += [("member", pk, ALL_NODES, pool_id, region, 3 / 12) for pk, (pool_id, region) in members.items()]
    series += [("route", rid, "", None, "", 1 / 1000) for rid in route_ids]
    rng = random.Random(7)

    def row(kind, ref_id, node, pool_id, region, share, start, step) -> SignalBucket:
        requests = max(1, int(1000 * step * share * rng.uniform(0.5, 1.5)))
        total, upstream = hist.new(), hist.new()
        for ms, frac in ((1, 0.5), (2, 0.3), (5, 0.15), (40, 0.05)):
            total[hist.index(ms)] += int(requests * frac)
            upstream[hist.index(max(0, ms - 1))] += int(requests * frac)
        return SignalBucket(kind=kind, ref_id=ref_id, node=node, start=datetime.fromtimestamp(start, UTC),
                            step_s=step, org_id=org, lb_id=lb.pk, pool_id=pool_id, region=region,
                            requests=requests, s2xx=requests, bytes=requests * 200,
                            t_queue={"0": requests}, t_connect={"0": requests},
                            t_upstream=hist.sparse(upstream), t_total=hist.sparse(total))

    written = 0
    for step, span in ((COARSE_STEP_S, 7 * 86400), (FINE_STEP_S, 3600)):
        end = before // step * step
        rows = [row(*s, t, step) for s in series for t in range(end - span, end, step)]
        SignalBucket.objects.bulk_create(rows, batch_size=5000)
        written += len(rows)
    return written


# --- what the nodes and the collector counted ----------------------------------------------------------------------
def node_counters(fb: _fleetbench.FleetBench) -> dict[str, dict]:
    """Per node ("fleet/node"): its frontend's req_tot, each member's responses (hrsp_*), its dropped logs."""
    from apps.balancers.models import Member
    from apps.fleets import queries
    from apps.fleets.config.render.frontends import listener_frontend
    from apps.fleets.node.apply import transport_of
    from apps.fleets.node.showstat import parse_show_stat
    from apps.traffic.observe import parse_backend

    members = {(m.pool_id, m.region.slug, m.name): m.pk
               for m in Member.objects.filter(pool__lb=fb.lb).select_related("region")}
    frontend = listener_frontend(fb.lb.name, "http")
    out = {}
    for node in nodes(fb):
        transport = transport_of(queries.node_conn(node))
        info = dict(line.split(":", 1) for line in transport.runtime("show info").splitlines() if ":" in line)
        counts = {"frontend": 0, "members": {}, "dropped_logs": int(info.get("DroppedLogs", "0").strip() or 0),
                  "worker": info.get("Pid", "").strip()}
        for stat in parse_show_stat(transport.runtime("show stat")):
            if stat.pxname == frontend and stat.svname == "FRONTEND":
                counts["frontend"] = stat.req_tot or 0
            elif stat.is_server:
                ref = parse_backend(stat.pxname)
                mid = members.get((ref.pool_id, ref.region, stat.svname)) if ref else None
                if mid is None:
                    print(f"note: {node}: server {stat.pxname}/{stat.svname} is no member of the LB", flush=True)
                    continue
                counts["members"][mid] = sum(int(stat.raw.get(f"hrsp_{c}") or 0)
                                             for c in ("1xx", "2xx", "3xx", "4xx", "5xx", "other"))
        out[str(node)] = counts
    return out


def signal_sums(since: int) -> dict[tuple[str, int, str], int]:
    """Requests per series in the 5 s buckets that start at or after `since` (unix s)."""
    from django.db.models import Sum

    from apps.signals.models import SignalBucket

    rows = (SignalBucket.objects.filter(step_s=STEP_S, start__gte=datetime.fromtimestamp(since, UTC))
            .values_list("kind", "ref_id", "node").annotate(n=Sum("requests")))
    return {(kind, ref_id, node): n for kind, ref_id, node, n in rows}


def wait_settled(since: int, quiet_s: float = 2.5, timeout_s: float = 60.0) -> float:
    """Wait until the collector's writes stop changing the sums since `since` (it writes every second)."""
    started = time.monotonic()
    last, stable_since = None, time.monotonic()
    while time.monotonic() - started < timeout_s:
        now = sum(signal_sums(since).values())
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= quiet_s:
            return time.monotonic() - started
        time.sleep(0.25)
    raise RuntimeError(f"the collector's sums did not settle within {timeout_s:.0f} s")


def udp_errors() -> dict[str, int]:
    """This host's UDP receive errors (/proc/net/snmp): datagrams dropped on a full receive buffer."""
    lines = [x.split() for x in Path("/proc/net/snmp").read_text().splitlines() if x.startswith("Udp:")]
    row = dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=True))
    return {k: row.get(k, 0) for k in ("InErrors", "RcvbufErrors")}


def quiet_boundary(quiet_s: float = 1.5) -> int:
    """Sleep to the next 5 s bucket boundary at least `quiet_s` away; a request sent before it lands in an
    earlier bucket (the collector stamps a line when it receives it)."""
    now = time.time()
    boundary = (int(now + quiet_s) // STEP_S + 1) * STEP_S
    time.sleep(boundary - now + 0.05)
    return boundary


# --- the runs ----------------------------------------------------------------------------------------------------
class ChartProbe:
    """In a thread: the signals API timed (scope x range, shuffled, paced over the run)."""

    def __init__(self, fb: _fleetbench.FleetBench, targets: list[tuple[str, int]], count: int, over_s: float) -> None:
        self.fb, self.count, self.over_s = fb, count, over_s
        combos = [(scope, pk, r) for scope, pk in targets for r in RANGES]
        self.plan = [combos[i % len(combos)] for i in range(count)]
        random.Random(3).shuffle(self.plan)
        self.ms: dict[tuple[str, str], list[float]] = {}
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        started = time.monotonic()
        for i, (scope, pk, range_name) in enumerate(self.plan):
            time.sleep(max(0.0, started + i * self.over_s / self.count - time.monotonic()))
            t0 = time.monotonic()
            try:
                status, body = self.fb.api("GET", f"/api/v1/signals/?scope={scope}&id={pk}&range={range_name}")
            except OSError as exc:
                self.failures.append(f"{scope} {range_name}: {exc}")
                continue
            ms = (time.monotonic() - t0) * 1000.0
            if status != 200 or "totals" not in body:
                self.failures.append(f"{scope} {range_name}: {status} {str(body)[:200]}")
                continue
            self.ms.setdefault((scope, range_name), []).append(ms)


class LagProbe:
    """In a thread: bursts of requests to /lag (a node in turn), each followed by polling the route's chart
    through the API until it counts them; lag = the burst's first request -> the chart showing all of it."""

    def __init__(self, fb: _fleetbench.FleetBench, route_id: int, samples: int, every_s: float) -> None:
        self.fb, self.route_id, self.samples, self.every_s = fb, route_id, samples, every_s
        self.lags: list[float] = []
        self.failures: list[str] = []
        self.sent = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        started = time.monotonic()
        addresses = self.fb.node_addresses
        for k in range(self.samples):
            time.sleep(max(0.0, started + k * self.every_s - time.monotonic()))
            node = addresses[k % len(addresses)]
            t0 = time.monotonic()
            for j in range(LAG_BURST):
                status, _ = _fleetbench.http_get(node, self.fb.port, f"/lag/b{k}-{j}", 5.0)
                if status != 200:
                    self.failures.append(f"burst {k}: {node} answered {status}")
                self.sent += 1
            want = self.sent
            seen = 0
            while time.monotonic() - t0 < 30:
                status, body = self.fb.api("GET", f"/api/v1/signals/?scope=route&id={self.route_id}&range=5m")
                seen = body.get("totals", {}).get("requests", 0) if status == 200 else 0
                if seen >= want:
                    self.lags.append(time.monotonic() - t0)
                    break
                time.sleep(0.2)
            else:
                self.failures.append(f"burst {k}: chart shows {seen} of {want} requests after 30 s")


def run_load(fb: _fleetbench.FleetBench, coll: CollectorProc, route_ids: list[int], rps: float, seconds: float,
             probes: list = ()) -> dict:
    """One run: load over `route_ids` (and whatever `probes` send), then the collector's 5 s buckets since the
    run began against the nodes' counters and the load generator's. Returns the figures."""
    since = quiet_boundary()
    before, udp_before = node_counters(fb), udp_errors()
    cpu0, t0 = coll.cpu_s(), time.monotonic()
    cfg = {"nodes": fb.node_addresses, "port": fb.port, "routes": len(route_ids), "rps": rps, "seconds": seconds}
    # The load generator stands for clients on other machines: at the lowest CPU priority it takes what the
    # control plane and the nodes leave of this box (a shortfall shows as a lower rate, checked in main).
    loadgen = subprocess.Popen(["nice", "-n", "19", sys.executable, __file__, "loadgen", json.dumps(cfg)],
                               stdout=subprocess.PIPE, text=True)
    for probe in probes:
        probe.thread.start()
    try:
        out, _ = loadgen.communicate(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        loadgen.kill()
        loadgen.wait(5)
        raise
    load_s = time.monotonic() - t0
    for probe in probes:
        probe.thread.join(60)
    gen = json.loads(out)
    settle_s = wait_settled(since)
    cpu = coll.cpu_s() - cpu0
    after, sums, udp_after = node_counters(fb), signal_sums(since), udp_errors()

    from apps.balancers.models import Listener

    listener = Listener.objects.get(lb=fb.lb).pk
    errors: dict[str, list[tuple[float, str]]] = {"node": [], "member": [], "route": []}

    def err(kind: str, what: str, got: int, want: int) -> None:
        errors[kind].append((abs(got - want) / max(want, 1), f"{what}: signals {got} vs {want}"))

    for node, counts in after.items():
        if counts["worker"] != before[node]["worker"]:
            raise RuntimeError(f"{node} reloaded during the run: its counters restarted")
        err("node", f"{node} frontend req_tot", sums.get(("listener", listener, node), 0),
            counts["frontend"] - before[node]["frontend"])
        for mid, n in counts["members"].items():
            err("member", f"{node} member {mid} hrsp_*", sums.get(("member", mid, node), 0),
                n - before[node]["members"].get(mid, 0))
    for i, rid in enumerate(route_ids):
        err("route", f"route {rid} (/r{i:04d})", sums.get(("route", rid, ""), 0), gen["per_route"][i])
    for probe in probes:
        if isinstance(probe, LagProbe):
            err("route", f"route {probe.route_id} (/lag)", sums.get(("route", probe.route_id, ""), 0), probe.sent)
    worst = {kind: max(rows, key=lambda row: (row[0], "vs 0" not in row[1])) for kind, rows in errors.items()}
    series = {key for key, n in sums.items() if n}
    return {
        "routes": len(route_ids), "rps": gen["ok"] / gen["seconds"], "gen": gen, "load_s": load_s,
        "settle_s": settle_s, "cpu_cores": cpu / load_s, "cpu_per_krps": cpu / load_s / (gen["ok"] / gen["seconds"])
        * 1000, "series": len(series), "series_by_kind": {k: sum(1 for s in series if s[0] == k)
                                                          for k in ("listener", "route", "member")},
        "errors": worst, "error_max": max(e for e, _ in worst.values()),
        "frontend_total": sum(c["frontend"] - before[n]["frontend"] for n, c in after.items()),
        "dropped_logs": sum(c["dropped_logs"] - before[n]["dropped_logs"] for n, c in after.items()),
        "udp_errors": {k: udp_after[k] - udp_before[k] for k in udp_after}, "collector": coll.last_report(),
    }


def print_run(name: str, run: dict) -> None:
    gen = run["gen"]
    print(f"[{name}] {run['routes']} routes: {gen['ok']} requests answered 200 in {gen['seconds']:.1f} s "
          f"({run['rps']:.0f}/s; {gen['not_200']} not 200, {gen['errors']} client errors), frontends counted "
          f"{run['frontend_total']}", flush=True)
    print(f"[{name}]   series {run['series']} {run['series_by_kind']}; collector CPU {run['cpu_cores']:.3f} cores "
          f"({run['cpu_per_krps']:.3f} per 1k req/s); writes settled {run['settle_s']:.1f} s after the load",
          flush=True)
    for kind, (e, what) in run["errors"].items():
        print(f"[{name}]   worst {kind}: error {e:.4f} ({what})", flush=True)
    print(f"[{name}]   HAProxy dropped logs {run['dropped_logs']}, host UDP receive errors {run['udp_errors']}; "
          f"collector: {run['collector']}", flush=True)


def new_route_counted(fb: _fleetbench.FleetBench, index: int, route_id: int, wait_s: float) -> float | None:
    """Seconds from a new route being served to the collector counting a request under it (one request to it
    every 0.5 s), or None if it did not within `wait_s`."""
    from apps.signals.models import SignalBucket

    node = fb.node_addresses[0]
    started = time.monotonic()
    while time.monotonic() - started < wait_s:
        _fleetbench.http_get(node, fb.port, f"/r{index:04d}/new", 2.0)
        time.sleep(0.5)
        if SignalBucket.objects.filter(kind="route", ref_id=route_id, step_s=STEP_S).exists():
            return time.monotonic() - started
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", type=int, default=1000)
    parser.add_argument("--small", type=int, default=250, help="routes in the first, smaller run")
    parser.add_argument("--rps", type=float, default=1500.0, help="requests/s over all nodes, both runs")
    parser.add_argument("--seconds", type=float, default=60.0, help="load at the full size")
    parser.add_argument("--small-s", type=float, default=30.0, help="load at the small size")
    parser.add_argument("--lag-samples", type=int, default=20)
    parser.add_argument("--charts", type=int, default=108, help="timed chart requests")
    parser.add_argument("--new-route-wait-s", type=float, default=40.0)
    args = parser.parse_args()
    if not 0 < args.small < args.routes <= 10_000:
        parser.error("need 0 < --small < --routes <= 10000")
    started = time.monotonic()
    udp_port = free_udp_port()
    # Every process that renders a node's config (this one for the nodes' first config, the workers) reads it.
    os.environ["SPILLWAY_SIGNALS_TARGET"] = f"127.0.0.1:{udp_port}"
    fb = coll = None
    try:
        fb = _fleetbench.FleetBench(DB_NAME, nodes_per_region=3, worker_concurrency=2)
        from apps.signals.services import FINE_STEP_S

        assert FINE_STEP_S == STEP_S, FINE_STEP_S
        ids = seed_routes(fb, 0, args.small, extra=[("/lag", 20_000)])
        route_ids, lag_id = ids[:-1], ids[-1]
        charted_routes = route_ids[1:4]
        rows = backfill_history(fb, [*charted_routes, lag_id], int(time.time()) - 600)
        print(f"fleet up ({time.monotonic() - started:.0f} s): nodes {fb.node_addresses} port {fb.port}, "
              f"collector udp 127.0.0.1:{udp_port}; {args.small} routes + /lag; history {rows} rows", flush=True)
        # The collector loads the routes when it starts: start it before the nodes log anything.
        for proc in fb.procs:  # the backends stand for servers on other machines (as bench_scale)
            if "backends" in proc.args:
                os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
        coll = CollectorProc(fb, udp_port)
        coll.start()
        print(f"rolled out {args.small} routes in {rollout(fb, args.small - 1):.1f} s", flush=True)
        small = run_load(fb, coll, route_ids, args.rps, args.small_s)
        print_run("small", small)

        new_ids = seed_routes(fb, args.small, args.routes - args.small)
        route_ids += new_ids
        print(f"rolled out {args.routes} routes in {rollout(fb, args.routes - 1):.1f} s", flush=True)
        counted = new_route_counted(fb, args.routes - 1, route_ids[-1], args.new_route_wait_s)
        if counted is None:
            print(f"NOTE: a request to a route added {args.new_route_wait_s:.0f} s ago is still not counted under "
                  f"it (the collector's directory never reloads while every line names a known listener and "
                  f"member: apps/signals/directory.py); restarting the collector", flush=True)
            coll.stop()
            coll.start()
        else:
            print(f"a new route's requests counted under it {counted:.1f} s after it was served", flush=True)

        from apps.balancers.models import Listener

        lag = LagProbe(fb, lag_id, args.lag_samples, (args.seconds - 10) / args.lag_samples)
        targets = [("lb", fb.lb.pk), *(("route", r) for r in charted_routes[:2]),
                   ("pool", fb.pools["old"].pk), ("pool", fb.pools["new"].pk)]
        charts = ChartProbe(fb, targets, args.charts, args.seconds - 5)
        assert Listener.objects.filter(lb=fb.lb).count() == 1
        full = run_load(fb, coll, route_ids, args.rps, args.seconds, probes=[lag, charts])
        print_run("full", full)
        for line in lag.failures + charts.failures:
            print(f"[full]   probe failure: {line}", flush=True)
        chart_ms = [ms for values in charts.ms.values() for ms in values]
        for (scope, range_name), values in sorted(charts.ms.items()):
            print(f"[full]   chart {scope:5s} {range_name:3s}: p50 {percentile(values, 50):6.1f} ms  "
                  f"max {max(values):6.1f} ms  ({len(values)})", flush=True)
        by_range = {r: [ms for (_, rn), values in charts.ms.items() if rn == r for ms in values] for r in RANGES}
        print("[full]   chart p95 by range: "
              + ", ".join(f"{r} {percentile(v, 95):.0f} ms" for r, v in by_range.items()), flush=True)
        print(f"[full]   lag samples (s): {' '.join(f'{x:.2f}' for x in sorted(lag.lags))}", flush=True)
        idle = ChartProbe(fb, targets, args.charts, 0.0)  # the same charts once the load has stopped
        idle.run()
        idle_ms = [ms for values in idle.ms.values() for ms in values]
        print(f"[idle]   chart p95 {percentile(idle_ms, 95):.0f} ms (p95 by range: "
              + ", ".join(f"{r} {percentile([ms for (_, rn), v in idle.ms.items() if rn == r for ms in v], 95):.0f} ms"
                          for r in RANGES) + ")", flush=True)
    finally:
        if coll is not None:
            coll.stop()
        if fb is not None:
            fb.close()

    lag_p99 = percentile(lag.lags, 99) if len(lag.lags) == args.lag_samples else math.inf
    chart_p95 = percentile(chart_ms, 95) if len(chart_ms) == args.charts else math.inf
    rate_error = max(small["error_max"], full["error_max"])
    routes_ratio = args.routes / args.small
    series_ratio = full["series"] / small["series"]
    cpu_ratio = full["cpu_cores"] / small["cpu_cores"]
    values = {"signal_lag_p99_s": lag_p99, "rate_error_max": rate_error, "chart_p95_ms": chart_p95}
    missed = [f"{k}={v:.4g} > {GOALS[k]}" for k, v in values.items() if not v <= GOALS[k]]
    if series_ratio > routes_ratio:
        missed.append(f"series grew {series_ratio:.2f}x for {routes_ratio:.2f}x routes")
    if cpu_ratio > routes_ratio:
        missed.append(f"collector CPU grew {cpu_ratio:.2f}x for {routes_ratio:.2f}x routes")
    for name, run in (("small", small), ("full", full)):
        if run["rps"] < 0.8 * args.rps or run["gen"]["errors"] or run["gen"]["not_200"]:
            missed.append(f"{name}: load not served as offered ({run['rps']:.0f}/s of {args.rps:.0f}, "
                          f"{run['gen']['errors']} errors, {run['gen']['not_200']} not 200)")
    print(f"\ntook {time.monotonic() - started:.0f} s. series {small['series']} at {args.small} routes -> "
          f"{full['series']} at {args.routes} ({series_ratio:.2f}x for {routes_ratio:.2f}x routes); collector CPU "
          f"{small['cpu_cores']:.3f} -> {full['cpu_cores']:.3f} cores ({cpu_ratio:.2f}x) at the same "
          f"{args.rps:.0f} req/s. Goals: signal_lag_p99_s <= 10, rate_error_max <= 0.02, chart_p95_ms <= 300, "
          f"series and CPU at most linear in routes" + ("" if not missed else f". MISSED: {'; '.join(missed)}"))
    counted_text = "none" if counted is None else f"{counted:.1f}"
    print(f"RESULT signal_lag_p99_s={lag_p99:.2f} series={full['series']} collector_cpu_cores={full['cpu_cores']:.3f} "
          f"chart_p95_ms={chart_p95:.0f} rate_error_max={rate_error:.4f} routes={args.routes} rps={full['rps']:.0f} "
          f"series_{args.small}={small['series']} collector_cpu_cores_{args.small}={small['cpu_cores']:.3f} "
          f"chart_p95_ms_7d={percentile(by_range['7d'], 95):.0f} chart_p95_ms_idle={percentile(idle_ms, 95):.0f} "
          f"new_route_counted_s={counted_text}")
    return 1 if missed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["loadgen"]:
        loadgen_main(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
