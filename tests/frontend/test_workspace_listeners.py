"""The LB workspace's listeners card: attach/detach a static IP (audited), only the org's own reserved IPs,
and the VIP cell (holder read from the nodes; see tests/fleets/health/test_vip_netns.py for real holders)."""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import IpPool, Listener, LoadBalancer, StaticIP
from tests.personas import web

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup(acme, globex):
    lb = LoadBalancer.objects.create(org=acme, name="web")
    listener = Listener.objects.create(lb=lb, name="http", port=80)
    pool = IpPool.objects.create(name="ips", cidr="192.0.2.0/28")
    mine = StaticIP.objects.create(pool=pool, address="192.0.2.2", org=acme, state=StaticIP.State.RESERVED)
    theirs = StaticIP.objects.create(pool=pool, address="192.0.2.3", org=globex, state=StaticIP.State.RESERVED)
    return lb, listener, mine, theirs



def test_an_owner_attaches_and_detaches_a_vip_and_both_are_audited(setup, alice):
    lb, listener, mine, _theirs = setup
    client = web(alice)
    page = client.get(f"/load-balancers/{lb.pk}/").content.decode()
    assert 'name="static_ip"' in page and "192.0.2.2" in page and "192.0.2.3" not in page  # only acme's
    response = client.post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": mine.pk})
    assert response.status_code == 200
    # No fleet serving this LB runs keepalived: the row says the address is not served (no holder to read).
    assert "not served" in response.content.decode()
    listener.refresh_from_db()
    assert listener.static_ip == mine and StaticIP.objects.get(pk=mine.pk).state == StaticIP.State.ASSIGNED
    attach = AuditEvent.objects.get(action="static_ip.attach")
    assert attach.after == {"static_ip": "192.0.2.2"} and attach.actor

    # An attached address cannot be released from under the listener.
    refused = client.post(f"/load-balancers/{lb.pk}/static-ips/{mine.pk}/release/")
    assert refused.status_code == 409 and StaticIP.objects.get(pk=mine.pk).org_id == alice.org.pk

    response = client.post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": ""})
    assert response.status_code == 200
    listener.refresh_from_db()
    assert listener.static_ip is None and StaticIP.objects.get(pk=mine.pk).state == StaticIP.State.RESERVED
    detach = AuditEvent.objects.get(action="static_ip.detach")
    assert detach.before == {"static_ip": "192.0.2.2"} and detach.after == {"static_ip": None}


def test_another_orgs_vip_answers_like_a_missing_one(setup, alice):
    _lb, listener, _mine, theirs = setup
    client = web(alice)
    foreign = client.post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": theirs.pk})
    missing = client.post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": 999999})
    assert foreign.status_code == missing.status_code == 422
    assert foreign.content == missing.content
    listener.refresh_from_db()
    assert listener.static_ip is None and StaticIP.objects.get(pk=theirs.pk).state == StaticIP.State.RESERVED


def test_a_viewer_cannot_attach_and_an_outsider_cannot_see_the_listener(setup, vera, charlie):
    _lb, listener, mine, _ = setup
    assert web(vera).post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": mine.pk}).status_code == 403
    assert web(charlie).post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": mine.pk}).status_code == 404
    assert web(charlie).get(f"/listeners/{listener.pk}/vip/").status_code == 404
    listener.refresh_from_db()
    assert listener.static_ip is None


def test_an_address_nothing_answers_on_says_not_served_wherever_it_appears(setup, alice):
    """On a fleet without keepalived the static IP is attached but no node holds it: every place that shows the
    address says so (the listener row, its VIP cell, the capacity test's target picker)."""
    lb, listener, mine, _ = setup
    client = web(alice)
    client.post(f"/listeners/{listener.pk}/static-ip/", {"static_ip": mine.pk})
    cell = client.get(f"/listeners/{listener.pk}/vip/").content.decode()
    assert "not served: nothing answers on this address" in cell
    page = client.get(f"/load-balancers/{lb.pk}/").content.decode()
    row = page[page.index(f'id="listener-{listener.pk}"'):]
    row = row[:row.index("</tr>")]
    assert f"{mine.address}:{listener.port}" in row and "not served" in row and "vip-holder" not in row
    picker = client.get("/capacity/").content.decode()
    assert f"({mine.address}:{listener.port}, not served: nothing answers on it)" in picker


def test_a_cloud_lb_shows_its_terraform_json_and_last_plan_in_place(acme, alice, charlie):
    from apps.cloud.models import CloudApply, CloudTarget

    target = CloudTarget.objects.create(org=acme, name="acme-gcp", provider="gcp", project_or_account="p",
                                        regions=["us-east"], region_map={"us-east": "us-east1"})
    lb = LoadBalancer.objects.create(org=acme, name="cloudy", kind="gcp", cloud_target=target)
    CloudApply.objects.create(target=target, lb=lb, status=CloudApply.Status.AWAITING_APPROVAL,
                              synth_json={"provider": {"google": [{"region": "us-east1"}]}},
                              plan_output="Plan: 7 to add, 0 to change, 0 to destroy.")
    page = web(alice).get(f"/load-balancers/{lb.pk}/").content.decode()
    assert "Plan: 7 to add, 0 to change, 0 to destroy." in page
    assert "&quot;region&quot;: &quot;us-east1&quot;" in page  # the JSON itself, escaped, not only a link
    assert web(charlie).get(f"/load-balancers/{lb.pk}/").status_code == 404
