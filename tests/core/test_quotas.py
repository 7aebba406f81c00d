"""Per-org quotas: one tenant cannot take what every tenant shares, and the limits say so plainly.

Each quota is reached through the product (API) by acme; the next request is refused with a stable code and
a sentence, another tenant is unaffected, and an operator's override on the org moves the limit.
"""

from __future__ import annotations

import pytest
from django.test import Client

from apps.balancers.models import HostnameClaim, IpPool, StaticIP
from apps.core import quotas
from apps.events.models import Subscription
from tests.factories import HostnameClaimFactory, IpPoolFactory, LoadBalancerFactory

pytestmark = pytest.mark.django_db


def test_one_tenant_cannot_take_every_address_of_a_shared_pool(acme, globex, alice, charlie, settings):
    """One tenant took 251 addresses in 3 s and the next got pool_exhausted."""
    settings.QUOTA_STATIC_IPS = 5
    IpPoolFactory(name="shared", cidr="192.0.2.0/24")
    got = [alice.client.post("/api/v1/static-ips/allocate/", {"pool": "shared"}, format="json") for _ in range(7)]
    assert [r.status_code for r in got] == [201] * 5 + [409] * 2
    refused = got[-1].json()
    assert refused["code"] == "quota_exceeded" and "at most 5 static IPs" in refused["detail"]
    assert charlie.client.post("/api/v1/static-ips/allocate/", {"pool": "shared"}, format="json").status_code == 201
    assert StaticIP.objects.filter(org=acme).count() == 5


def test_an_operator_override_moves_one_orgs_limit(acme, alice, otto, settings):
    settings.QUOTA_EVENT_SUBSCRIPTIONS = 1
    sub = {"url": "https://hooks.example.com/x", "secret": "s" * 20}
    assert alice.client.post("/api/v1/event-subscriptions/", {"name": "a", **sub}, format="json").status_code == 201
    second = alice.client.post("/api/v1/event-subscriptions/", {"name": "b", **sub}, format="json")
    assert second.status_code == 409 and second.json()["code"] == "quota_exceeded"
    bad = otto.client.patch(f"/api/v1/organizations/{acme.pk}/", {"quotas": {"no_such": 1}}, format="json")
    assert bad.status_code == 400
    assert alice.client.patch(f"/api/v1/organizations/{acme.pk}/", {"quotas": {"event_subscriptions": 3}},
                              format="json").status_code == 403  # a tenant does not set its own
    raised = otto.client.patch(f"/api/v1/organizations/{acme.pk}/", {"quotas": {"event_subscriptions": 3}},
                               format="json")
    assert raised.status_code == 200, raised.content
    row = next(r for r in raised.json()["usage"] if r["name"] == "event_subscriptions")
    assert (row["limit"], row["used"]) == (3, 1)
    assert alice.client.post("/api/v1/event-subscriptions/", {"name": "b", **sub}, format="json").status_code == 201
    assert Subscription.objects.filter(org=acme).count() == 2


def test_test_sends_are_rate_limited_with_retry_after(acme, alice, settings):
    from django.core.cache import cache

    cache.clear()
    settings.QUOTA_TEST_SENDS_PER_HOUR = 3
    sub = Subscription.objects.create(org=acme, name="s", url="https://hooks.example.com/x")
    answers = [alice.client.post(f"/api/v1/event-subscriptions/{sub.pk}/test/") for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [202] * 3 or [a.status_code for a in answers[:3]] == [200] * 3
    assert answers[3].status_code == 429 and answers[3].json()["code"] == "rate_limited"
    assert 0 < int(answers[3]["Retry-After"]) <= 3600


def test_load_balancers_routes_and_claims_have_quotas(acme, alice, settings):
    settings.QUOTA_LOAD_BALANCERS, settings.QUOTA_HOSTNAME_CLAIMS = 1, 1
    assert alice.client.post("/api/v1/load-balancers/", {"name": "one"}, format="json").status_code == 201
    assert alice.client.post("/api/v1/load-balancers/", {"name": "two"}, format="json").json()["code"] == \
        "quota_exceeded"
    assert alice.client.post("/api/v1/hostname-claims/", {"hostname": "a.acme.example"},
                             format="json").status_code == 201
    assert alice.client.post("/api/v1/hostname-claims/", {"hostname": "b.acme.example"},
                             format="json").json()["code"] == "quota_exceeded"


def test_the_operator_org_is_not_limited(ops, otto, settings):
    settings.QUOTA_LOAD_BALANCERS = 0
    assert quotas.limit(ops, "load_balancers") is None
    assert otto.client.post("/api/v1/load-balancers/", {"name": "ops-lb"}, format="json").status_code == 201


def test_the_quotas_page_shows_use_and_lets_the_operator_change_a_limit(acme, alice, otto, settings):
    settings.QUOTA_STATIC_IPS = 4
    IpPoolFactory(name="shared", cidr="192.0.2.0/24")
    alice.client.post("/api/v1/static-ips/allocate/", {"pool": "shared"}, format="json")
    tenant = Client()
    tenant.force_login(alice.user)
    page = tenant.get("/quotas/").content.decode()
    assert "static IPs from shared pools" in page and 'id="quota-static_ips"' in page
    assert "Save quotas" not in page
    assert tenant.post("/quotas/", {"org": "acme", "quota_static_ips": "99"}).status_code == 403
    operator = Client()
    operator.force_login(otto.user)
    saved = operator.post("/quotas/", {"org": "acme", "quota_static_ips": "7"})
    assert saved.status_code == 200 and "Quotas of acme saved" in saved.content.decode()
    acme.refresh_from_db()
    assert acme.quotas == {"static_ips": 7} and quotas.limit(acme, "static_ips") == 7


# --- hostname claims, addresses, names: the rest of the tenant-facing limits ------------------------------


@pytest.mark.parametrize("name", ["co.uk", "*.github.io", "github.io", "com"])
def test_a_public_suffix_cannot_be_claimed(alice, name):
    response = alice.client.post("/api/v1/hostname-claims/", {"hostname": name}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "public_suffix"
    assert not HostnameClaim.objects.exists()


def test_a_claim_inside_another_orgs_name_warns_the_operator_and_only_the_operator(acme, globex, alice, otto):
    HostnameClaimFactory(org=globex, hostname="globex.example.com", status="approved")
    made = alice.client.post("/api/v1/hostname-claims/", {"hostname": "x.globex.example.com"}, format="json")
    assert made.status_code == 201 and made.json()["review_warnings"] == []  # the tenant learns nothing
    seen = otto.client.get(f"/api/v1/hostname-claims/{made.json()['id']}/").json()
    assert seen["review_warnings"] == ["Inside globex.example.com, which globex holds: approve only if globex "
                                       "agrees."]
    operator = Client()
    operator.force_login(otto.user)
    assert "which globex holds" in operator.get("/hostnames/").content.decode()


def test_the_network_and_broadcast_addresses_of_a_pool_cannot_be_reserved(alice):
    IpPool.objects.create(name="small", cidr="192.0.2.0/28")
    for address in ("192.0.2.0", "192.0.2.15"):
        response = alice.client.post("/api/v1/static-ips/allocate/", {"pool": "small", "address": address},
                                     format="json")
        assert response.status_code == 400 and response.json()["code"] == "address_not_usable", address
    assert alice.client.post("/api/v1/static-ips/allocate/", {"pool": "small", "address": "192.0.2.1"},
                             format="json").status_code == 201


def test_another_tenants_pool_name_on_a_shared_lb_is_neither_taken_nor_revealed(acme, globex, ops, alice, charlie):
    edge = LoadBalancerFactory(name="edge", org=ops, shared=True)
    assert charlie.client.post("/api/v1/pools/", {"lb": edge.pk, "name": "web"}, format="json").status_code == 201
    mine = alice.client.post("/api/v1/pools/", {"lb": edge.pk, "name": "web"}, format="json")
    assert mine.status_code == 201, mine.content
    again = alice.client.post("/api/v1/pools/", {"lb": edge.pk, "name": "web"}, format="json")
    assert again.status_code == 409  # its own name is taken, and says so
