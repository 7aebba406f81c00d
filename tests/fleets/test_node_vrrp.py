"""A node's VRRP settings through the API: what its keepalived.conf follows (HAProxy by process events, or
only the poll; the binary's name) changes with them, the change is audited, and the fleet's VRRP nodes are
re-pushed although the fleet's revision did not change."""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.fleets import selectors
from apps.fleets.config.render import render
from apps.fleets.config.spec import FleetSnapshot
from apps.fleets.models import Node

pytestmark = pytest.mark.django_db


def _keepalived(node: Node) -> str:
    snapshot = FleetSnapshot(fleet=node.fleet.name, region="us-east", revision=1, listeners=(), pools=())
    return render(snapshot, selectors.node_spec(node)).files["keepalived.conf"].decode()


def test_process_events_and_the_haproxy_binary_shape_the_nodes_keepalived_conf(
        shared, otto, alice, django_capture_on_commit_callbacks) -> None:
    created = otto.client.post("/api/v1/nodes/", {
        "fleet": "edge", "name": "n1", "address": "10.215.9.11", "runtime_dir": "/run/spillway/n1",
        "config_dir": "/etc/spillway/n1", "vrrp_interface": "eth0"}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["vrrp_process_events"] is True  # the default: follow HAProxy by process events
    node = Node.objects.get(pk=created.json()["id"])
    assert 'vrrp_track_process spillway_haproxy_master {\n    process "haproxy"\n' in _keepalived(node)

    with django_capture_on_commit_callbacks() as callbacks:
        changed = otto.client.patch(f"/api/v1/nodes/{node.pk}/", {
            "vrrp_process_events": False, "haproxy_bin": "/opt/haproxy/sbin/haproxy"}, format="json")
    assert changed.status_code == 200, changed.json()
    # The fleet's VRRP nodes get their new keepalived.conf pushed once the change commits.
    assert [cb for cb in callbacks if "vrrp_refresh" in cb.__code__.co_names]
    node.refresh_from_db()
    conf = _keepalived(node)
    assert "track_process" not in conf and 'script "/usr/bin/pgrep -f -- /run/spillway/n1/master.sock"' in conf
    event = AuditEvent.objects.filter(action="node.save", object_id=str(node.pk)).order_by("-id").first()
    assert event.before["vrrp_process_events"] is True and event.after["vrrp_process_events"] is False
    assert event.after["haproxy_bin"] == "/opt/haproxy/sbin/haproxy"

    # Back on: keepalived follows the file name of the binary (/opt/haproxy/sbin/haproxy: "haproxy").
    otto.client.patch(f"/api/v1/nodes/{node.pk}/", {"vrrp_process_events": True}, format="json")
    node.refresh_from_db()
    assert 'process "haproxy"\n' in _keepalived(node)
    node.haproxy_bin = "/opt/bin/haproxy-custom-build-2.6"
    assert 'process "haproxy-custom-"\n' in _keepalived(node)  # comm: 15 characters

    # Customers cannot see or change nodes at all.
    assert alice.client.patch(f"/api/v1/nodes/{node.pk}/", {"vrrp_process_events": False},
                              format="json").status_code == 404
    assert alice.client.get(f"/api/v1/nodes/{node.pk}/").status_code == 404
