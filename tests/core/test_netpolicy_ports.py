"""One port-list parser (apps.core.netpolicy.parse_ports / port_allowed) behind both port rules: the ports
tenants' listeners may bind (SPILLWAY_TENANT_LISTENER_PORTS) and capacity allowlist entries' ports."""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer
from apps.core.netpolicy import parse_ports, port_allowed


def test_port_lists_parse_to_ranges() -> None:
    assert parse_ports("80, 443,8000-8099") == [(80, 80), (443, 443), (8000, 8099)]
    assert parse_ports("") == []
    assert port_allowed(8099, "80,8000-8099") and not port_allowed(8100, "80,8000-8099")
    assert not port_allowed(80, "")


@pytest.mark.parametrize("hostile", ["0", "65536", "80-70", "1e3", "80;443", "80,,443", "-80", "80-", "0x50",
                                     "\uff18\uff10", "80\n443", "80\n", "1-99999", "443,"])
def test_anything_else_is_refused(hostile) -> None:
    with pytest.raises(ValueError):
        parse_ports(hostile)


@pytest.mark.django_db
def test_tenant_listener_ports_follow_the_one_parser(alice, bob, otto, settings) -> None:
    settings.TENANT_LISTENER_PORTS = "443, 8000-8099"
    lb = LoadBalancer.objects.create(org=alice.org, name="acme-own")
    inside = bob.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "a", "port": 8099}, format="json")
    outside = bob.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "b", "port": 8100}, format="json")
    assert inside.status_code == 201, inside.content
    assert outside.status_code == 400 and outside.json()["code"] == "port_not_allowed"
    # Operators place listeners anywhere.
    assert otto.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "c", "port": 22},
                            format="json").status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize(("ports", "ok"), [("80,443", True), ("8000-8099", True), ("80-70", False),
                                           ("80;443", False), ("65536", False)])
def test_allowlist_entry_ports_follow_the_one_parser(otto, alice, ports, ok) -> None:
    response = otto.client.post("/api/v1/capacity-allowlist/", {"cidr": "10.1.0.0/16", "ports": ports,
                                                                "applies_to_all_orgs": True}, format="json")
    assert response.status_code == (201 if ok else 400), response.content
    if not ok:
        assert response.json()["fields"]["ports"]
    denied = alice.client.post("/api/v1/capacity-allowlist/", {"cidr": "10.1.0.0/16", "ports": ports,
                                                                "applies_to_all_orgs": True}, format="json")
    assert denied.status_code in (400, 403) and denied.status_code != 201
