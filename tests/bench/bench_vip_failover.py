"""VIP failover: 1 region x 3 nodes in network namespaces (tests/netns.py), keepalived VRRPv3.

Each host runs its own sshd, HAProxy, keepalived and a loopback backend answering with the host's
name. The fleet's bundles are rendered by the product's pure renderer and pushed through the SSH
transport (delivery.apply_node: validate -> push -> reload -> verify -> keepalived SIGHUP).

Load during the whole run: two `wrk` (one with `Connection: close` = a new connection per request, one
keep-alive) against the VIP, plus a probe opening a new connection every 10 ms that records who answered.
Events, in order: kill the holder's HAProxy; bring it back; kill the new holder's whole namespace; bring
it back. A watcher reads the holder from the namespaces every 20 ms.

- failover_ms: from a kill until the probe is answered by another node (one sample per kill).
- failed_requests: wrk socket errors + non-2xx, both runs (errors are expected inside the windows).
- errors_outside_windows: probe failures outside every [kill, answered-again] window (goal 0).
- flaps: holder changes beyond one per kill (a bring-back must not move the VIP; goal 0).

    python tests/bench/bench_vip_failover.py [--advert-ms 200] [--cycles 1]

Last line: RESULT failover_ms_p50=... failover_ms_max=... failed_requests=... flaps=...
Goals (issue 15): max <= 2000 ms, p50 <= 1000 ms, errors only inside windows, no more than one move per event.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("DEBUG", "1")  # dev settings: this benchmark uses no database and no secret

import django  # noqa: E402

django.setup()

from apps.fleets.delivery import NodePlan, apply_node  # noqa: E402
from apps.fleets.render import render  # noqa: E402
from apps.fleets.render.keepalived import node_priority  # noqa: E402
from apps.fleets.snapshot import (  # noqa: E402
    FleetSnapshot,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    VrrpSpec,
)
from apps.fleets.transports.base import NodeConn  # noqa: E402
from tests import netns  # noqa: E402

PORT = 80
_SOCKET_RE = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON2XX_RE = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_REQUESTS_RE = re.compile(r"(\d+) requests in")


def snapshot(vip: str) -> FleetSnapshot:
    pool = PoolSpec(id=1, name="www", algorithm="roundrobin", health=None,
                    regions=(PoolRegionSpec(region="us-east", members=(
                        MemberSpec(name="local", address="127.0.0.1", port=netns.BACKEND_PORT, weight=100),)),),
                    chain=(RegionStep(region="us-east", rate_limit_per_node=None),))
    listener = ListenerSpec(id=1, lb="web", name="http", protocol="http", address=vip, port=PORT, default_pool_id=1)
    return FleetSnapshot(fleet="bench", region="us-east", revision=1, listeners=(listener,), pools=(pool,))


def deploy(topo: netns.Topology, vip: str, advert_ms: int) -> None:
    snap = snapshot(vip)
    for i, host in enumerate(topo.hosts):
        vrrp = VrrpSpec(interface=netns.IFACE, address=host.address, priority=node_priority(i),
                        peers=tuple(h.address for h in topo.hosts if h is not host), advert_ms=advert_ms)
        bundle = render(snap, NodeSpec(name=host.name, runtime_dir=host.runtime_dir, vrrp=vrrp))
        conn = NodeConn(name=host.name, address=host.address, runtime_dir=host.runtime_dir,
                        config_dir=host.config_dir, haproxy_bin=netns.HAPROXY_BIN, transport="ssh",
                        ssh_host=host.address, ssh_port=22, ssh_user="root", ssh_private_key=topo.client_key,
                        ssh_known_hosts=host.host_key_pub)
        outcome = apply_node(NodePlan(conn=conn, bundle=bundle, last_good=None))
        if not outcome.ok:
            raise SystemExit(f"deploy to {host.name} failed: {outcome.error}")


class Probe(threading.Thread):
    """A new connection every `interval_s`; records (time, who answered or None)."""

    def __init__(self, vip: str, interval_s: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.vip, self.interval_s = vip, interval_s
        self.samples: list[tuple[float, str | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            who = None
            conn = http.client.HTTPConnection(self.vip, PORT, timeout=1.0)  # as wrk --timeout
            try:
                conn.request("GET", "/", headers={"Connection": "close"})
                response = conn.getresponse()
                body = response.read().decode()
                who = body if response.status == 200 else None
            except (OSError, http.client.HTTPException):
                who = None
            finally:
                conn.close()
            self.samples.append((started, who))
            time.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def answered_by_other_after(self, t0: float, old: str, timeout_s: float = 10.0) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for t, who in list(self.samples):
                if t >= t0 and who is not None and who != old:
                    return t
            time.sleep(0.02)
        return None


class Watcher(threading.Thread):
    """The holder sequence, read from the namespaces every 20 ms."""

    def __init__(self, topo: netns.Topology, vip: str) -> None:
        super().__init__(daemon=True)
        self.topo, self.vip = topo, vip
        self.moves: list[tuple[float, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            holders = self.topo.holders(self.vip)
            if len(holders) == 1 and holders[0] != last:
                if last is not None:
                    self.moves.append((time.monotonic(), holders[0]))
                last = holders[0]
            time.sleep(0.02)

    def current(self) -> str:
        holders = self.topo.holders(self.vip)
        return holders[0] if len(holders) == 1 else ""


def wrk(vip: str, seconds: int, close: bool) -> subprocess.Popen[str]:
    argv = ["wrk", "-t1", "-c4", f"-d{seconds}s", "--timeout", "1s", f"http://{vip}:{PORT}/"]
    if close:
        argv[1:1] = ["-H", "Connection: close"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wrk_failures(text: str) -> tuple[int, int]:
    requests = int(m.group(1)) if (m := _REQUESTS_RE.search(text)) else 0
    errors = sum(int(x) for x in m.groups()) if (m := _SOCKET_RE.search(text)) else 0
    errors += int(m.group(1)) if (m := _NON2XX_RE.search(text)) else 0
    return requests, errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--advert-ms", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--settle-s", type=float, default=4.0)
    args = parser.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(f"cannot run: {why}")
    topo = netns.Topology(prefix="s15b", subnet=2, count=3, base=Path(tempfile.mkdtemp(prefix="s15b-")))
    vip = topo.vip(1)
    try:
        topo.up()
        deploy(topo, vip, args.advert_ms)
        deadline = time.monotonic() + 10
        while len(topo.holders(vip)) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"VIP {vip} held by {topo.holders(vip)}; advert {args.advert_ms} ms (VRRPv3)")
        probe, watcher = Probe(vip), Watcher(topo, vip)
        probe.start()
        watcher.start()
        duration = int(args.cycles * (4 * args.settle_s + 8) + 8)
        loads = [wrk(vip, duration, close=True), wrk(vip, duration, close=False)]
        time.sleep(args.settle_s)
        failovers: list[float] = []
        windows: list[tuple[float, float]] = []
        kills = 0
        events: list[tuple[float, str]] = []
        for _ in range(args.cycles):
            for kind in ("haproxy", "namespace"):
                holder = watcher.current()
                host = next(h for h in topo.hosts if h.name == holder)
                t0 = time.monotonic()
                events.append((t0, f"kill {kind} of {holder}"))
                (topo.kill_haproxy if kind == "haproxy" else topo.kill_host)(host)
                kills += 1
                t1 = probe.answered_by_other_after(t0, holder)
                if t1 is None:
                    raise SystemExit(f"after killing {holder}'s {kind} no other node answered within 10 s")
                failovers.append((t1 - t0) * 1000)
                windows.append((t0, t1))
                print(f"kill {kind} of {holder}: answered by another node after {failovers[-1]:.0f} ms")
                time.sleep(args.settle_s)
                events.append((time.monotonic(), f"{holder} back"))
                if kind == "haproxy":
                    topo.start_haproxy(host)
                else:
                    topo.start_host(host)  # same disk: it comes back with its last config
                print(f"  {holder} back; holder now {watcher.current()}")
                time.sleep(args.settle_s)
        outputs = [p.communicate(timeout=duration + 30)[0] for p in loads]
        probe.stop.set()
        watcher.stop.set()
        probe.join(2)
        watcher.join(2)
    finally:
        topo.down()
    totals = [wrk_failures(text) for text in outputs]
    for (requests, errors), mode in zip(totals, ("new connection per request", "keep-alive"), strict=True):
        print(f"wrk {mode}: {requests} requests, {errors} failed")
    failed = sum(e for _, e in totals)
    outside = sum(1 for t, who in probe.samples
                  if who is None and not any(a <= t <= b + 0.05 for a, b in windows))
    flaps = max(0, len(watcher.moves) - kills)
    for t, who in probe.samples:
        if who is None and not any(a <= t <= b + 0.05 for a, b in windows):
            since = [(t - e, label) for e, label in events if e <= t]
            where = f"{since[-1][0] * 1000:.0f} ms after {since[-1][1]}" if since else "before the first event"
            print(f"  probe failure outside a window: {where}")
    print(f"probe: {len(probe.samples)} requests, {sum(1 for _, w in probe.samples if w is None)} failed, "
          f"{outside} failed outside the failover windows; holder moves {len(watcher.moves)} for {kills} kills")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min loadavg at the end)")
    print(f"RESULT failover_ms_p50={statistics.median(failovers):.0f} failover_ms_max={max(failovers):.0f} "
          f"failed_requests={failed} flaps={flaps} errors_outside_windows={outside}")


if __name__ == "__main__":
    main()
