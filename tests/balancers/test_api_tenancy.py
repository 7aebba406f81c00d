"""Every balancers endpoint keeps the tenancy contract (tests/api_contract.py)."""

from __future__ import annotations

import pytest

from apps.balancers.models import Listener, RegionDistance, StaticIP
from tests.api_contract import TenancyContract
from tests.factories import (
    HostnameClaimFactory,
    IpPoolFactory,
    LoadBalancerFactory,
    MemberFactory,
    PoolFactory,
    PoolRegionFactory,
    RegionFactory,
    RouteFactory,
)


def w(request):
    return request.getfixturevalue("world")


class TestRegions(TenancyContract):
    url = "/api/v1/regions/"
    update = {"name": "Asia Pacific South"}
    tenant_owned = False
    writer = "otto"

    def make(self, request):
        w(request)
        return RegionFactory(slug="ap-east")

    def payload(self, request):
        return {"slug": "ap-south", "name": "AP South"}


class TestRegionDistances(TenancyContract):
    url = "/api/v1/region-distances/"
    update = {"rtt_ms": 90.0}
    tenant_owned = False
    writer = "otto"

    def make(self, request):
        world = w(request)
        return RegionDistance.objects.create(src=world.us, dst=world.eu, rtt_ms=80)

    def payload(self, request):
        w(request)
        return {"src": "eu-west", "dst": "us-east", "rtt_ms": 80}


class TestLoadBalancers(TenancyContract):
    url = "/api/v1/load-balancers/"
    update = {"name": "acme-renamed"}

    def make(self, request):
        return w(request).acme_lb

    def payload(self, request):
        w(request)
        return {"name": "acme-new"}


class TestListeners(TenancyContract):
    url = "/api/v1/listeners/"
    update = {"port": 8081}

    def make(self, request):
        return Listener.objects.create(lb=w(request).acme_lb, name="http", port=80)

    def payload(self, request):
        return {"lb": w(request).acme_lb.pk, "name": "alt", "port": 8443, "protocol": "http"}


class TestPools(TenancyContract):
    url = "/api/v1/pools/"
    update = {"algorithm": "leastconn"}

    def make(self, request):
        return w(request).acme_pool

    def payload(self, request):
        return {"lb": w(request).acme_lb.pk, "name": "api"}


class TestPoolRegions(TenancyContract):
    url = "/api/v1/pool-regions/"
    update = {"capacity_scaler": 0.5}

    def make(self, request):
        world = w(request)
        return PoolRegionFactory(pool=world.acme_pool, region=world.us)

    def payload(self, request):
        return {"pool": w(request).acme_pool.pk, "region": "eu-west", "max_rate_per_member": 10}


class TestMembers(TenancyContract):
    url = "/api/v1/members/"
    update = {"weight": 50}

    def make(self, request):
        world = w(request)
        return MemberFactory(pool=world.acme_pool, region=world.us, name="m1", address="127.0.0.5")

    def payload(self, request):
        return {"pool": w(request).acme_pool.pk, "region": "us-east", "name": "m2", "address": "127.0.0.6",
                "port": 8080}


class TestRoutes(TenancyContract):
    url = "/api/v1/routes/"
    update = {"path": "/v2"}

    def make(self, request):
        world = w(request)
        return RouteFactory(lb=world.acme_lb, hosts=["acme.example.com"], priority=10, pool=world.acme_pool)

    def payload(self, request):
        world = w(request)
        return {"lb": world.acme_lb.pk, "hosts": ["app.acme.test"], "path": "/x", "priority": 77,
                "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}


class TestHostnameClaims(TenancyContract):
    url = "/api/v1/hostname-claims/"

    def make(self, request):
        w(request)
        return HostnameClaimFactory(org=request.getfixturevalue("acme"), hostname="shop.acme.example")

    def payload(self, request):
        w(request)
        return {"hostname": "new.acme.example"}


class TestIpPools(TenancyContract):
    url = "/api/v1/ip-pools/"
    update = {"provider": "gcp"}
    tenant_owned = False
    writer = "otto"

    def make(self, request):
        w(request)
        return IpPoolFactory(name="more", cidr="198.51.100.0/29")

    def payload(self, request):
        return {"name": "vips", "cidr": "203.0.113.0/28"}


class TestStaticIps(TenancyContract):
    url = "/api/v1/static-ips/"
    deletable = False

    def make(self, request):
        w(request)
        from apps.balancers.models import IpPool

        return StaticIP.objects.create(pool=IpPool.objects.get(name="ips"), address="192.0.2.9",
                                       org=request.getfixturevalue("acme"))

    def payload(self, request):
        w(request)
        return {"pool": "ips"}


@pytest.mark.django_db
def test_customer_sees_shared_lb_but_cannot_change_it(world, alice):
    assert alice.client.get(f"/api/v1/load-balancers/{world.edge.pk}/").status_code == 200
    response = alice.client.patch(f"/api/v1/load-balancers/{world.edge.pk}/", {"name": "mine"}, format="json")
    assert response.status_code == 403


@pytest.mark.django_db
def test_customer_sees_only_its_own_routes_on_a_shared_lb(world, alice, charlie, globex):
    other_pool = PoolFactory(lb=world.edge, org=globex, name="globex-web")
    RouteFactory(lb=world.edge, org=globex, hosts=["globex.example.com"], priority=5, pool=other_pool)
    mine = RouteFactory(lb=world.edge, org=world.acme_pool.org, hosts=["acme.example.com"], priority=6,
                        pool=world.edge_pool)
    listing = alice.client.get("/api/v1/routes/", {"lb": world.edge.pk}).json()
    assert [row["id"] for row in listing["results"]] == [mine.pk]
    assert listing["count"] == 1
    # ...and cannot point a route at another tenant's pool: it simply does not exist for them.
    response = alice.client.post("/api/v1/routes/", {
        "lb": world.edge.pk, "hosts": ["acme.example.com"], "path": "/steal", "priority": 7,
        "targets": [{"pool": other_pool.pk, "weight": 100}]}, format="json")
    assert response.status_code == 400
    assert "globex" not in response.content.decode()


@pytest.mark.django_db
def test_other_lb_of_outsider_is_404_even_for_writes(world, charlie):
    lb = LoadBalancerFactory(name="hidden", org=world.acme_pool.org)
    assert charlie.client.delete(f"/api/v1/load-balancers/{lb.pk}/").status_code == 404
