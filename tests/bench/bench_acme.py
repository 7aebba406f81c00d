"""ACME at fleet scale: N hostnames issued by a real ACME CA (pebble) and deployed to 2 regions x 3 nodes.

Each hostname has its own registered domain (so the 50-per-domain budget is not what is measured), its
own approved claim and its own https listener. Every listener starts on an uploaded self-signed
placeholder that the managed certificate then replaces in place: the measured path is order (HTTP-01
answered by whichever node pebble's DNS names, alternating regions) -> store -> render -> hot
`set/commit ssl cert` on all 6 nodes -> TLS handshake on every node showing the new serial. `wrk` runs
over TLS against one listener on every node for the whole run: its errors are rotation errors. Reloads
are counted from the rollouts' node results (a reload has a reload time) after the listeners exist.

    python tests/bench/bench_acme.py [--hostnames 100] [--nodes 3]

Last line: ``RESULT issue_deploy_s_p50=... issue_deploy_s_p99=... rotation_errors=... reloads=...``.
Goals: p99 <= 10 s per certificate against pebble, 0 handshake or request errors, 0 reloads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hostnames", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=3, help="nodes per region (2 regions)")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    base = tempfile.mkdtemp(prefix="spw-bench-acme-", dir="/tmp")
    os.environ.update({
        "DATABASE_URL": f"{DB_URL_BASE}/spillway_bench_acme",
        "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8"),
        "SECRET_KEY": "bench-only-secret-key", "FIELD_ENCRYPTION_KEY": "bench-only-field-key",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings", "SPILLWAY_VAR_DIR": f"{base}/var", "LOG_LEVEL": "WARNING",
    })
    _recreate_database("spillway_bench_acme")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from apps.accounts.models import Organization
    from apps.acme import services
    from apps.acme.models import ManagedCertificate
    from apps.balancers.models import HostnameClaim, Listener, LoadBalancer, Member, Pool, PoolRegion, Region
    from apps.core import crypto
    from apps.fleets import services as fleet_services
    from apps.fleets.localnodes import start_local_node, stop_local_node
    from apps.fleets.models import Certificate, Fleet, Node, NodeResult
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
        first_tls = Listener.objects.get(lb=lb, name="tls0")
        mark = time.time()
        wrks = [subprocess.Popen([wrk, "-t1", "-c4", "-d3600s", "--timeout", "5s",
                                  f"https://{a}:{first_tls.port}/"], stdout=subprocess.PIPE, text=True)
                for a in every]
        procs.extend(wrks)
        durations, failures = [], []
        print(f"{len(names)} hostnames, {len(every)} nodes, load {os.getloadavg()[0]:.1f}", flush=True)
        for m in managed:
            started = time.monotonic()
            order = services.managed_certificate_issue(managed_id=m.pk, force=True)
            took = time.monotonic() - started
            if order is None or order.status != "valid" or set(order.deployed.values()) != {"ok"}:
                failures.append(f"{m.name}: {order and (order.error or order.deployed)}")
            durations.append(took)
        for proc in wrks:
            proc.send_signal(2)  # SIGINT: wrk prints its report
        requests = errors = 0
        for proc in wrks:
            out, _ = proc.communicate(timeout=30)
            r, socket_errors, non_2xx = parse_wrk(out)
            requests, errors = requests + r, errors + socket_errors + non_2xx
        import datetime as dt

        since = dt.datetime.fromtimestamp(mark, dt.UTC)
        reloads = NodeResult.objects.filter(started_at__gte=since, reload_ms__isnull=False).count()
        print(f"issued+deployed {len(durations) - len(failures)}/{len(durations)}; failures: {failures[:3]}")
        print(f"per certificate (order -> all {len(every)} nodes serve it, by handshake): "
              f"p50 {percentile(durations, 50):.2f} s, p99 {percentile(durations, 99):.2f} s, "
              f"max {max(durations):.2f} s; wrk over TLS: {requests} requests, {errors} errors; load "
              f"{os.getloadavg()[0]:.1f}")
        print(f"RESULT issue_deploy_s_p50={percentile(durations, 50):.2f} issue_deploy_s_p99="
              f"{percentile(durations, 99):.2f} rotation_errors={errors + len(failures)} reloads={reloads}")
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
