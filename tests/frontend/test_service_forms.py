"""The UI forms over the API's serializers and services (apps.core.service_forms.ServiceFormView):
create and edit with inline 422 errors, tenancy as the API (owner, teammate, viewer, outsider, operator)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.balancers.models import IpPool, Listener, Member, Pool, PoolRegion, Region, RegionDistance
from tests.factories import LoadBalancerFactory, PoolFactory, RegionFactory
from tests.personas import HTMX, web

pytestmark = pytest.mark.django_db


@pytest.fixture
def regions():
    return RegionFactory(slug="us-east"), RegionFactory(slug="eu-west")


@pytest.fixture
def edge(ops):
    return LoadBalancerFactory(name="edge", org=ops, shared=True)


def test_customer_creates_its_own_pool_with_capacity_on_the_shared_lb(alice, edge, regions):
    client = web(alice)
    page = client.get(reverse("pool-new", args=[edge.pk]))
    assert page.status_code == 200
    assert b"Capacity per region" in page.content and b"rate_us-east" in page.content
    response = client.post(reverse("pool-new", args=[edge.pk]), {
        "name": "shop", "algorithm": "leastconn", "overflow_policy": "waterfall", "overload": "absorb",
        "region_us-east": "on", "rate_us-east": "120", "scaler_us-east": "0.5"}, **HTMX)
    assert response.status_code == 200, response.content.decode()[:500]
    pool = Pool.objects.get(name="shop")
    assert response["HX-Redirect"] == reverse("lb-detail", args=[edge.pk]) + f"#pool-{pool.pk}"
    assert pool.org == alice.org and pool.lb == edge and pool.algorithm == "leastconn"
    row = PoolRegion.objects.get(pool=pool)
    assert (row.region.slug, row.max_rate_per_member, row.capacity_scaler) == ("us-east", 120, 0.5)
    assert AuditEvent.objects.get(action="pool.create").actor_label == "alice (acme)"
    workspace = client.get(reverse("lb-detail", args=[edge.pk])).content.decode()
    assert "us-east: 120 req/s per member, scaler 0.50" in workspace


def test_invalid_input_comes_back_by_its_field_with_422_and_nothing_saved(alice, edge, regions):
    response = web(alice).post(reverse("pool-new", args=[edge.pk]), {
        "name": "Bad Name!", "algorithm": "roundrobin", "overflow_policy": "waterfall", "overload": "absorb",
        "region_us-east": "on", "scaler_us-east": "0.05"}, **HTMX)
    assert response.status_code == 422
    html = response.content.decode()
    assert 'id="f-name-err"' in html
    assert 'id="f-regions-err"' in html and "capacity_scaler" in html
    assert 'value="Bad Name!"' in html  # what the person typed stays
    assert not Pool.objects.exists()


def test_teammate_edits_viewer_and_outsider_cannot(alice, bob, vera, charlie, regions):
    lb = LoadBalancerFactory(name="acme-lb", org=alice.org)
    pool = PoolFactory(lb=lb, org=alice.org, name="web")
    url = reverse("pool-edit", args=[pool.pk])
    ok = web(bob).post(url, {"name": "web", "algorithm": "source", "overflow_policy": "waterfall",
                             "overload": "absorb"})
    assert ok.status_code == 302
    pool.refresh_from_db()
    assert pool.algorithm == "source"
    assert web(vera).get(url).status_code == 403
    assert web(charlie).get(url).status_code == 404
    assert web(charlie).post(reverse("pool-new", args=[lb.pk]), {"name": "x"}).status_code == 404
    assert web(charlie).post(url, {"name": "stolen"}).status_code == 404
    pool.refresh_from_db()
    assert pool.name == "web"


def test_member_form_creates_the_capacity_row_and_shows_serializer_and_service_errors(alice, regions):
    lb = LoadBalancerFactory(name="acme-lb", org=alice.org)
    pool = PoolFactory(lb=lb, org=alice.org, name="web")
    client = web(alice)
    bad = client.post(reverse("member-new", args=[pool.pk]), {"name": "m1", "region": "mars", "address": "10.1.1.1",
                                                               "port": "8080"}, **HTMX)
    assert bad.status_code == 422 and 'id="f-region-err"' in bad.content.decode()
    # The service's own rule (a private address needs the operator's allowance) comes back by its field too.
    private = client.post(reverse("member-new", args=[pool.pk]), {"name": "m1", "region": "eu-west",
                                                                   "address": "10.1.1.1", "port": "8080"}, **HTMX)
    assert private.status_code == 422
    assert 'id="f-address-err"' in private.content.decode() and "private address" in private.content.decode()
    alice.org.member_networks = ["10.1.0.0/16"]
    alice.org.save()
    good = client.post(reverse("member-new", args=[pool.pk]), {"name": "m1", "region": "eu-west",
                                                                "address": "10.1.1.1", "port": "8080"})
    assert good.status_code == 302
    member = Member.objects.get(pool=pool)
    assert member.region.slug == "eu-west"
    assert PoolRegion.objects.filter(pool=pool, region__slug="eu-west").exists()
    edit = client.post(reverse("member-edit", args=[member.pk]), {"name": "m1", "region": "eu-west",
                                                                   "address": "10.1.1.1", "port": "8081",
                                                                   "weight": "50"})
    assert edit.status_code == 302
    member.refresh_from_db()
    assert (member.port, member.weight) == (8081, 50)


def test_listener_form_on_own_lb(alice, charlie, regions):
    lb = LoadBalancerFactory(name="acme-lb", org=alice.org)
    PoolFactory(lb=lb, org=alice.org, name="web")
    client = web(alice)
    taken = client.post(reverse("listener-new", args=[lb.pk]), {"name": "http", "protocol": "http", "port": "0"},
                        **HTMX)
    assert taken.status_code == 422 and 'id="f-port-err"' in taken.content.decode()
    assert client.post(reverse("listener-new", args=[lb.pk]), {"name": "http", "protocol": "http",
                                                               "port": "18080"}).status_code == 302
    assert Listener.objects.filter(lb=lb, port=18080).exists()
    assert web(charlie).get(reverse("listener-new", args=[lb.pk])).status_code == 404


def test_infrastructure_is_the_operators(otto, alice):
    assert web(alice).get(reverse("infrastructure")).status_code == 403
    assert web(alice).post(reverse("region-new"), {"slug": "x", "name": "X"}).status_code == 403
    client = web(otto)
    empty = client.get(reverse("infrastructure")).content.decode()
    assert "No regions yet" in empty and "No IP pools yet" in empty
    assert client.post(reverse("region-new"), {"slug": "ap-south", "name": "Asia South"}).status_code == 302
    assert client.post(reverse("region-new"), {"slug": "eu-north", "name": "EU North"}).status_code == 302
    assert client.post(reverse("distance-new"), {"src": "ap-south", "dst": "eu-north",
                                                 "rtt_ms": "120"}).status_code == 302
    assert RegionDistance.objects.get().rtt_ms == 120
    bad = client.post(reverse("ip-pool-new"), {"name": "edge-v4", "cidr": "not-a-cidr", "provider": "haproxy"}, **HTMX)
    assert bad.status_code == 422 and 'id="f-cidr-err"' in bad.content.decode()
    assert client.post(reverse("ip-pool-new"), {"name": "edge-v4", "cidr": "192.0.2.0/28", "region": "ap-south",
                                                "provider": "haproxy"}).status_code == 302
    assert IpPool.objects.get(name="edge-v4").region == Region.objects.get(slug="ap-south")
    page = client.get(reverse("infrastructure")).content.decode()
    assert "ap-south" in page and "192.0.2.0/28" in page and "120.0 ms" in page
