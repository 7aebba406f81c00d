"""Fixtures of the fleet tests only (the real-process ones are tests/haproxykit.py's, for the whole suite)."""

from __future__ import annotations

import pytest


@pytest.fixture
def shared(ops, acme, globex) -> dict:
    """A shared LB of the operator with one route+pool of acme and one of globex, on fleet `edge`."""
    from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region, Route, RouteTarget
    from apps.fleets.models import Fleet

    region = Region.objects.create(slug="us-east", name="US East")
    fleet = Fleet.objects.create(name="edge", region=region)
    lb = LoadBalancer.objects.create(org=ops, name="edge", shared=True, fleet=fleet)
    pools = {}
    for n, org in enumerate((acme, globex), start=1):
        pool = Pool.objects.create(lb=lb, org=org, name=f"{org.slug}-web")
        PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
        Member.objects.create(pool=pool, region=region, name="m1", address=f"127.0.20.{n}", port=9100)
        route = Route.objects.create(lb=lb, org=org, hosts=[f"{org.slug}.example.com"], path="/", priority=n * 100)
        RouteTarget.objects.create(route=route, pool=pool, weight=100)
        pools[org.slug] = pool
    Listener.objects.create(lb=lb, name="http", port=18080)
    return {"fleet": fleet, "lb": lb, "pools": pools, "region": region}
