"""Small worlds of regions, LBs and pools that tests of several apps share (a plugin of the whole suite: tests ask
for `world` or `two_regions` by name; a closer conftest's fixture of the same name wins there, as capacity's
`world` and acme's `two_regions` do).

`world`: two regions, the operator's shared LB `edge`, acme's dedicated LB, hostname claims and an IP pool
(balancers, accounts). `two_regions`: acme's pool over two regions 20 ms apart (traffic, capacity drills).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from apps.balancers.models import LoadBalancer, Pool, Region, RegionDistance
from tests.factories import (
    HostnameClaimFactory,
    IpPoolFactory,
    LoadBalancerFactory,
    MemberFactory,
    PoolFactory,
    PoolRegionFactory,
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


@dataclass
class TwoRegions:
    a: Region
    b: Region
    lb: LoadBalancer
    pool: Pool  # acme's: region a 2 members x 10 req/s, region b 2 members x 20 req/s, 20 ms apart


@pytest.fixture
def two_regions(acme) -> TwoRegions:
    a, b = RegionFactory(slug="ra"), RegionFactory(slug="rb")
    RegionDistance.objects.create(src=a, dst=b, rtt_ms=20.0)
    lb = LoadBalancerFactory(name="acme-edge", org=acme)
    pool = PoolFactory(lb=lb, org=acme, name="web", health_path="")
    PoolRegionFactory(pool=pool, region=a, max_rate_per_member=10)
    PoolRegionFactory(pool=pool, region=b, max_rate_per_member=20)
    for region, names in ((a, ("a1", "a2")), (b, ("b1", "b2"))):
        for name in names:
            MemberFactory(pool=pool, region=region, name=name)
    forget_pool_state(pool.pk)
    return TwoRegions(a=a, b=b, lb=lb, pool=pool)


def forget_pool_state(pool_id: int) -> None:
    """Pool ids repeat across tests in one database; what an earlier test left in the cache for the same id (a
    capacity test's overflow hold, a steering decision, a drill's drain) must not steer this one's traffic."""
    from django.core.cache import cache

    from apps.fleets.enforcement import _HOLD_KEY
    from apps.traffic.selectors import DECISION_KEY, DRILL_KEY

    cache.delete_many([key.format(pool_id) for key in (_HOLD_KEY, DECISION_KEY, DRILL_KEY)])
