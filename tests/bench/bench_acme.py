"""ACME at fleet scale: N hostnames issued by a real ACME CA (pebble) and deployed to 2 regions x 3 nodes.

Each hostname has its own registered domain (so the 50-per-domain budget is not what is measured), its
own approved claim and its own https listener. Every listener starts on an uploaded self-signed
placeholder that the managed certificate then replaces in place. Requests arrive at `--rate` per second
(each certificate marked due, as the API and the renewal sweep do); `--workers` loops stand for Celery
tasks: each takes the due certificates and runs `managed_certificates_issue` on them as one batch
(orders concurrent, HTTP-01 answered by whichever node pebble's DNS names, alternating regions; one
render + hot `set/commit ssl cert` push per fleet; TLS handshake on every node showing each new serial).

issue_deploy_s of a certificate = from its request to its new serial seen by a handshake on every node
and listener using it. `wrk` runs over TLS (keep-alive) against one listener on every node, and a
prober makes new TLS handshakes round 10 listeners x 6 nodes, for the whole run: their errors are
rotation errors. Reloads = rollout node results with a reload time plus nodes whose worker PID changed.

    python tests/bench/bench_acme.py [--hostnames 100] [--nodes 3] [--rate 1] [--workers 1] [--batch 100]

Last line: ``RESULT issue_deploy_s_p50=... issue_deploy_s_p99=... rotation_errors=... reloads=...``.
Goals: p99 <= 10 s per certificate against pebble, 0 handshake or request errors, 0 reloads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fleetbench import DB_URL_BASE, _recreate_database, start_fast_backends  # noqa: E402
from bench_hitless import parse_wrk  # noqa: E402
from bench_propagation import percentile  # noqa: E402

from tests.acme.pebblekit import Pebble  # noqa: E402
from tests.netutil import free_port_on  # noqa: E402


class HandshakeProber(threading.Thread):
    """New TLS handshakes, one after another, round the given (address, port, SNI) targets: a handshake
    that fails while certificates rotate is a rotation error wrk's keep-alive connections would miss."""

    def __init__(self, targets: list[tuple[str, int, str]]) -> None:
        super().__init__(daemon=True)
        self.targets, self.done, self.failed, self.errors = targets, 0, 0, []
        self._stop_event = threading.Event()

    def run(self) -> None:
        from apps.acme.deploy import handshake_serial

        while not self._stop_event.is_set():
            for address, port, name in self.targets:
                try:
                    handshake_serial(address, port, name, timeout_s=5.0)
                except Exception as exc:  # every failure counts, whatever it is
                    self.failed += 1
                    self.errors.append(f"{address}:{port} {exc}")
                self.done += 1
                if self._stop_event.wait(0.02):
                    return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def request_all(managed: list, rate: float, requested: dict[int, float]) -> None:
    """The requests: each certificate marked due (what the API and the renewal sweep do), `rate` per
    second, or all at once."""
    from django.db import connections
    from django.utils import timezone

    from apps.acme.models import ManagedCertificate

    try:
        for group in ([managed] if not rate else [[m] for m in managed]):
            at = time.time()
            ManagedCertificate.objects.filter(pk__in=[m.pk for m in group]).update(next_attempt_at=timezone.now())
            requested.update({m.pk: at for m in group})
            if rate:
                time.sleep(1.0 / rate)
    finally:
        connections.close_all()


def worker(total: int, batch: int, orders: list, steps: dict[str, float]) -> None:
    """What an issuing Celery task does, in a loop: take the due certificates (up to `batch`), order and
    deploy them together. Stops when every certificate has an order."""
    from django.db import connections

    from apps.acme import services

    try:
        while len(orders) < total:
            due = services.due()[:batch]
            mine: dict[str, float] = {}
            done = services.managed_certificates_issue(managed_ids=due, timings=mine) if due else []
            if not done:
                time.sleep(0.05)
                continue
            orders.extend(done)
            for key, value in mine.items():
                steps[key] = steps.get(key, 0.0) + value
            steps["rounds"] = steps.get("rounds", 0) + 1
    finally:
        connections.close_all()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hostnames", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=3, help="nodes per region (2 regions)")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="certificates requested per second (0: all at once)")
    parser.add_argument("--workers", type=int, default=1,
                        help="issuing workers (like Celery's concurrency; more than one wait on each other's "
                             "fleet lease)")
    parser.add_argument("--batch", type=int, default=100, help="most due certificates a worker takes per round")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    base = tempfile.mkdtemp(prefix="spw-bench-acme-", dir="/tmp")
    # several engineers bench on one machine: each may name its own database (BENCH_DATABASE)
    database = os.environ.get("BENCH_DATABASE", "spillway_bench_acme")
    os.environ.update({
        "DATABASE_URL": f"{DB_URL_BASE}/{database}",
        "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8"),
        "SECRET_KEY": "bench-only-secret-key", "FIELD_ENCRYPTION_KEY": "bench-only-field-key",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings", "SPILLWAY_VAR_DIR": f"{base}/var", "LOG_LEVEL": "WARNING",
    })
    _recreate_database(database)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from apps.accounts.models import Organization
    from apps.acme.models import ManagedCertificate
    from apps.balancers.models import HostnameClaim, Listener, LoadBalancer, Member, Pool, PoolRegion, Region
    from apps.core import crypto
    from apps.fleets import services as fleet_services
    from apps.fleets.localnodes import start_local_node, stop_local_node
    from apps.fleets.models import Certificate, Fleet, Node, NodeResult, Rollout
    from tests.fleets.fleetkit import self_signed

    addresses = {"us-east": [f"127.19.1.{i}" for i in range(1, args.nodes + 1)],
                 "eu-west": [f"127.19.2.{i}" for i in range(1, args.nodes + 1)]}
    every = [a for group in addresses.values() for a in group]
    http_port = free_port_on(every)
    pebble = Pebble(http_port=http_port).start()
    masters: list[subprocess.Popen] = []
    procs: list[subprocess.Popen] = []
    try:
        settings.ACME_DIRECTORY_URL, settings.ACME_CA_BUNDLE = pebble.directory_url, pebble.ca_bundle
        backend_proc, ports = start_fast_backends([("web", "127.19.9.1")])
        procs.append(backend_proc)
        ops = Organization.objects.create(slug="ops", name="Ops", kind="operator")
        acme = Organization.objects.create(slug="acme", name="Acme", kind="customer")
        regions = {slug: Region.objects.create(slug=slug, name=slug) for slug in addresses}
        fleets = [Fleet.objects.create(name=f"{slug}-fleet", region=r) for slug, r in regions.items()]
        lb = LoadBalancer.objects.create(org=ops, name="bench", fleet=fleets[0], shared=True)
        fleets[1].serves.add(lb)
        pool = Pool.objects.create(lb=lb, org=ops, name="web", health_path="")
        for region in regions.values():
            PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
        Member.objects.create(pool=pool, region=regions["us-east"], name="web-1", address="127.19.9.1",
                              port=ports[("web", "127.19.9.1")])
        Listener.objects.create(lb=lb, name="http", port=http_port, default_pool=pool)
        names = [f"h{i}.bench{i}.test" for i in range(args.hostnames)]
        taken = {http_port}

        def new_port() -> int:  # nothing binds before the rollout, so the kernel may offer a port twice
            while (port := free_port_on(every)) in taken:
                pass
            taken.add(port)
            return port

        managed = []
        for i, host in enumerate(names):
            HostnameClaim.objects.create(org=acme, hostname=host, status="approved")
            pebble.resolve(host, every[i % len(every)])  # alternate nodes and regions
            cert_pem, key_pem = self_signed(30, host)
            placeholder = Certificate.objects.create(org=acme, name=f"h{i}", cert_pem=cert_pem,
                                                     key_encrypted=crypto.encrypt(key_pem), dns_names=[host])
            Listener.objects.create(lb=lb, name=f"tls{i}", protocol="https", port=new_port(),
                                    default_pool=pool, certificate=placeholder)
            managed.append(ManagedCertificate.objects.create(org=acme, name=f"h{i}", hostnames=[host],
                                                             certificate=placeholder))
        for fleet in fleets:
            for i, address in enumerate(addresses[fleet.region.slug], start=1):
                node = Node.objects.create(fleet=fleet, name=f"n{i}", address=address, bind_address=address,
                                           runtime_dir=f"{base}/{fleet.name}{i}/run",
                                           config_dir=f"{base}/{fleet.name}{i}/etc")
                masters.append(start_local_node(node))
            fleet_services.fleet_reconcile_now(fleet_id=fleet.pk)
        tls = list(Listener.objects.filter(lb=lb, protocol="https").order_by("port"))
        pids_before = dict(Node.objects.values_list("pk", "worker_pid"))
        mark = time.time()
        wrks = [subprocess.Popen([wrk, "-t1", "-c4", "-d3600s", "--timeout", "5s",
                                  f"https://{a}:{tls[0].port}/"], stdout=subprocess.PIPE, text=True)
                for a in every]
        procs.extend(wrks)
        prober = HandshakeProber([(a, ln.port, names[i]) for a in every for i, ln in enumerate(tls[:10])])
        prober.start()
        time.sleep(1.0)
        print(f"{len(names)} hostnames, {len(every)} nodes ({len(tls)} https listeners on each); requests "
              + (f"{args.rate:g}/s" if args.rate else "all at once")
              + f"; {args.workers} workers taking up to {args.batch} due certificates per round; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        steps: dict[str, float] = {}
        requested: dict[int, float] = {}
        orders: list = []
        started = time.monotonic()
        arrivals = threading.Thread(target=request_all, args=(managed, args.rate, requested), daemon=True)
        arrivals.start()
        workers = [threading.Thread(target=worker, args=(len(managed), args.batch, orders, steps), daemon=True)
                   for _ in range(args.workers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(args.timeout)
        total = time.monotonic() - started
        per_cert, failures = [], []
        for order in orders:
            if order.status != "valid" or set(order.deployed.values()) != {"ok"}:
                failures.append(f"{order.managed.name}: {order.error or order.deployed}")
            per_cert.append(order.started_at.timestamp() + order.duration_s - requested[order.managed_id])
        if len(orders) != len(managed):
            failures.append(f"{len(managed) - len(orders)} certificates were not issued within {args.timeout} s")
        time.sleep(1.0)
        prober.stop()
        for proc in wrks:
            proc.send_signal(2)  # SIGINT: wrk prints its report
        requests = errors = 0
        for proc in wrks:
            out, _ = proc.communicate(timeout=30)
            r, socket_errors, non_2xx = parse_wrk(out)
            requests, errors = requests + r, errors + socket_errors + non_2xx
        since = dt.datetime.fromtimestamp(mark, dt.UTC)
        reloads = NodeResult.objects.filter(started_at__gte=since, reload_ms__isnull=False).count()
        pids_after = dict(Node.objects.values_list("pk", "worker_pid"))
        changed_pids = sum(1 for pk, pid in pids_before.items() if pids_after.get(pk) != pid)
        rollouts = Rollout.objects.filter(created_at__gte=since)
        rounds = steps.pop("rounds", 0)
        print(f"issued+deployed {len(per_cert) - len(failures)}/{len(managed)} in {total:.1f} s "
              f"({rounds:.0f} rounds by {args.workers} workers); failures: {failures[:3]}")
        print("where the time goes, mean per round: "
              + ", ".join(f"{k[:-2]} {v / max(rounds, 1):.2f} s" for k, v in steps.items()))
        print(f"rollouts: {rollouts.count()} ({', '.join(sorted({r.fleet.name for r in rollouts}))}); "
              f"reloads {reloads}; worker PIDs changed on {changed_pids}/{len(pids_before)} nodes")
        print(f"issue_deploy_s = per certificate, from its request (marked due, the task takes it) to its new "
              f"serial seen by a TLS handshake on every node ({len(every)}) and https listener that uses it")
        print(f"per certificate: p50 {percentile(per_cert, 50):.2f} s, p99 {percentile(per_cert, 99):.2f} s, "
              f"max {max(per_cert):.2f} s; wrk over TLS (keep-alive): {requests} requests, {errors} errors; "
              f"new TLS handshakes: {prober.done} made, {prober.failed} failed {prober.errors[:2]}; "
              f"load {os.getloadavg()[0]:.1f}")
        rotation_errors = errors + prober.failed + len(failures)
        print(f"RESULT issue_deploy_s_p50={percentile(per_cert, 50):.2f} issue_deploy_s_p99="
              f"{percentile(per_cert, 99):.2f} rotation_errors={rotation_errors} reloads={reloads + changed_pids}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        for master in masters:
            stop_local_node(master)
        pebble.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
