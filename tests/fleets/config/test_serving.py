"""The what-if of serving a load balancer from one more fleet, or one less, in words per pool."""

from __future__ import annotations

import pytest

from apps.balancers.models import RegionDistance
from apps.fleets.config.serving import what_if
from apps.fleets.models import Fleet
from tests.factories import LoadBalancerFactory, MemberFactory, PoolFactory, PoolRegionFactory, RegionFactory

pytestmark = pytest.mark.django_db


def test_the_what_if_says_where_each_pools_requests_go(ops):
    us, eu, ap = RegionFactory(slug="us-east"), RegionFactory(slug="eu-west"), RegionFactory(slug="ap-south")
    RegionDistance.objects.create(src=eu, dst=us, rtt_ms=80)
    RegionDistance.objects.create(src=eu, dst=ap, rtt_ms=140)
    us_fleet = Fleet.objects.create(name="us", region=us)
    eu_fleet = Fleet.objects.create(name="eu", region=eu)
    lb = LoadBalancerFactory(org=ops, name="web", fleet=us_fleet)
    capped = PoolFactory(lb=lb, org=ops, name="api")
    for region in (us, ap):
        PoolRegionFactory(pool=capped, region=region, max_rate_per_member=50)
        MemberFactory(pool=capped, region=region)
    local = PoolFactory(lb=lb, org=ops, name="static")
    PoolRegionFactory(pool=local, region=eu, max_rate_per_member=40)
    MemberFactory(pool=local, region=eu)
    PoolRegionFactory(pool=local, region=us, max_rate_per_member=40)
    MemberFactory(pool=local, region=us)

    adding = what_if(lb, eu_fleet, serve=True)
    assert adding[0].startswith("Requests that reach eu's nodes in eu-west")
    assert "Pool api: no members in eu-west; its requests entering there go to us-east (80 ms away)." in adding
    assert "Pool static: served in eu-west by its own members up to 40 req/s, then overflows to us-east " \
           "(80 ms away)." in adding
    assert what_if(lb, us_fleet, serve=False) == [
        "Nothing would serve web any more: us is the only fleet serving it."]
