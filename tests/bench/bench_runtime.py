"""Fleet-wide drain latency through the HAProxy runtime API (no reload).

Starts 6 real HAProxy masters on 127.0.0.11-16, then drains one pool member on all 6
at once (one thread per node, as a rollout worker would) and measures the time until
every node has acknowledged *and* ``show stat`` on every node shows the new status;
alternates drain/ready for N rounds. Also times a handful of verified reloads for
reference. Loopback only; everything is stopped by PID at the end.

    python tests/bench/bench_runtime.py [--nodes 6] [--rounds 50] [--reloads 10]

Last line: ``RESULT p50_ms=... p99_ms=... ...``. Goal: p99 <= 200 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apps.fleets.config.digest import set_digest
from apps.fleets.node.process import start_master, stop_master
from apps.fleets.node.runtime_api import HAProxySocket
from apps.fleets.node.transports.base import NodeConn
from apps.fleets.node.transports.local import LocalTransport
from tests.netutil import pick_free_port


class Bundle:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.sha256 = set_digest(files)


def node_config(node: NodeConn, port: int, members: int) -> str:
    # Servers point at ports nothing listens on and have no health checks: the runtime
    # API path (parse, lock, state change) is what is measured, not traffic.
    servers = "\n".join(f"    server m{i} 127.0.0.1:{20000 + i} weight 10" for i in range(members))
    return f"""global
    default-path config
    stats socket {node.stats_socket_path} mode 600 level admin
    server-state-file {node.server_state_path}
    hard-stop-after 5s

defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
    load-server-state-from-file global

frontend fe
    bind {node.address}:{port}
    default_backend pool

backend pool
    balance roundrobin
{servers}
"""


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100.0 * (len(ordered) - 1))))
    return ordered[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--reloads", type=int, default=10)
    args = parser.parse_args()
    haproxy_bin = shutil.which("haproxy") or "/usr/sbin/haproxy"

    base = Path(tempfile.mkdtemp(prefix="spillway-bench-runtime-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        nodes: list[NodeConn] = []
        for i in range(args.nodes):
            address = f"127.0.0.{11 + i}"
            node = NodeConn(f"n{i}", address, str(base / f"n{i}" / "run"), str(base / f"n{i}" / "etc"), haproxy_bin)
            cfg = node_config(node, pick_free_port(address), args.members)
            pushed = LocalTransport(node).push(Bundle({"haproxy.cfg": cfg.encode()}))
            if not pushed.ok:
                print(pushed.validation_output, file=sys.stderr)
                return 1
            procs.append(start_master(node.config_path, node.runtime_dir, haproxy_bin))
            nodes.append(node)
        sockets = [HAProxySocket(n.stats_socket_path, timeout_s=2.0) for n in nodes]
        version = subprocess.check_output([haproxy_bin, "-v"]).split()[2].decode()
        print(f"{len(nodes)} haproxy nodes up ({version})")

        def apply(sock: HAProxySocket, state: str) -> float:
            start = time.perf_counter()
            sock.set_server_state("pool", "m3", state)  # type: ignore[arg-type]
            expected = "DRAIN" if state == "drain" else "no check"
            row = next(r for r in sock.show_stat() if r.pxname == "pool" and r.svname == "m3")
            if row.status != expected:
                raise RuntimeError(f"{sock.path}: m3 is {row.status}, expected {expected}")
            return (time.perf_counter() - start) * 1000.0

        fleet_ms: list[float] = []
        node_ms: list[float] = []
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            for round_no in range(args.rounds):
                state = "drain" if round_no % 2 == 0 else "ready"
                start = time.perf_counter()
                per_node = list(pool.map(lambda s, st=state: apply(s, st), sockets))
                fleet_ms.append((time.perf_counter() - start) * 1000.0)
                node_ms.extend(per_node)

        reload_ms: list[float] = []
        transport = LocalTransport(nodes[0])
        for _ in range(args.reloads):
            result = transport.activate(timeout_s=10)
            if not result.ok:
                print(f"reload failed: {result.error}", file=sys.stderr)
                return 1
            reload_ms.append(result.duration_ms)

        p50, p99 = statistics.median(fleet_ms), percentile(fleet_ms, 99)
        print(f"fleet-wide drain/ready, {len(nodes)} nodes x {args.rounds} rounds (ack + show stat confirmed):")
        print(f"  p50 {p50:.2f} ms  p99 {p99:.2f} ms  max {max(fleet_ms):.2f} ms")
        print(
            f"  per node: p50 {statistics.median(node_ms):.2f} ms  p99 {percentile(node_ms, 99):.2f} ms "
            f"({len(node_ms)} ops)"
        )
        print(
            f"verified reload (save state + reload + show proc), {args.reloads}x: "
            f"p50 {statistics.median(reload_ms):.1f} ms  max {max(reload_ms):.1f} ms"
        )
        print(f"goal p99 <= 200 ms: {'met' if p99 <= 200 else 'MISSED'}")
        print(
            f"RESULT p50_ms={p50:.2f} p99_ms={p99:.2f} nodes={len(nodes)} rounds={args.rounds} "
            f"reload_p50_ms={statistics.median(reload_ms):.1f}"
        )
        return 0
    finally:
        for proc in procs:
            stop_master(proc, soft_timeout_s=2.0, term_timeout_s=2.0)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
