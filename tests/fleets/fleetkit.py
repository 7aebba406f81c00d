"""Helpers for fleet service tests: a database fleet whose nodes are real local HAProxy masters.

Nodes listen on their own loopback address (127.0.<n>.<i>) so several share one port, as
production nodes share a static IP's port. Runtime directories live under a short /tmp path:
unix socket paths are limited to 107 bytes and pytest's tmp_path can be longer than that allows.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db.models import F

from apps.accounts.models import Organization
from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region, Route, RouteTarget
from apps.fleets import selectors, services
from apps.fleets.config.render import render
from apps.fleets.demo.localnodes import start_local_node, stop_local_node
from apps.fleets.models import Fleet, Node, Rollout
from apps.fleets.node.runtime_api import HAProxySocket, MasterSocket
from tests.netutil import free_port_on, http_get

if TYPE_CHECKING:
    from tests.haproxykit import TinyBackend
@dataclass
class LocalFleet:
    fleet: Fleet
    lb: LoadBalancer
    listener: Listener
    port: int
    base: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[Node]:
        return list(Node.objects.filter(fleet=self.fleet).order_by("name"))

    def start(self, node: Node) -> None:
        self.procs[node.name] = start_local_node(node)

    def kill(self, node: Node) -> None:
        """Stop a node's HAProxy (the "node died" case); its files stay on disk."""
        proc = self.procs.pop(node.name)
        stop_local_node(proc)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                stop_local_node(proc)
        self.procs.clear()
        shutil.rmtree(self.base, ignore_errors=True)

    def get(self, node: Node, path: str = "/", host: str | None = None) -> tuple[int, str]:
        headers = {"Host": host} if host else None
        try:
            return http_get(f"http://{node.bind_address}:{self.port}{path}", timeout_s=2.0, headers=headers)
        except OSError as exc:
            return (0, f"error: {exc}")

    def bodies(self, path: str = "/") -> dict[str, str]:
        return {n.name: self.get(n, path)[1] for n in self.nodes}


def make_local_fleet(
    *, name: str, subnet: int, node_count: int, backend_address: tuple[str, int], region: str = "us-east"
) -> LocalFleet:
    """A fleet of `node_count` local nodes on 127.0.<subnet>.1.., serving LB `name` whose default pool
    has one member at `backend_address`. Nodes are started (on an empty config), not rolled out."""
    ops, _ = Organization.objects.get_or_create(slug="ops", defaults={"name": "Ops", "kind": "operator"})
    reg, _ = Region.objects.get_or_create(slug=region, defaults={"name": region})
    fleet = Fleet.objects.create(name=f"{name}-fleet", region=reg)
    lb = LoadBalancer.objects.create(org=ops, name=name, fleet=fleet)
    pool = Pool.objects.create(lb=lb, org=ops, name="old", health_path="")
    PoolRegion.objects.create(pool=pool, region=reg, max_rate_per_member=None)
    Member.objects.create(pool=pool, region=reg, name="old-1", address=backend_address[0], port=backend_address[1])
    addresses = [f"127.0.{subnet}.{i}" for i in range(1, node_count + 1)]
    port = free_port_on(addresses)
    listener = Listener.objects.create(lb=lb, name="http", port=port, default_pool=pool)
    base = tempfile.mkdtemp(prefix="spw-", dir="/tmp")
    local = LocalFleet(fleet=fleet, lb=lb, listener=listener, port=port, base=base)
    try:
        for i, address in enumerate(addresses, start=1):
            node = Node.objects.create(
                fleet=fleet, name=f"n{i}", address=address, bind_address=address,
                runtime_dir=f"{base}/n{i}/run", config_dir=f"{base}/n{i}/etc",
            )
            local.start(node)
    except BaseException:
        local.stop_all()
        raise
    return local


@contextlib.contextmanager
def serving_local_fleet(backend: TinyBackend, *, name: str, subnet: int, node_count: int) -> Iterator[LocalFleet]:
    """make_local_fleet whose default pool's member is `backend`, stopped on the way out (a fixture's body)."""
    local = make_local_fleet(name=name, subnet=subnet, node_count=node_count,
                             backend_address=(backend.address, backend.port))
    try:
        yield local
    finally:
        local.stop_all()


def add_pool(lb: LoadBalancer, name: str, backend_address: tuple[str, int], region: str = "us-east") -> Pool:
    reg = Region.objects.get(slug=region)
    pool = Pool.objects.create(lb=lb, org=lb.org, name=name, health_path="")
    PoolRegion.objects.create(pool=pool, region=reg, max_rate_per_member=None)
    Member.objects.create(pool=pool, region=reg, name=f"{name}-1", address=backend_address[0],
                          port=backend_address[1])
    return pool


def add_route(lb: LoadBalancer, pool: Pool, path: str, priority: int, hosts: list[str] | None = None) -> Route:
    route = Route.objects.create(lb=lb, org=lb.org, path=path, priority=priority, hosts=hosts or [])
    RouteTarget.objects.create(route=route, pool=pool, weight=100)
    return route


def changed(fleet: Fleet) -> None:
    """What balancers' lb_changed does through the receiver, minus the Celery hop."""
    Fleet.objects.filter(pk=fleet.pk).update(change_seq=F("change_seq") + 1)


def reconcile(fleet: Fleet) -> dict:
    changed(fleet)
    return services.fleet_reconcile(fleet_id=fleet.pk)


def workers(local: LocalFleet) -> dict[str, int]:
    return {n.name: MasterSocket(f"{n.runtime_dir}/master.sock").show_proc().current_worker.pid
            for n in local.nodes}


def live_maps_equal_a_full_render(local: LocalFleet) -> dict[str, list[tuple[str, str]]]:
    """Assert every node's live maps are the full render's entries for the revision it recorded;
    returns the first node's live maps in HAProxy's order."""
    first: dict[str, list[tuple[str, str]]] = {}
    for node in Node.objects.filter(fleet=local.fleet).select_related("applied_revision").order_by("name"):
        bundle = render(selectors.revision_snapshot(node.applied_revision), selectors.node_spec(node))
        stats = HAProxySocket(f"{node.runtime_dir}/stats.sock")
        for name, entries in bundle.rendered_manifest.maps.items():
            live = stats.show_map(name)
            assert sorted(live) == sorted(entries), f"{node.name} {name}"
            first.setdefault(name, live)
    return first


def rolled_out(local: LocalFleet) -> Rollout:
    rollout = Rollout.objects.get(pk=reconcile(local.fleet)["rollouts"][-1])
    assert rollout.status == Rollout.Status.SUCCEEDED, rollout.error
    return rollout


def self_signed(days: int, name: str = "shop.acme.example") -> tuple[str, str]:
    """(certificate PEM, unencrypted PKCS#8 key PEM) of a fresh self-signed EC certificate."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem
