"""Attaching a static IP (a floating VIP) to a listener: only IPs reserved for the listener's org."""

from __future__ import annotations

import pytest

from apps.balancers.models import IpPool, Listener, StaticIP
from tests.factories import LoadBalancerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def ips(world, acme, globex) -> dict[str, StaticIP]:
    pool = IpPool.objects.get(name="ips")
    return {
        "acme": StaticIP.objects.create(pool=pool, address="192.0.2.2", org=acme, state=StaticIP.State.RESERVED),
        "globex": StaticIP.objects.create(pool=pool, address="192.0.2.3", org=globex,
                                          state=StaticIP.State.RESERVED),
    }


def test_an_org_attaches_its_own_vip_to_its_own_listener(world, ips, alice) -> None:
    listener = Listener.objects.create(lb=world.acme_lb, name="http", port=80)
    response = alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": ips["acme"].pk}, format="json")
    assert response.status_code == 200, response.json()
    listener.refresh_from_db()
    assert listener.static_ip == ips["acme"]
    assert StaticIP.objects.get(pk=ips["acme"].pk).state == StaticIP.State.ASSIGNED


def test_a_vip_of_another_org_cannot_be_attached(world, ips, charlie) -> None:
    """globex's admin names acme's VIP on globex's own listener: answered like a missing IP."""
    globex_lb = LoadBalancerFactory(name="globex-lb", org=charlie.org)
    listener = Listener.objects.create(lb=globex_lb, name="http", port=80)
    response = charlie.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": ips["acme"].pk},
                                    format="json")
    assert response.status_code == 400
    body = response.json()
    assert "static_ip" in body["fields"]
    missing = charlie.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": 999999}, format="json")
    # The same words as for an id that does not exist at all.
    assert body["fields"]["static_ip"] == [m.replace("999999", str(ips["acme"].pk))
                                           for m in missing.json()["fields"]["static_ip"]]
    listener.refresh_from_db()
    assert listener.static_ip is None
    assert StaticIP.objects.get(pk=ips["acme"].pk).state == StaticIP.State.RESERVED


def test_an_attached_vip_cannot_be_released(world, ips, alice) -> None:
    listener = Listener.objects.create(lb=world.acme_lb, name="http", port=80)
    alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": ips["acme"].pk}, format="json")
    response = alice.client.post(f"/api/v1/static-ips/{ips['acme'].pk}/release/")
    assert response.status_code in (400, 409), response.json()
    assert StaticIP.objects.get(pk=ips["acme"].pk).org == alice.org


def test_a_vip_that_could_not_float_on_the_fleet_is_refused_with_a_code(world, ips, alice, ops) -> None:
    """Two VIPs deriving one VRRP router id on one fleet, or an IPv6 VIP on IPv4 VRRP nodes, would have to
    be left out of keepalived.conf: refused at attach time (409) without naming the other tenant's VIP."""
    from apps.fleets.models import Fleet, Node

    fleet = Fleet.objects.create(name="edge-fleet", region=world.us)
    Node.objects.create(fleet=fleet, name="n1", address="10.0.0.1", runtime_dir="/run/x", config_dir="/etc/x",
                        vrrp_interface="eth0")
    world.acme_lb.fleet = fleet
    world.acme_lb.save()
    ops_lb = LoadBalancerFactory(name="ops-lb", org=ops, fleet=fleet)
    pool = IpPool.objects.get(name="ips")
    taken = StaticIP.objects.create(pool=pool, address="192.0.2.5", org=ops, state=StaticIP.State.ASSIGNED)
    Listener.objects.create(lb=ops_lb, name="http", port=80, static_ip=taken)
    wide = IpPool.objects.create(name="wide", cidr="192.0.3.0/24")
    clash = StaticIP.objects.create(pool=wide, address="192.0.3.4", org=alice.org)  # 192.0.2.5 + 255
    v6_pool = IpPool.objects.create(name="v6", cidr="2001:db8::/64")
    v6 = StaticIP.objects.create(pool=v6_pool, address="2001:db8::5", org=alice.org)
    listener = Listener.objects.create(lb=world.acme_lb, name="http", port=8080)
    for ip, code in ((clash, "vrid_collision"), (v6, "vip_family")):
        response = alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": ip.pk}, format="json")
        assert response.status_code == 409, response.json()
        assert response.json()["code"] == code and "192.0.2.5" not in response.json()["detail"]
    listener.refresh_from_db()
    assert listener.static_ip is None
    ok = alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": ips["acme"].pk}, format="json")
    assert ok.status_code == 200, ok.json()


def test_attaching_and_detaching_through_the_api_are_audited(world, ips, alice) -> None:
    """The API's PATCH is the same act as the workspace form: each is its own audit event."""
    from apps.audit.models import AuditEvent

    listener = Listener.objects.create(lb=world.acme_lb, name="http", port=80)
    attach = alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": ips["acme"].pk}, format="json")
    assert attach.status_code == 200, attach.json()
    detach = alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"static_ip": None}, format="json")
    assert detach.status_code == 200, detach.json()
    events = list(AuditEvent.objects.filter(action__startswith="static_ip.").exclude(action="static_ip.allocate")
                  .order_by("pk").values_list("action", "before", "after"))
    assert events == [("static_ip.attach", {"static_ip": None}, {"static_ip": "192.0.2.2"}),
                      ("static_ip.detach", {"static_ip": "192.0.2.2"}, {"static_ip": None})]
    # A PATCH that leaves the address alone records no attach/detach.
    alice.client.patch(f"/api/v1/listeners/{listener.pk}/", {"port": 8080}, format="json")
    assert AuditEvent.objects.filter(action__in=("static_ip.attach", "static_ip.detach")).count() == 2


def test_the_api_reads_the_vip_holder_from_the_nodes(world, alice, charlie, ops) -> None:
    """GET /listeners/{id}/vip/ asks each VRRP node which addresses it carries (here one local node,
    whose loopback carries 127.0.0.1); another org's listener answers 404."""
    from apps.fleets.models import Fleet, Node

    fleet = Fleet.objects.create(name="edge-fleet", region=world.us)
    Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/run/x", config_dir="/etc/x",
                        vrrp_interface="lo", status=Node.Status.UP)
    world.acme_lb.fleet = fleet
    world.acme_lb.save()
    pool = IpPool.objects.create(name="loop", cidr="127.0.0.0/29")
    vip = StaticIP.objects.create(pool=pool, address="127.0.0.1", org=alice.org, state=StaticIP.State.ASSIGNED)
    bare = Listener.objects.create(lb=world.acme_lb, name="bare", port=8080)
    listener = Listener.objects.create(lb=world.acme_lb, name="http", port=80, static_ip=vip)
    body = alice.client.get(f"/api/v1/listeners/{listener.pk}/vip/").json()
    assert body == {"listener": listener.pk, "address": "127.0.0.1", "fleets": [
        {"fleet": "edge-fleet", "region": "us-east", "state": "ok", "holders": [{"node": "n1", "status": "up"}],
         "unreachable": []}]}
    assert alice.client.get(f"/api/v1/listeners/{bare.pk}/vip/").json() == {
        "listener": bare.pk, "address": None, "fleets": []}
    assert charlie.client.get(f"/api/v1/listeners/{listener.pk}/vip/").status_code == 404
