from __future__ import annotations

from dataclasses import dataclass

import pytest

from apps.balancers.models import LoadBalancer, Pool, Region
from tests.factories import (
    HostnameClaimFactory,
    IpPoolFactory,
    LoadBalancerFactory,
    PoolFactory,
    RegionFactory,
)


@dataclass
class World:
    us: Region
    eu: Region
    edge: LoadBalancer  # shared, owned by ops
    acme_lb: LoadBalancer  # dedicated, owned by acme
    acme_pool: Pool
    edge_pool: Pool  # acme's pool on the shared LB


@pytest.fixture
def world(acme, globex, ops) -> World:
    us, eu = RegionFactory(slug="us-east"), RegionFactory(slug="eu-west")
    edge = LoadBalancerFactory(name="edge", org=ops, shared=True)
    acme_lb = LoadBalancerFactory(name="acme-lb", org=acme)
    HostnameClaimFactory(org=acme, hostname="acme.example.com")
    HostnameClaimFactory(org=acme, hostname="*.acme.test")
    HostnameClaimFactory(org=globex, hostname="globex.example.com")
    IpPoolFactory(name="ips", cidr="192.0.2.0/28")
    return World(us=us, eu=eu, edge=edge, acme_lb=acme_lb,
                 acme_pool=PoolFactory(lb=acme_lb, org=acme, name="web"),
                 edge_pool=PoolFactory(lb=edge, org=acme, name="acme-edge"))
