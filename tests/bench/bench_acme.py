"""ACME at fleet scale, through the product: N hostnames issued by a real ACME CA (pebble) through the API
and a real Celery worker, deployed to 2 regions x 3 nodes, then rotated ("renew now") under load.

A fresh database, a real gunicorn serving the API and a real Celery worker (FleetBench). The tenant
`acme` asks for its hostname claims through the API and the operator approves them through the API;
the tenant uploads a self-signed placeholder certificate per hostname (POST /certificates/), which an
https listener per hostname serves on every node (the topology itself -- regions, fleets, nodes, LB,
listeners -- is written to the database as in the other fleet benches). Then, `--rate` per second,
the tenant asks for a managed certificate taking that placeholder over
(POST /managed-certificates/ {"certificate": id}); the API queues the worker's task, which orders it
from pebble (HTTP-01 answered by whichever node pebble's DNS names, alternating regions), stores it in
place and pushes it with `set/commit ssl cert`. Once all are served, every one is renewed the same
way (POST /managed-certificates/<id>/renew/).

issue_deploy_s of a certificate = from the client sending its API request to a TLS handshake on every
node (this bench's own handshakes, not the product's) showing a serial other than the one served
before; rotate_s the same for "renew now". `wrk` runs over TLS (keep-alive) against one listener on
every node, and a prober makes new TLS handshakes round 10 listeners x 6 nodes, for both phases: their
errors, and certificates not served in time, are rotation errors. Reloads = rollout node results with
a reload time plus nodes whose worker PID changed.

    python tests/bench/bench_acme.py [--hostnames 100] [--nodes 3] [--rate 1] [--concurrency 2]

Last line: ``RESULT issue_deploy_s_p50=... issue_deploy_s_p99=... rotation_errors=... reloads=...
rotate_s_p50=... rotate_s_p99=...``. Goals: p99 <= 10 s per certificate against pebble, 0 handshake or
request errors, 0 reloads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fleetbench import FleetBench, start_fast_backends  # noqa: E402
from bench_hitless import parse_wrk  # noqa: E402
from bench_propagation import percentile  # noqa: E402

from tests.acme.pebblekit import Pebble  # noqa: E402
from tests.netutil import free_port_on  # noqa: E402


def served_serial(address: str, port: int, server_name: str, timeout_s: float = 5.0) -> int:
    """The serial of the leaf a node presents for `server_name` (a new TLS connection each time)."""
    from cryptography import x509

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((address, port), timeout=timeout_s) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


class HandshakeProber(threading.Thread):
    """New TLS handshakes, one after another, round the given (address, port, SNI) targets: a handshake
    that fails while certificates rotate is a rotation error wrk's keep-alive connections would miss."""

    def __init__(self, targets: list[tuple[str, int, str]]) -> None:
        super().__init__(daemon=True)
        self.targets, self.done, self.failed, self.errors = targets, 0, 0, []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            for address, port, name in self.targets:
                try:
                    served_serial(address, port, name)
                except Exception as exc:  # every failure counts, whatever it is
                    self.failed += 1
                    self.errors.append(f"{address}:{port} {exc}")
                self.done += 1
                if self._stop_event.wait(0.02):
                    return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


class ServedWatch(threading.Thread):
    """When each requested certificate is served by every node: for every pending (listener port, SNI),
    a handshake per node not yet showing a serial other than the one it served before the request."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[int, str, float, int]] = {}  # key -> (port, sni, requested at, old serial)
        self.seen: dict[int, dict[str, tuple[float, int]]] = {}
        self.took: dict[int, float] = {}  # key -> seconds from request to served everywhere
        self.serial: dict[int, int] = {}
        self.failed, self.errors = 0, []
        self._stop_event = threading.Event()

    def expect(self, key: int, port: int, server_name: str, requested_at: float, old_serial: int) -> None:
        with self.lock:
            self.pending[key] = (port, server_name, requested_at, old_serial)
            self.seen[key] = {}

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=len(self.addresses)) as pool:
            while not self._stop_event.is_set():
                with self.lock:
                    probes = [(key, address) for key in self.pending for address in self.addresses
                              if address not in self.seen[key]]
                if not probes:
                    self._stop_event.wait(0.05)
                    continue
                list(pool.map(self._probe, probes))
                with self.lock:
                    for key in [k for k in self.pending if len(self.seen[k]) == len(self.addresses)]:
                        _, _, requested_at, _ = self.pending.pop(key)
                        self.took[key] = max(at for at, _ in self.seen[key].values()) - requested_at
                        serials = {serial for _, serial in self.seen[key].values()}
                        self.serial[key] = serials.pop() if len(serials) == 1 else -1  # -1: nodes disagree
                # A TLS handshake costs CPU on both ends: a sweep every 0.25 s (what it adds to a
                # certificate's time is counted against the product, not for it).
                self._stop_event.wait(0.25)

    def _probe(self, item: tuple[int, str]) -> None:
        key, address = item
        wanted = self.pending.get(key)
        if wanted is None:  # given up on meanwhile
            return
        port, name, _, old = wanted
        try:
            serial = served_serial(address, port, name)
        except Exception as exc:  # every failure counts, whatever it is
            self.failed += 1
            self.errors.append(f"{address}:{port} {exc}")
            return
        if serial != old:
            self.seen[key][address] = (time.time(), serial)

    def wait_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


STEP_ORDER = ["queued_s", "order_s", "publish_s", "authorize_s", "finalize_s", "store_s", "roll_out_s", "verify_s"]


def pct(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def paced(count: int, rate: float):  # type: ignore[no-untyped-def]
    """0..count-1, the i-th not before i / rate seconds from the start (all at once with rate 0)."""
    start = time.monotonic()
    for i in range(count):
        if rate:
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
        yield i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hostnames", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=3, help="nodes per region (2 regions)")
    parser.add_argument("--rate", type=float, default=1.0, help="API requests per second (0: all at once)")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="the main Celery worker's --concurrency (the acme worker has one slot)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per phase, after its last request")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    addresses = {"us-east": [f"127.19.1.{i}" for i in range(1, args.nodes + 1)],
                 "eu-west": [f"127.19.2.{i}" for i in range(1, args.nodes + 1)]}
    every = [a for group in addresses.values() for a in group]
    # pebble validates HTTP-01 on one port fixed at its start: the HTTP listener's
    http_port = free_port_on(every)
    pebble = Pebble(http_port=http_port).start()
    # the worker reads its CA from the environment like in production (FleetBench passes it on)
    os.environ.update({"ACME_DIRECTORY_URL": pebble.directory_url, "ACME_CA_BUNDLE": pebble.ca_bundle,
                       "ACME_TIMEOUT_S": "60"})
    bench: FleetBench | None = None
    procs: list[subprocess.Popen] = []
    try:
        bench = FleetBench(os.environ.get("BENCH_DATABASE", "spillway_bench_acme"), nodes_per_region=args.nodes,
                           worker_concurrency=args.concurrency, topology=False)
        run(bench, args, pebble, addresses, http_port, wrk, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if bench is not None:
            bench.close()
        pebble.stop()


def setup(bench: FleetBench, args: argparse.Namespace, pebble: Pebble, addresses: dict[str, list[str]],
          http_port: int) -> tuple[str, list[str], list[int], list]:
    """The tenant, its claims (approved through the API), its placeholder certificates (uploaded through
    the API), and the fleets serving them. Returns (tenant token, hostnames, certificate ids, listeners)."""
    from apps.accounts.models import Organization, Role
    from apps.accounts.services import token_create, user_create_with_membership
    from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region
    from apps.fleets import services as fleet_services
    from apps.fleets.models import Fleet, Node
    from tests.fleets.fleetkit import self_signed

    every = [a for group in addresses.values() for a in group]
    acme = Organization.objects.create(slug="acme", name="Acme", kind="customer")
    user_create_with_membership(username="acme-admin", password="bench-password-123", org=acme, role=Role.ADMIN)
    tenant = token_create(org=acme, name="acme", scopes=["read", "write", "deploy"]).secret
    names = [f"h{i}.bench{i}.test" for i in range(args.hostnames)]
    cert_ids = []
    for i, host in enumerate(names):
        status, claim = bench.api("POST", "/api/v1/hostname-claims/", {"hostname": host}, token=tenant)
        if status != 201 or claim["status"] != "pending":
            raise RuntimeError(f"claim {host}: {status} {claim}")
        status, body = bench.api("POST", f"/api/v1/hostname-claims/{claim['id']}/approve/")  # the operator
        if status != 200 or body["status"] != "approved":
            raise RuntimeError(f"approve {host}: {status} {body}")
        cert_pem, key_pem = self_signed(30, host)
        status, body = bench.api("POST", "/api/v1/certificates/",
                                 {"name": f"h{i}", "cert_pem": cert_pem, "key_pem": key_pem}, token=tenant)
        if status != 201:
            raise RuntimeError(f"upload h{i}: {status} {body}")
        cert_ids.append(body["id"])
        pebble.resolve(host, every[i % len(every)])  # alternate nodes and regions
    backend_host = "127.19.9.1"
    backend_proc, ports = start_fast_backends([("web", backend_host)])
    bench.procs.append(backend_proc)
    regions = {slug: Region.objects.create(slug=slug, name=slug) for slug in addresses}
    fleets = [Fleet.objects.create(name=f"{slug}-fleet", region=r) for slug, r in regions.items()]
    for fleet in fleets:
        for i, address in enumerate(addresses[fleet.region.slug], start=1):
            node = Node.objects.create(fleet=fleet, name=f"n{i}", address=address, bind_address=address,
                                       runtime_dir=f"{bench.base}/{fleet.name}{i}/run",
                                       config_dir=f"{bench.base}/{fleet.name}{i}/etc")
            bench.start_node(node.pk)
    lb = LoadBalancer.objects.create(org=acme, name="shop", fleet=fleets[0])
    fleets[1].serves.add(lb)
    pool = Pool.objects.create(lb=lb, org=acme, name="web", health_path="")
    for region in regions.values():
        PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
    Member.objects.create(pool=pool, region=regions["us-east"], name="web-1", address=backend_host,
                          port=ports[("web", backend_host)])
    Listener.objects.create(lb=lb, name="http", port=http_port, default_pool=pool)
    taken = {http_port}
    listeners = []
    for i, cert_id in enumerate(cert_ids):
        while (port := free_port_on(every)) in taken:  # nothing binds before the rollout: no repeats
            pass
        taken.add(port)
        listeners.append(Listener.objects.create(lb=lb, name=f"tls{i}", protocol="https", port=port,
                                                 default_pool=pool, certificate_id=cert_id))
    for fleet in fleets:
        fleet_services.fleet_reconcile_now(fleet_id=fleet.pk)
    bench.fleets, bench.lb_id = fleets, lb.pk
    return tenant, names, cert_ids, listeners


def run(bench: FleetBench, args: argparse.Namespace, pebble: Pebble, addresses: dict[str, list[str]],
        http_port: int, wrk: str, procs: list[subprocess.Popen]) -> None:
    from cryptography import x509

    from apps.acme.models import AcmeOrder
    from apps.fleets.models import Node, NodeResult, Rollout

    every = [a for group in addresses.values() for a in group]
    tenant, names, cert_ids, listeners = setup(bench, args, pebble, addresses, http_port)
    placeholder = {i: served_serial(every[0], ln.port, names[i]) for i, ln in enumerate(listeners)}
    pids_before = dict(Node.objects.values_list("pk", "worker_pid"))
    mark = time.time()
    wrks = [subprocess.Popen([wrk, "-t1", "-c4", "-d3600s", "--timeout", "5s",
                              f"https://{a}:{listeners[0].port}/"], stdout=subprocess.PIPE, text=True)
            for a in every]
    procs.extend(wrks)
    prober = HandshakeProber([(a, ln.port, names[i]) for a in every for i, ln in enumerate(listeners[:10])])
    prober.start()
    watch = ServedWatch(every)
    watch.start()
    time.sleep(1.0)
    print(f"{len(names)} hostnames (claims approved and placeholders uploaded through the API), {len(every)} "
          f"nodes ({len(listeners)} https listeners on each); API requests "
          + (f"{args.rate:g}/s" if args.rate else "all at once")
          + f"; Celery workers: celery and fleets {args.concurrency} each, acme 1; load {os.getloadavg()[0]:.1f}",
          flush=True)
    api_errors: list[str] = []
    managed_ids: dict[int, int] = {}
    phases: dict[str, list[float]] = {}
    requested: dict[str, dict[int, float]] = {"issue": {}, "rotate": {}}
    for phase in ("issue", "rotate"):
        old = placeholder if phase == "issue" else dict(watch.serial)
        watch.took.clear()
        started = time.monotonic()
        for i in paced(len(names), args.rate):
            at = requested[phase][i] = time.time()
            watch.expect(i, listeners[i].port, names[i], at, old.get(i, placeholder[i]))
            if phase == "issue":
                status, body = bench.api("POST", "/api/v1/managed-certificates/",
                                         {"name": f"h{i}", "hostnames": [names[i]], "certificate": cert_ids[i]},
                                         token=tenant)
                ok = status == 201
                if ok:
                    managed_ids[i] = body["id"]
            else:
                status, body = bench.api("POST", f"/api/v1/managed-certificates/{managed_ids[i]}/renew/",
                                         token=tenant)
                ok = status == 202
            if not ok:
                api_errors.append(f"{phase} h{i}: {status} {body}")
        watch.wait_all(args.timeout)
        phases[phase] = [watch.took[i] for i in sorted(watch.took)]
        missing = len(names) - len(watch.took)
        print(f"{phase}: {len(watch.took)}/{len(names)} served by every node in {time.monotonic() - started:.1f} s"
              + (f" ({missing} not within {args.timeout:.0f} s)" if missing else "")
              + f"; p50 {pct(phases[phase], 50):.2f} s, p99 {pct(phases[phase], 99):.2f} s, "
              f"max {max(phases[phase], default=0):.2f} s; load {os.getloadavg()[0]:.1f}", flush=True)
        with watch.lock:
            watch.pending.clear()  # not served in time: counted below, not watched any more
    time.sleep(1.0)
    prober.stop()
    watch.stop()
    for proc in wrks:
        proc.send_signal(2)  # SIGINT: wrk prints its report
    requests = errors = 0
    for proc in wrks:
        out, _ = proc.communicate(timeout=30)
        r, socket_errors, non_2xx = parse_wrk(out)
        requests, errors = requests + r, errors + socket_errors + non_2xx
    # What the nodes served must be what the API says each managed certificate is now.
    wrong = []
    for i, managed_id in managed_ids.items():
        _, managed = bench.api("GET", f"/api/v1/managed-certificates/{managed_id}/", token=tenant)
        _, cert = bench.api("GET", f"/api/v1/certificates/{managed['certificate']}/", token=tenant)
        serial = x509.load_pem_x509_certificate(cert["cert_pem"].encode()).serial_number
        if managed["status"] != "valid" or watch.serial.get(i) != serial:
            wrong.append(f"h{i}: {managed['status']} {managed['last_error']!r} served {watch.serial.get(i)} "
                         f"API {serial}")
    since = dt.datetime.fromtimestamp(mark, dt.UTC)
    reloads = NodeResult.objects.filter(started_at__gte=since, reload_ms__isnull=False).count()
    pids_after = dict(Node.objects.values_list("pk", "worker_pid"))
    changed_pids = sum(1 for pk, pid in pids_before.items() if pids_after.get(pk) != pid)
    rollouts = Rollout.objects.filter(created_at__gte=since)
    orders = AcmeOrder.objects.all()
    batches = len({o.started_at.replace(microsecond=0) for o in orders})
    # Where a certificate's time goes: queued (API request to its order's claim by a task) and the
    # order itself (claim to the product's own handshake proof on every node).
    by_managed: dict[int, list] = {}
    for order in orders.order_by("started_at"):
        by_managed.setdefault(order.managed_id, []).append(order)
    for n, phase in enumerate(("issue", "rotate")):
        queued, took = [], []
        steps: dict[str, list[float]] = {}
        for i, managed_id in managed_ids.items():
            mine = by_managed.get(managed_id, [])
            if len(mine) > n and i in requested[phase]:
                queued.append(mine[n].started_at.timestamp() - requested[phase][i])
                took.append(mine[n].duration_s or 0.0)
                for name, value in (mine[n].steps or {}).items():
                    steps.setdefault(name, []).append(value)
        print(f"{phase}: queued p50 {pct(queued, 50):.2f} s p99 {pct(queued, 99):.2f} s; order (claim to the "
              f"product's handshake proof) p50 {pct(took, 50):.2f} s p99 {pct(took, 99):.2f} s")
        # The order's own steps (AcmeOrder.steps): where a certificate's time goes, p50/p99 in seconds.
        print(f"{phase} steps p50/p99 s: " + ", ".join(
            f"{name.removesuffix('_s')} {pct(values, 50):.2f}/{pct(values, 99):.2f}"
            for name, values in sorted(steps.items(), key=lambda kv: STEP_ORDER.index(kv[0])
                                       if kv[0] in STEP_ORDER else len(STEP_ORDER))))
    print(f"orders: {orders.count()} ({orders.filter(status='valid').count()} valid, "
          f"{orders.filter(status='failed').count()} failed) in about {batches} batches; rollouts: "
          f"{rollouts.count()}; reloads {reloads}; worker PIDs changed on {changed_pids}/{len(pids_before)} nodes")
    print(f"API errors: {len(api_errors)} {api_errors[:3]}; certificates not valid or served differently from "
          f"the API: {len(wrong)} {wrong[:3]}")
    print(f"wrk over TLS (keep-alive): {requests} requests, {errors} errors; new TLS handshakes: prober "
          f"{prober.done} made, {prober.failed} failed {prober.errors[:2]}; watcher {watch.failed} failed "
          f"{watch.errors[:2]}; load {os.getloadavg()[0]:.1f}")
    not_served = sum(len(names) - len(v) for v in phases.values())
    rotation_errors = errors + prober.failed + watch.failed + not_served + len(api_errors) + len(wrong)
    issue, rotate = phases["issue"], phases["rotate"]
    print(f"RESULT issue_deploy_s_p50={pct(issue, 50):.2f} issue_deploy_s_p99={pct(issue, 99):.2f} "
          f"rotation_errors={rotation_errors} reloads={reloads + changed_pids} "
          f"rotate_s_p50={pct(rotate, 50):.2f} rotate_s_p99={pct(rotate, 99):.2f}")


if __name__ == "__main__":
    main()
