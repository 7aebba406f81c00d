"""The capacity-management tutorial end to end through Spillway: 2 regions x 3 HAProxy nodes on loopback.

What a user does, in order, all through the REST API of a real gunicorn (`_fleetbench.FleetBench`):
  1. builds the topology: regions a and b, their distance, a fleet per region, 3 local nodes per
     fleet (the harness starts each node's HAProxy master, as the node's host would), an LB, a pool
     with a capacity row per region and no max rate yet, 3 fixed-service-capacity members per region
     (bench_overflow's: one request at a time, fixed service time), an http listener; waits on the
     `applied` long-poll;
  2. runs a capacity test per region (POST /capacity-tests/, /start/): a real Celery worker offers
     open-loop steps through a node of that region while Spillway holds overflow of the pool off;
  3. applies each run's recommendation (POST /capacity-runs/{id}/apply/: the pool region's
     max_rate_per_member, the same audited write as PATCH /pool-regions/{id}/) and waits for it to
     be applied on every node;
  4. sends open-loop load through the nodes with ingress skews (a) all through one node of region
     a, (b) 80% through a's nodes / 20% b's, (c) uniform over all 6, at 0.5x, 1x, 1.5x, 2x of
     region a's max rate.
The enforcement loop is the product's own: the `manage.py enforcer` process (every 250 ms, demand
from the demand table's counts), with Celery beat running the health task every 5 s (which feeds the
dashboard) and `fleets.enforce_task` as the enforcer's fallback. Figures come from the
members' own counters (arrival timestamps).

  local_fraction_min: min over skews/levels of (served in a) / min(offered to a's nodes, a's max rate)
  neighbour_load_max: max over skews/levels of (served in b) / b's max rate (with absorb off: the
                      pool sheds past every region's max rate, so this is the enforced ceiling)
  react_s:            at 1.5x, the skew changes uniform -> one-node -> 80/20 -> uniform: the longest
                      time from a change until every later 1 s window of what a served is within 10%
                      of min(offered to a's nodes, a's max rate)
  p50_ratio_2x:       skew (a): p50 at 2x / p50 at 0.5x
  shed_with_room_max: max over levels below 95% of both regions' max rates of 503s / requests sent
                      (warm-up included): requests the pool shed while region b had room
  dashboard_err_max:  one-node at 1.5x held for --dash-s: per region, served (local + in) and a's
                      overflow out, as GET /traffic/overflow/ shows them for its fully covered 10 s
                      buckets, against the members' counters over the same buckets (goal <= 0.05)

    python tests/bench/bench_overflow_fleet.py [--step-s 8] [--service-ms 50]

Goals: local_fraction_min >= 0.95, neighbour_load_max <= 1.05, react_s <= 2, p50_ratio_2x <= 1.3,
dashboard_err_max <= 0.05.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import _fleetbench
from tests.bench.bench_overflow import MEMBERS_PER_REGION, Backends, wait_idle

DB_NAME = os.environ.get("BENCH_DB_NAME", "spillway_bench_overflow_fleet")
MULTIPLIERS = (0.5, 1.0, 1.5, 2.0)
NODES_PER_REGION = 3
SKEWS = {
    "one-node": lambda nodes: {nodes["a"][0]: 1.0},
    "80/20": lambda nodes: {**{n: 0.8 / len(nodes["a"]) for n in nodes["a"]},
                            **{n: 0.2 / len(nodes["b"]) for n in nodes["b"]}},
    "uniform": lambda nodes: {n: 1.0 / (len(nodes["a"]) + len(nodes["b"])) for r in "ab" for n in nodes[r]},
}
# The capacity test's steps (req/s, s): past 3 members x ~20 req/s, so the knee is inside.
CAPACITY_STEPS = [[15.0, 3.0], [30.0, 3.0], [45.0, 3.0], [60.0, 3.0], [75.0, 3.0]]
SAFETY_FACTOR = 0.67  # the tutorial's "about two-thirds of what was measured"


@dataclass
class Topology:
    lb: int
    pool: int
    listener: int
    port: int
    addresses: dict[str, list[str]]
    pool_regions: dict[str, int]


def must(fb: _fleetbench.FleetBench, method: str, path: str, body: dict | None = None, want: int = 201) -> dict:
    status, answer = fb.api(method, path, body)
    if status != want:
        raise RuntimeError(f"{method} {path}: {status} {answer}")
    return answer


def build(fb: _fleetbench.FleetBench, backends: Backends) -> Topology:
    """Everything through the API; only the nodes' HAProxy masters are started by the harness."""
    from tests.netutil import free_port_on

    for slug in ("a", "b"):
        must(fb, "POST", "/api/v1/regions/", {"slug": slug, "name": f"region {slug}"})
    must(fb, "POST", "/api/v1/region-distances/", {"src": "a", "dst": "b", "rtt_ms": 30})
    must(fb, "POST", "/api/v1/region-distances/", {"src": "b", "dst": "a", "rtt_ms": 30})
    fleets = {r: must(fb, "POST", "/api/v1/fleets/", {"name": f"f{r}", "region": r})["id"] for r in "ab"}
    addresses = {"a": [f"127.0.95.{i}" for i in range(1, NODES_PER_REGION + 1)],
                 "b": [f"127.0.96.{i}" for i in range(1, NODES_PER_REGION + 1)]}
    port = free_port_on([a for r in addresses.values() for a in r])
    for r in "ab":
        for i, address in enumerate(addresses[r], 1):
            node = must(fb, "POST", "/api/v1/nodes/", {
                "fleet": f"f{r}", "name": f"{r}{i}", "address": address, "bind_address": address,
                "transport": "local", "runtime_dir": f"{fb.base}/{r}{i}/run", "config_dir": f"{fb.base}/{r}{i}/etc"})
            fb.start_node(node["id"])
    lb = must(fb, "POST", "/api/v1/load-balancers/", {"name": "bench", "kind": "haproxy", "fleet": fleets["a"]})["id"]
    fb.lb_id = lb
    must(fb, "PATCH", f"/api/v1/fleets/{fleets['b']}/", {"serves": [lb]}, want=200)
    # absorb off: past every region's max rate the pool sheds, so the members' counters show the ceiling.
    pool = must(fb, "POST", "/api/v1/pools/", {
        "lb": lb, "name": "web", "overload": "shed", "health_path": "",
        "regions": [{"region": r, "max_rate_per_member": None} for r in "ab"]})
    for m in backends.members:
        must(fb, "POST", "/api/v1/members/", {"pool": pool["id"], "region": m.region, "name": m.name,
                                             "address": "127.0.0.1", "port": m.port})
    listener = must(fb, "POST", "/api/v1/listeners/", {"lb": lb, "name": "http", "port": port,
                                                      "default_pool": pool["id"]})["id"]
    # Load tests never go to a private or loopback address unless the operator allowed that network.
    must(fb, "POST", "/api/v1/capacity-allowlist/", {"cidr": "127.0.0.0/8", "applies_to_all_orgs": True,
                                                     "note": "bench: the fleet listens on loopback"})
    fb.wait_applied(120)
    return Topology(lb=lb, pool=pool["id"], listener=listener, port=port, addresses=addresses,
                    pool_regions={row["region"]: row["id"] for row in pool["regions"]})


def capacity_test(fb: _fleetbench.FleetBench, topo: Topology, region: str) -> dict:
    """Define, start, wait for and apply one region's capacity test; returns the finished run."""
    test = must(fb, "POST", "/api/v1/capacity-tests/", {
        "name": f"knee-{region}", "listener": topo.listener, "pool": topo.pool, "region": region, "path": "/",
        "mode": "open", "steps": CAPACITY_STEPS, "slo_p99_ms": 250.0, "slo_error_rate": 0.01, "shards": 1,
        "safety_factor": SAFETY_FACTOR, "max_connections": 100, "timeout_s": 10.0})
    run = must(fb, "POST", f"/api/v1/capacity-tests/{test['id']}/start/")
    deadline = time.monotonic() + 180
    while run["status"] in ("pending", "running"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"capacity run {run['id']} still {run['status']}")
        time.sleep(1.0)
        run = must(fb, "GET", f"/api/v1/capacity-runs/{run['id']}/", want=200)
    steps = ", ".join(f"{s['offered_rate']:.0f}->{s['achieved_rate']:.1f} p99 {s['p99_ms']:.0f}ms"
                      for s in run["steps"])
    print(f"  capacity test {region}: {run['status']} via {run['target_address']}; steps {steps}\n"
          f"    knee {run['knee_capacity_rps']} req/s ({run['knee_reason']}); "
          f"recommended {run['recommended_max_rate_per_member']} per member ({run['recommendation_note']})",
          flush=True)
    if run["status"] != "succeeded" or run["recommended_max_rate_per_member"] is None:
        raise RuntimeError(f"capacity run for {region} gave no recommendation: {run['error'] or run['status']}")
    applied = must(fb, "POST", f"/api/v1/capacity-runs/{run['id']}/apply/", want=200)
    run["applied_max_rate_per_member"] = applied["pool_region_max_rate_per_member"]
    fb.wait_applied(60)
    return run


def start_load(port: int, shares: dict[str, float], steps: dict[str, list[tuple[float, float]]]) -> list:
    """One open-loop plan per entry node, started together; returns the threads."""
    from apps.capacity.engine import LoadPlan, Target, run_plan

    threads = []
    for address in shares:
        plan = LoadPlan.open_loop(Target(host=address, port=port, timeout_s=10.0), steps[address])
        t = threading.Thread(target=run_plan, args=(plan,), daemon=True)
        threads.append(t)
    for t in threads:
        t.start()
    return threads


def served(backends: Backends, region: str, since: float, until: float) -> float:
    return sum(1 for t in backends.arrivals(region, since) if t < until) / (until - since)


def run_skew(backends: Backends, port: int, shares: dict[str, float], rate: float, step_s: float) -> dict:
    from apps.capacity.engine import LoadPlan, Target, run_plan

    wait_idle(backends)
    results: dict[str, object] = {}
    threads = []
    for address, share in shares.items():
        plan = LoadPlan.constant(Target(host=address, port=port, timeout_s=10.0), rate * share, step_s + 2.0)
        t = threading.Thread(target=lambda a=address, p=plan: results.__setitem__(a, run_plan(p)), daemon=True)
        threads.append(t)
        t.start()
    time.sleep(2.0)  # the loop sees the new demand (~0.25 s) and sets limits; then measure
    since = time.monotonic()
    time.sleep(step_s)
    until = time.monotonic()
    for t in threads:
        t.join(step_s + 30)
    p50s = [r.total.p50_ms for r in results.values() if r.total.ok]  # type: ignore[attr-defined]
    errors = sum(r.total.error_count for r in results.values())  # type: ignore[attr-defined]
    sent = sum(r.total.sent for r in results.values())  # type: ignore[attr-defined]
    return {"in_a": served(backends, "a", since, until), "in_b": served(backends, "b", since, until),
            "p50_ms": max(p50s) if p50s else float("nan"), "errors": errors, "sent": sent}


def measure_react(backends: Backends, port: int, addresses: dict[str, list[str]], region_max: float,
                  phase_s: float) -> list[tuple[str, float]]:
    """1.5x through uniform -> one-node -> 80/20 -> uniform; settle time of region a after each change."""
    wait_idle(backends)
    order = ["uniform", "one-node", "80/20", "uniform"]
    rate = 1.5 * region_max
    phases = [SKEWS[name](addresses) for name in order]
    nodes = [n for r in "ab" for n in addresses[r]]
    # Each node's plan: one step per phase (a tiny rate where the phase sends it nothing: steps need > 0).
    steps = {n: [(max(rate * p.get(n, 0.0), 0.01), phase_s) for p in phases] for n in nodes}
    started = time.monotonic()
    threads = start_load(port, {n: 1.0 for n in nodes}, steps)
    for t in threads:
        t.join(len(order) * phase_s + 30)
    out = []
    for i in range(1, len(order)):
        change = started + i * phase_s
        offered_a = rate * sum(s for n, s in phases[i].items() if n in addresses["a"])
        target = min(offered_a, region_max)
        end = change + phase_s - 1.0
        settled = change
        t = change
        while t <= end:
            if abs(served(backends, "a", t, t + 1.0) - target) > 0.10 * target:
                settled = t + 0.1  # not yet settled at t: the earliest it can be is the next tick
            t += 0.1
        out.append((f"{order[i - 1]}->{order[i]}", settled - change))
        # What a served per 0.5 s around the change (diagnosis of a slow settle: when, how deep).
        series = [served(backends, "a", change + k * 0.5, change + (k + 1) * 0.5) for k in range(-2, 2 * int(phase_s))]
        print(f"    a per 0.5 s from -1 s, target {target:.1f}: " + " ".join(f"{v:.0f}" for v in series), flush=True)
    return out


def dashboard_check(fb: _fleetbench.FleetBench, backends: Backends, topo: Topology, region_max: float,
                    hold_s: float) -> tuple[float, list[str]]:
    """One-node at 1.5x for `hold_s`; the overflow API's fully covered buckets vs the members' counters."""
    wait_idle(backends)
    wall_minus_mono = time.time() - time.monotonic()
    started = time.monotonic()
    threads = start_load(topo.port, {topo.addresses["a"][0]: 1.0},
                         {topo.addresses["a"][0]: [(1.5 * region_max, hold_s)]})
    for t in threads:
        t.join(hold_s + 30)
    ended = started + hold_s
    time.sleep(12.0)  # the health task (every 5 s) samples and buckets the last seconds
    view = must(fb, "GET", f"/api/v1/traffic/overflow/?pool={topo.pool}&window={int(hold_s) + 60}s", want=200)
    resolution = view["resolution_s"]
    series = view["series"]
    # A sample is the counter delta since the previous reading (5 s earlier): a bucket is steady only
    # when load ran from one sampling interval before it to its end.
    covered = [i for i, t in enumerate(series["time"])
               if t - wall_minus_mono >= started + 5.0 + 1.0 and t + resolution - wall_minus_mono <= ended]
    if not covered:
        return float("inf"), ["no fully covered bucket"]
    since = series["time"][covered[0]] - wall_minus_mono
    until = series["time"][covered[-1]] + resolution - wall_minus_mono
    lines, errs = [], []
    regions = series["regions"]

    def mean(region: str, key: str) -> float:
        return sum(regions[region][key][i] for i in covered) / len(covered)

    counters = {r: served(backends, r, since, until) for r in "ab"}
    checks = [("served a", mean("a", "local") + mean("a", "in"), counters["a"]),
              ("served b", mean("b", "local") + mean("b", "in"), counters["b"]),
              ("a overflow out", mean("a", "out"), counters["b"])]  # all ingress is a1's: b serves a's overflow
    for label, shown, counted in checks:
        err = abs(shown - counted) / counted if counted else float("inf")
        errs.append(err)
        lines.append(f"{label}: dashboard {shown:.2f}/s, members {counted:.2f}/s ({err:.1%})")
    return max(errs), [f"{len(covered)} bucket(s) of {resolution} s", *lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-s", type=float, default=8.0)
    parser.add_argument("--service-ms", type=float, default=50.0)
    parser.add_argument("--phase-s", type=float, default=8.0, help="seconds per skew in the react run")
    parser.add_argument("--dash-s", type=float, default=40.0, help="seconds of load for the dashboard check")
    args = parser.parse_args()
    started = time.monotonic()
    backends = Backends(args.service_ms / 1000.0)
    fb = None
    rows = []
    try:
        fb = _fleetbench.FleetBench(DB_NAME, worker_concurrency=2, topology=False, beat=True)
        topo = build(fb, backends)
        print(f"built through the API: LB {topo.lb}, pool {topo.pool}, nodes {topo.addresses}, port {topo.port} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
        runs = {r: capacity_test(fb, topo, r) for r in "ab"}
        caps = {r: runs[r]["applied_max_rate_per_member"] * MEMBERS_PER_REGION for r in "ab"}
        region_max = caps["a"]
        print(f"applied: max rate per member a {runs['a']['applied_max_rate_per_member']}, "
              f"b {runs['b']['applied_max_rate_per_member']} -> region max a {caps['a']:.1f}, "
              f"b {caps['b']:.1f} req/s", flush=True)
        for skew, make in SKEWS.items():
            shares = make(topo.addresses)
            offered_a = sum(s for a, s in shares.items() if a in topo.addresses["a"])
            for m in MULTIPLIERS:
                rate = m * region_max
                row = run_skew(backends, topo.port, shares, rate, args.step_s)
                row.update(skew=skew, x=m, rate=rate, offered_a=rate * offered_a)
                rows.append(row)
                print(f"  {skew:8s} {m:>3}x {rate:6.1f} req/s (to a's nodes {row['offered_a']:6.1f}): "
                      f"served a {row['in_a']:6.1f}/s  b {row['in_b']:6.1f}/s  p50 {row['p50_ms']:7.1f} ms  "
                      f"errors(503 shed) {row['errors']}", flush=True)
        reacts = measure_react(backends, topo.port, topo.addresses, region_max, args.phase_s)
        print("  react: " + ", ".join(f"{label} {s:.2f} s" for label, s in reacts), flush=True)
        dash_err, dash_lines = dashboard_check(fb, backends, topo, region_max, args.dash_s)
        print("  dashboard vs members: " + "; ".join(dash_lines), flush=True)
    finally:
        if fb is not None:
            fb.close()
        backends.stop()

    local = [r["in_a"] / min(r["offered_a"], caps["a"]) for r in rows if r["offered_a"] > 0]
    neighbour = [r["in_b"] / caps["b"] for r in rows]
    by = {(r["skew"], r["x"]): r for r in rows}
    p50_ratio = by[("one-node", 2.0)]["p50_ms"] / by[("one-node", 0.5)]["p50_ms"]
    react_s = max(s for _, s in reacts)
    # `shed` sheds only past every region's max rate: below that, any 503 is a request b had room for.
    with_room = [r["errors"] / r["sent"] for r in rows if r["rate"] < 0.95 * (caps["a"] + caps["b"]) and r["sent"]]
    print(f"\ntook {time.monotonic() - started:.0f} s. Goals: local_fraction_min >= 0.95, neighbour_load_max <= 1.05, "
          f"react_s <= 2, p50_ratio_2x <= 1.3, dashboard_err_max <= 0.05, shed_with_room_max ~ 0")
    print(f"RESULT local_fraction_min={min(local):.3f} neighbour_load_max={max(neighbour):.3f} "
          f"react_s={react_s:.2f} p50_ratio_2x={p50_ratio:.2f} dashboard_err_max={dash_err:.3f} "
          f"shed_with_room_max={max(with_room, default=0.0):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
