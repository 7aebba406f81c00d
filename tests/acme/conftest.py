"""One pebble (real ACME CA) per module and a 2-region fleet of real HAProxy nodes per test.

The fleet: LB `edge` of the operator served by fleet `us` (region us-east, nodes 127.18.1.1-2) and
fleet `eu` (region eu-west, node 127.18.2.1), one HTTP listener on the port pebble validates HTTP-01
on (pebble's `httpPort` is fixed at start, so the port is chosen once per module, free on all three
addresses). pebble's DNS answers test hostnames with whichever node address a test names.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from django.db.models import F

from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region
from apps.fleets import services as fleet_services
from apps.fleets.demo.localnodes import start_local_node, stop_local_node
from apps.fleets.models import Fleet, Node
from tests.acme.acmekit import EU_NODES, US_NODES
from tests.acme.pebblekit import Pebble
from tests.netutil import free_port_on


@dataclass
class Ports:
    http: int
    https: int


@pytest.fixture(scope="module")
def ports() -> Ports:
    addresses = US_NODES + EU_NODES
    http = free_port_on(addresses)
    https = free_port_on(addresses)
    return Ports(http, https)


@pytest.fixture(scope="module")
def pebble(ports: Ports) -> Iterator[Pebble]:
    if not shutil.which("pebble") or not shutil.which("pebble-challtestsrv"):
        pytest.skip("pebble is not installed (apt-get install pebble)")
    ca = Pebble(http_port=ports.http).start()
    try:
        yield ca
    finally:
        ca.stop()


@pytest.fixture
def acme_settings(settings, pebble: Pebble):
    settings.ACME_DIRECTORY_URL = pebble.directory_url
    settings.ACME_CA_BUNDLE = pebble.ca_bundle
    settings.ACME_TIMEOUT_S = 30
    return settings


@dataclass
class TwoRegions:
    lb: LoadBalancer
    fleets: list[Fleet]
    http: Listener
    ports: Ports
    base: str
    procs: dict[int, object] = field(default_factory=dict)

    @property
    def nodes(self) -> list[Node]:
        return list(Node.objects.filter(fleet__in=self.fleets).select_related("fleet").order_by("fleet__name", "name"))

    def reconcile(self) -> None:
        for fleet in self.fleets:
            Fleet.objects.filter(pk=fleet.pk).update(change_seq=F("change_seq") + 1)
            fleet_services.fleet_reconcile(fleet_id=fleet.pk)

    def worker_pids(self) -> dict[str, int | None]:
        return {n.name: n.worker_pid for n in self.nodes}


@pytest.fixture
def two_regions(ops, ports: Ports, tiny_backend) -> Iterator[TwoRegions]:
    backend = tiny_backend("web")
    us = Region.objects.create(slug="us-east", name="US East")
    eu = Region.objects.create(slug="eu-west", name="EU West")
    fleet_us = Fleet.objects.create(name="us", region=us)
    fleet_eu = Fleet.objects.create(name="eu", region=eu)
    lb = LoadBalancer.objects.create(org=ops, name="edge", shared=True, fleet=fleet_us)
    fleet_eu.serves.add(lb)
    pool = Pool.objects.create(lb=lb, org=ops, name="web", health_path="")
    for region in (us, eu):
        PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
    Member.objects.create(pool=pool, region=us, name="web-1", address=backend.address, port=backend.port)
    http = Listener.objects.create(lb=lb, name="http", port=ports.http, default_pool=pool)
    base = tempfile.mkdtemp(prefix="spw-acme-", dir="/tmp")
    setup = TwoRegions(lb=lb, fleets=[fleet_us, fleet_eu], http=http, ports=ports, base=base)
    try:
        for fleet, addresses in ((fleet_us, US_NODES), (fleet_eu, EU_NODES)):
            for i, address in enumerate(addresses, start=1):
                node = Node.objects.create(fleet=fleet, name=f"{fleet.name}{i}", address=address,
                                           bind_address=address, runtime_dir=f"{base}/{fleet.name}{i}/run",
                                           config_dir=f"{base}/{fleet.name}{i}/etc")
                setup.procs[node.pk] = start_local_node(node)
        setup.reconcile()
        yield setup
    finally:
        for proc in setup.procs.values():
            with contextlib.suppress(Exception):
                stop_local_node(proc)
        shutil.rmtree(base, ignore_errors=True)
