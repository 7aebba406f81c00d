"""Hitless delivery: keep-alive load through every node while route changes are rolled out.

2 regions x N local HAProxy nodes (loopback), a real gunicorn and Celery worker (see
_fleetbench). One `wrk` per node (keep-alive, `-t1 -c<connections>`) runs for `--duration`
seconds against `/`; meanwhile `--changes` changes go through the REST API, evenly spaced, alternating
a new route (map-only: applied through the runtime API, no reload) and a new balancing algorithm for
the pool wrk's requests go to (haproxy.cfg changes: a verified reload of every node under load).
wrk's own counters are summed.

    python tests/bench/bench_hitless.py [--duration 30] [--changes 20] [--nodes 3] [--connections 8]

Last line: ``RESULT requests=... socket_errors=... non_2xx=...``. Goal: 0 and 0.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fleetbench import FleetBench

_REQUESTS_RE = re.compile(r"(\d+) requests in")
_SOCKET_RE = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON2XX_RE = re.compile(r"Non-2xx or 3xx responses: (\d+)")


def parse_wrk(text: str) -> tuple[int, int, int]:
    requests = int(m.group(1)) if (m := _REQUESTS_RE.search(text)) else 0
    socket_errors = sum(int(x) for x in m.groups()) if (m := _SOCKET_RE.search(text)) else 0
    non_2xx = int(m.group(1)) if (m := _NON2XX_RE.search(text)) else 0
    return requests, socket_errors, non_2xx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections per node")
    parser.add_argument("--verbose", action="store_true", help="print each wrk report")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")

    bench = FleetBench("spw_bench_hitless", nodes_per_region=args.nodes)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        from apps.fleets.models import NodeResult, Rollout

        bench.initial_rollout()
        first_result = NodeResult.objects.order_by("-id").values_list("id", flat=True).first() or 0
        for address in bench.node_addresses:
            procs.append(subprocess.Popen(
                [wrk, "-t1", f"-c{args.connections}", f"-d{args.duration}s", "--timeout", "5s",
                 f"http://{address}:{bench.port}/"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        started = time.monotonic()
        spacing_s = (args.duration - 4) / max(1, args.changes)
        time.sleep(2.0)
        old_pool = bench.pools["old"].pk
        for i in range(args.changes):
            if i % 2 == 0:
                # A route: only map files change, so nodes take it through the runtime API.
                bench.add_route(f"/h{i}/", 2000 + i)
                bench.wait_served(f"/h{i}/x", "new")
            else:
                # The serving pool's algorithm: haproxy.cfg changes, so every node reloads under load.
                algorithm = "leastconn" if i % 4 == 1 else "roundrobin"
                status, body = bench.api("PATCH", f"/api/v1/pools/{old_pool}/", {"algorithm": algorithm})
                if status != 200:
                    raise RuntimeError(f"pool update failed: {status} {body}")
                bench.wait_applied()
            next_at = started + 2.0 + (i + 1) * spacing_s
            time.sleep(max(0.0, next_at - time.monotonic()))
        totals = [0, 0, 0]
        for proc in procs:
            out, _ = proc.communicate(timeout=args.duration + 30)
            text = out.decode(errors="replace")
            if args.verbose:
                print(text)
            for k, value in enumerate(parse_wrk(text)):
                totals[k] += value
        reloads = NodeResult.objects.filter(id__gt=first_result, status="succeeded",
                                            reload_ms__isnull=False).count()
        failed = Rollout.objects.filter(status="failed").count()
        for rollout in Rollout.objects.filter(status="failed"):
            print(f"failed rollout {rollout.pk} ({rollout.fleet.name}): {rollout.error[:300]}")
        print(f"{len(procs)} nodes, wrk -t1 -c{args.connections} each for {args.duration}s (keep-alive)")
        print(f"{args.changes} changes via the API, {reloads} verified node reloads, {failed} failed rollouts")
        print(f"requests={totals[0]} socket_errors={totals[1]} non_2xx={totals[2]} "
              f"(~{totals[0] / args.duration:.0f} req/s over the fleet)")
        print(f"RESULT requests={totals[0]} socket_errors={totals[1]} non_2xx={totals[2]} reloads={reloads}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        bench.close()


if __name__ == "__main__":
    main()
