"""VIP failover through the product: 1 region x 3 nodes in network namespaces (tests/netns.py), keepalived VRRPv3.

Everything goes through Spillway as a user would: a fresh database, a real gunicorn serving the API, a real
Celery worker and beat (tests/bench/_fleetbench.py). Each namespace host runs its own sshd, HAProxy,
keepalived and a loopback backend answering with the host's name, as a freshly installed node would (an
empty HAProxy config, keepalived with no instance). Through the API: region, fleet (VRRPv3 adverts), LB,
pool + member, listener, the 3 nodes (SSH transport, pinned host keys, VRRP on eth0), an IP pool; then a
static IP is reserved and attached to the listener. The worker renders, validates, pushes over SSH,
reloads HAProxy and SIGHUPs keepalived; the VIP answers when keepalived on the first node claims it.

- attach_to_serving_ms: from the PATCH that attaches the static IP until the VIP first answers 200
  (worker render -> validate -> SSH push -> reload -> keepalived).
- holder_api_correct: GET /api/v1/listeners/{id}/vip/ names the node the namespaces show holding the VIP,
  after the attach and again after every failover and bring-back (1 only if every read was right).

Load during the failover part: two `wrk` (one with `Connection: close` = a new connection per request, one
keep-alive) against the VIP, plus a probe starting a new connection every 10 ms (not waiting for the
last) that records who answered. Events, in order: kill the holder's HAProxy; bring it back; kill the
new holder's whole namespace; bring it back (x cycles). A watcher reads the holder from the namespaces
every 20 ms.

- failover_ms: from a kill until the first answer from another node arrives (one sample per kill).
- failed_requests: wrk socket errors + non-2xx, both runs (errors are expected inside the windows).
- errors_outside_windows: probe failures outside every [kill, answered-again] window (goal 0).
- flaps: holder changes beyond one per kill (a bring-back must not move the VIP; goal 0).

Then the holder is drained through the API (PATCH /api/v1/nodes/{id}/ drained=true):
- drain_vip_moved_first: 1 when the VIP left the drained node while that node's HAProxy was still
  running (Spillway never stops it: connections it has finish there) and afterwards only the new holder
  answered on the VIP.
- drain_vip_move_ms: from the PATCH until the first answer from another node.
- drain_failed_probes: probe attempts that failed from the PATCH until that answer (a SYN caught by the
  move itself; reported, not hidden, and counted inside the drain's window).

    flock /tmp/spillway-bench.lock env BENCH_REDIS_URL=redis://127.0.0.1:6379/14 \
        python tests/bench/bench_vip_failover.py [--advert-ms 200] [--cycles 2] [--db-name spillway_bench_vip]

Last line: RESULT failover_ms_p50=... failover_ms_max=... failed_requests=... flaps=... attach_to_serving_ms=...
holder_api_correct=... drain_vip_moved_first=...
Goals (issue 15): max <= 2000 ms, p50 <= 1000 ms, errors only inside windows, no more than one move per event.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench._fleetbench import FleetBench, http_get  # noqa: E402

if TYPE_CHECKING:
    from tests import netns

PORT = 80
BACKEND_PORT = 9000  # tests.netns.BACKEND_PORT (netns is imported once Django is set up)
_SOCKET_RE = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON2XX_RE = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_REQUESTS_RE = re.compile(r"(\d+) requests in")


class Probe(threading.Thread):
    """Opens a new connection every `interval_s` WITHOUT waiting for the previous one, each with its own
    1 s budget (as wrk --timeout), and records (started, finished, who answered or None).

    Overlapping attempts matter: a SYN sent to a holder that just vanished is lost and would block a
    one-at-a-time probe for its whole timeout, so the figure would measure the probe, not the failover.
    """

    def __init__(self, vip: str, interval_s: float = 0.01, timeout_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.vip, self.interval_s, self.timeout_s = vip, interval_s, timeout_s
        self.samples: list[tuple[float, float, str | None]] = []
        self.stop = threading.Event()

    async def _one(self) -> None:
        started = time.monotonic()
        who = None
        writer = None
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_connection(self.vip, PORT)
                writer.write(f"GET / HTTP/1.1\r\nHost: {self.vip}\r\nConnection: close\r\n\r\n".encode())
                response = await reader.read()
            head, _, body = response.partition(b"\r\n\r\n")
            who = body.decode() if head.startswith(b"HTTP/1.1 200") else None
        except (OSError, TimeoutError):
            who = None
        finally:
            if writer is not None:
                writer.close()
        self.samples.append((started, time.monotonic(), who))

    async def _run(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        while not self.stop.is_set():
            started = time.monotonic()
            task = asyncio.create_task(self._one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        if pending:
            await asyncio.wait(pending)

    def run(self) -> None:
        asyncio.run(self._run())

    def answered_by_other_after(self, t0: float, old: str, timeout_s: float = 10.0) -> float | None:
        """When the first answer from a node other than `old` arrived, of an attempt started after t0."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = [end for start, end, who in list(self.samples) if start >= t0 and who not in (None, old)]
            if done:
                time.sleep(self.timeout_s)  # attempts started earlier may still answer first
                return min(end for start, end, who in list(self.samples)
                           if start >= t0 and who not in (None, old))
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




def ok(answer: tuple[int, dict], what: str) -> dict:
    status, body = answer
    if status not in (200, 201, 202):
        raise SystemExit(f"{what}: HTTP {status} {body}")
    return body


class Product:
    """The fleet, built and driven through the API only (the namespaces stand in for the machines)."""

    def __init__(self, bench: FleetBench, topo: netns.Topology, advert_ms: int) -> None:
        self.bench, self.topo = bench, topo
        api = bench.api
        ok(api("POST", "/api/v1/regions/", {"slug": "us-east", "name": "US East"}), "region")
        ok(api("POST", "/api/v1/fleets/", {"name": "vip-fleet", "region": "us-east", "vrrp_version": 3,
                                            "vrrp_advert_ms": advert_ms}), "fleet")
        fleet_id = ok(api("GET", "/api/v1/fleets/?name=vip-fleet"), "fleet")["results"][0]["id"]
        self.lb = ok(api("POST", "/api/v1/load-balancers/", {"name": "web", "fleet": fleet_id}), "load balancer")
        pool = ok(api("POST", "/api/v1/pools/", {"lb": self.lb["id"], "name": "www", "health_path": "",
                                                  "regions": [{"region": "us-east"}]}), "pool")
        ok(api("POST", "/api/v1/members/", {"pool": pool["id"], "region": "us-east", "name": "local",
                                             "address": "127.0.0.1", "port": BACKEND_PORT}), "member")
        self.listener = ok(api("POST", "/api/v1/listeners/", {"lb": self.lb["id"], "name": "http", "port": PORT,
                                                               "default_pool": pool["id"]}), "listener")
        self.nodes: dict[str, int] = {}
        for host in topo.hosts:
            node = ok(api("POST", "/api/v1/nodes/", {"fleet": "vip-fleet", "name": host.name,
                                                     "ssh_private_key": topo.client_key,
                                                     **topo.ssh_fields(host)}), f"node {host.name}")
            self.nodes[host.name] = node["id"]
        ok(api("POST", "/api/v1/ip-pools/", {"name": "vips", "cidr": f"{topo.network}.96/27",
                                              "region": "us-east"}), "ip pool")
        self.bench.lb_id = self.lb["id"]
        self.bench.wait_applied(120)  # the first rollout over SSH to the three fresh nodes

    def reserve_and_attach(self, vip: str) -> tuple[float, float]:
        """(monotonic time of the attach call, of the first 200 through the VIP)."""
        ip = ok(self.bench.api("POST", "/api/v1/static-ips/allocate/", {"pool": "vips", "address": vip}), "reserve")
        t0 = time.monotonic()
        ok(self.bench.api("PATCH", f"/api/v1/listeners/{self.listener['id']}/", {"static_ip": ip["id"]}), "attach")
        deadline = t0 + 60
        while time.monotonic() < deadline:
            if http_get(vip, PORT, "/", 0.3)[0] == 200:
                return t0, time.monotonic()
            time.sleep(0.01)
        raise SystemExit(f"{vip} did not answer within 60 s of the attach")

    def api_holders(self) -> list[str]:
        body = ok(self.bench.api("GET", f"/api/v1/listeners/{self.listener['id']}/vip/"), "vip holder")
        return [h["node"] for fleet in body["fleets"] for h in fleet["holders"]]

    def drain(self, node: str) -> None:
        ok(self.bench.api("PATCH", f"/api/v1/nodes/{self.nodes[node]}/", {"drained": True}), f"drain {node}")
class HolderCheck:
    """Compares the API's holder (read by Spillway from the nodes over SSH) with the namespaces' truth."""

    def __init__(self, product: Product, topo: netns.Topology, vip: str) -> None:
        self.product, self.topo, self.vip = product, topo, vip
        self.reads: list[tuple[str, list[str], list[str]]] = []

    def check(self, when: str) -> None:
        deadline = time.monotonic() + 3.0
        while True:  # the namespaces may still be settling (a host just came back)
            truth = self.topo.holders(self.vip)
            if len(truth) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        api = self.product.api_holders()
        self.reads.append((when, api, truth))
        print(f"  holder {when}: API says {api}, namespaces show {truth}")

    @property
    def correct(self) -> bool:
        return bool(self.reads) and all(api == truth and len(truth) == 1 for _, api, truth in self.reads)


def measure_drain(product: Product, topo: netns.Topology, probe: Probe, watcher: Watcher, vip: str) -> dict:
    holder = watcher.current()
    host = next(h for h in topo.hosts if h.name == holder)
    moves_before = len(watcher.moves)
    t0 = time.monotonic()
    product.drain(holder)
    t1 = probe.answered_by_other_after(t0, holder, timeout_s=30.0)
    if t1 is None:
        print(f"drain {holder} through the API: no other node answered within 30 s")
        return {"moved_first": False, "move_ms": None, "window": (t0, time.monotonic())}
    moved_at = watcher.moves[moves_before][0] if len(watcher.moves) > moves_before else None
    # The drained node keeps running its HAProxy (connections it has finish there); only the VIP leaves.
    alive = host.procs.get("haproxy") is not None and host.procs["haproxy"].poll() is None
    time.sleep(2.0)
    failures = [(t, end) for t, end, who in probe.samples if who is None and t0 <= end and t <= t1]
    after = {who for t, end, who in list(probe.samples) if t > t1 + 0.5 and who is not None}
    new_holder = watcher.current()
    moved_first = alive and new_holder not in ("", holder) and after == {new_holder}
    print(f"drain {holder} through the API: VIP answered from {new_holder} after {(t1 - t0) * 1000:.0f} ms "
          f"(namespaces saw the move after {((moved_at or t1) - t0) * 1000:.0f} ms); drained node's HAProxy "
          f"{'still running' if alive else 'NOT running'}; {len(failures)} probe failures in the move; "
          f"answering on the VIP since: {sorted(after)}")
    return {"moved_first": moved_first, "move_ms": (t1 - t0) * 1000, "failures": len(failures), "window": (t0, t1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--advert-ms", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=4.0)
    parser.add_argument("--db-name", default=os.environ.get("BENCH_DB_NAME", "spillway_bench_vip"))
    parser.add_argument("--cpu-hogs", type=int, default=0,
                        help="busy-loop processes (nice 0) during the run, to measure on a loaded box")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("cannot run: network namespaces need root")
    # asyncssh logs every channel of a push at INFO (~200 lines) above the figures.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    bench = FleetBench(args.db_name, topology=False, worker_concurrency=2, beat=True)
    hogs: list[subprocess.Popen[bytes]] = []
    topo = None
    try:
        from tests import netns

        if why := netns.available():
            raise SystemExit(f"cannot run: {why}")
        topo = netns.Topology(prefix="s15b", subnet=20, count=3, base=Path(tempfile.mkdtemp(prefix="s15b-")))
        vip = topo.vip(1)
        # Each hog also ends itself after 10 minutes, so a benchmark that dies leaves none behind.
        hog = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"
        hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(args.cpu_hogs)]
        topo.up()
        t_built = time.monotonic()
        product = Product(bench, topo, args.advert_ms)
        print(f"fleet built through the API and rolled out in {time.monotonic() - t_built:.1f} s")
        t_attach, t_serving = product.reserve_and_attach(vip)
        attach_ms = (t_serving - t_attach) * 1000
        print(f"static IP {vip} attached through the API: answering after {attach_ms:.0f} ms")
        deadline = time.monotonic() + 10
        while len(topo.holders(vip)) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        holders = HolderCheck(product, topo, vip)
        holders.check("after the attach")
        probe, watcher = Probe(vip), Watcher(topo, vip)
        probe.start()
        watcher.start()
        duration = int(args.cycles * (4 * args.settle_s + 10) + 8)
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
                holders.check(f"after killing {holder}'s {kind}")
                time.sleep(args.settle_s)
                events.append((time.monotonic(), f"{holder} back"))
                if kind == "haproxy":
                    topo.start_haproxy(host)
                else:
                    topo.start_host(host)  # same disk: it comes back with its last config
                print(f"  {holder} back; holder now {watcher.current()}")
                time.sleep(args.settle_s)
                holders.check(f"after {holder} came back")
        outputs = [p.communicate(timeout=duration + 30)[0] for p in loads]
        kill_moves = len(watcher.moves)
        drain = measure_drain(product, topo, probe, watcher, vip)
        holders.check("after the drain")
        probe.stop.set()
        watcher.stop.set()
        probe.join(2)
        watcher.join(2)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if topo is not None:
            topo.down()
        bench.close()
    kill_labels = [label for _, label in events if label.startswith("kill")]
    for (a, b), label in zip(windows, kill_labels, strict=True):
        inflight = [(t, end, who) for t, end, who in probe.samples if t <= b and end >= a]
        answered = [end - t for t, end, who in inflight if who is not None]
        print(f"  window of {label}: {len(inflight)} probe attempts in flight, "
              f"{sum(1 for *_, who in inflight if who is None)} failed, slowest answer took "
              f"{max(answered, default=0) * 1000:.0f} ms")
    totals = [wrk_failures(text) for text in outputs]
    for (requests, errors), mode in zip(totals, ("new connection per request", "keep-alive"), strict=True):
        print(f"wrk {mode}: {requests} requests, {errors} failed")
    failed = sum(e for _, e in totals)
    # A failed attempt belongs to a failover when it was in flight at some point of a window (from the
    # kill or drain to the first answer from the new node); any other failure is an error outside them.
    failures = [(t, end) for t, end, who in probe.samples if who is None]
    stray = [t for t, end in failures if not any(t <= b and end >= a for a, b in [*windows, drain["window"]])]
    flaps = max(0, kill_moves - kills)
    for t in stray:
        since = [(t - e, label) for e, label in events if e <= t]
        where = f"{since[-1][0] * 1000:.0f} ms after {since[-1][1]}" if since else "before the first event"
        print(f"  probe failure outside a window: {where}")
    print(f"probe: {len(probe.samples)} requests, {len(failures)} failed, {len(stray)} failed outside the "
          f"failover and drain windows; holder moves {kill_moves} for {kills} kills")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min loadavg at the end); cpu hogs: {args.cpu_hogs}")
    move_ms = f"{drain['move_ms']:.0f}" if drain.get("move_ms") is not None else "none"
    print(f"RESULT failover_ms_p50={statistics.median(failovers):.0f} failover_ms_max={max(failovers):.0f} "
          f"failed_requests={failed} flaps={flaps} attach_to_serving_ms={attach_ms:.0f} "
          f"holder_api_correct={int(holders.correct)} drain_vip_moved_first={int(drain['moved_first'])} "
          f"drain_vip_move_ms={move_ms} drain_failed_probes={drain.get('failures', 'none')} "
          f"errors_outside_windows={len(stray)}")


if __name__ == "__main__":
    main()
