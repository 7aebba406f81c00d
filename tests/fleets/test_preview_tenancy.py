"""A customer's config preview on a shared LB in map form: map lines of other tenants stay hidden."""

from __future__ import annotations

import pytest

from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region, Route, RouteTarget
from apps.fleets import services
from apps.fleets.models import Fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(ops, acme, globex):
    """A shared LB of the operator with one route+pool of acme and one of globex, rendered once."""
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
    services.rollout_create(fleet=fleet, revision=services.fleet_render(fleet=fleet), enqueue=False)
    return {"fleet": fleet, "lb": lb, "pools": pools}


def test_an_operator_any_host_route_to_a_customer_pool_does_not_show_other_tenants_hosts(
    shared, ops, otto, alice
) -> None:
    """GIVEN an operator route with no hosts forwarding to acme's pool (the map layout then lists it
    under every host class, globex's included), WHEN acme previews, THEN acme sees the entries of its
    own hostnames and of the any-host class, never a line naming globex's hostname."""
    route = Route.objects.create(lb=shared["lb"], org=ops, hosts=[], path="/ops-check", priority=50)
    RouteTarget.objects.create(route=route, pool=shared["pools"]["acme"], weight=100)
    acme_pool = shared["pools"]["acme"].pk

    url = f"/api/v1/load-balancers/{shared['lb'].pk}/preview/"
    [operator] = otto.client.post(url).json()["fleets"]
    [customer] = alice.client.post(url).json()["fleets"]

    assert f"+globex.example.com/ops-check p{acme_pool}" in operator["diff"], "the case this test is about"
    assert "globex" not in customer["diff"]
    assert f"+acme.example.com/ops-check p{acme_pool}" in customer["diff"]
    assert f"+*/ops-check p{acme_pool}" in customer["diff"]
    assert customer["hidden_lines"] >= 1
