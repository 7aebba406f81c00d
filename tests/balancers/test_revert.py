"""Reverting a change of a load balancer reaches every fleet that serves it and keeps the drains set since.

GIVEN an LB served by two fleets in two regions (a real HAProxy node each), a route added, then a member drained
by otto, WHEN the route's change is reverted through the API, THEN neither region's node serves the
route any more (rolling back one fleet's revision had left the other region on the newer routes), the drained
member is still drained in the database and on both nodes (a fleet rollback had quietly re-enabled it), and the
answer names what it kept: "member ... drained by otto (ops)".
"""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import Member, Region, Route
from apps.fleets.demo.localnodes import start_local_node
from apps.fleets.models import Fleet, Node
from apps.fleets.node.process import stop_master
from apps.fleets.node.runtime_api import HAProxySocket, parse_servers_state
from tests.fleets.fleetkit import add_pool, make_local_fleet, reconcile
from tests.netutil import free_port_on

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def test_a_revert_reaches_both_regions_and_keeps_a_drain_made_since(
        haproxy_bin, tiny_backend, otto, django_capture_on_commit_callbacks):
    old, other, new = tiny_backend("old"), tiny_backend("old2"), tiny_backend("new")
    us = make_local_fleet(name="rv", subnet=84, node_count=1, backend_address=(old.address, old.port))
    eu_proc = None
    try:
        pool = us.listener.default_pool
        Member.objects.create(pool=pool, region=pool.regions.get().region, name="old-2", address=other.address,
                              port=other.port)
        eu = Fleet.objects.create(name="rv-eu", region=Region.objects.create(slug="eu-west", name="EU West"))
        eu.serves.add(us.lb)
        address = "127.0.85.1"
        assert free_port_on([address]) and us.port
        eu_node = Node.objects.create(fleet=eu, name="e1", address=address, bind_address=address,
                                      runtime_dir=f"{us.base}/e1/run", config_dir=f"{us.base}/e1/etc")
        eu_proc = start_local_node(eu_node)
        nodes = [us.nodes[0], eu_node]

        def sync():
            reconcile(us.fleet)
            reconcile(eu)

        def body(node, path):
            return us.get(node, path)[1]

        sync()
        assert {body(n, "/x") for n in nodes} <= {"old", "old2"}

        new_pool = add_pool(us.lb, "new", (new.address, new.port))
        with django_capture_on_commit_callbacks(execute=True):
            made = otto.client.post("/api/v1/routes/", {"lb": us.lb.pk, "path": "/new", "priority": 1,
                                                        "targets": [{"pool": new_pool.pk}]}, format="json")
        assert made.status_code == 201, made.content
        sync()
        assert [body(n, "/new/a") for n in nodes] == ["new", "new"]
        drained = Member.objects.get(pool=pool, name="old-1")  # drained after the route was added
        with django_capture_on_commit_callbacks(execute=True):
            assert otto.client.post(f"/api/v1/members/{drained.pk}/state/", {"admin_state": "drain"},
                                    format="json").status_code in (200, 202)
        sync()

        change = AuditEvent.objects.get(action="route.create", object_id=str(made.json()["id"]))
        listed = otto.client.get(f"/api/v1/load-balancers/{us.lb.pk}/changes/").json()
        assert change.pk in [c["id"] for c in listed] and next(
            c for c in listed if c["id"] == change.pk)["revertible"]
        with django_capture_on_commit_callbacks(execute=True):
            answer = otto.client.post(f"/api/v1/load-balancers/{us.lb.pk}/revert/", {"change": change.pk},
                                      format="json")
        assert answer.status_code == 200, answer.content
        assert "deleted route" in answer.json()["reverted"]
        assert answer.json()["kept"] == ["member rv/old/old-1 drained by token otto-token (ops)"]
        sync()

        assert not Route.objects.filter(pk=made.json()["id"]).exists()
        assert [body(n, "/new/a") for n in nodes] == ["old2", "old2"]  # the default pool, its drained member idle
        drained.refresh_from_db()
        assert drained.admin_state == "drain"
        for node in nodes:
            live = parse_servers_state(HAProxySocket(f"{node.runtime_dir}/stats.sock").show_servers_state())
            assert live[(f"p{pool.pk}_us-east", "old-1")][0] == "drain", node.name
    finally:
        us.stop_all()
        if eu_proc is not None:
            stop_master(eu_proc)


def test_the_lb_page_lists_changes_by_name_and_reverts_one(otto, ops):
    """The LB page's Changes card: who did what, in words ("route.update · web#10: path: /a → /b"), and Revert."""
    from django.test import Client

    from tests.factories import LoadBalancerFactory, PoolFactory

    lb = LoadBalancerFactory(org=ops, name="web")
    pool = PoolFactory(lb=lb, org=ops, name="api")
    made = otto.client.post("/api/v1/routes/", {"lb": lb.pk, "path": "/a", "priority": 10,
                                                "targets": [{"pool": pool.pk}]}, format="json").json()
    assert otto.client.patch(f"/api/v1/routes/{made['id']}/", {"path": "/b"}, format="json").status_code == 200
    client = Client()
    client.force_login(otto.user)
    assert f'hx-get="/load-balancers/{lb.pk}/changes/"' in client.get(f"/load-balancers/{lb.pk}/").content.decode()
    page = client.get(f"/load-balancers/{lb.pk}/changes/").content.decode()  # the card, loaded by the page
    assert "path: /a → /b" in page and "token otto-token (ops)" in page
    update = AuditEvent.objects.get(action="route.update")
    reverted = client.post(f"/load-balancers/{lb.pk}/changes/{update.pk}/revert/").content.decode()
    assert "Reverted route.update of" in reverted and "path back to /a" in reverted
    assert Route.objects.get(pk=made["id"]).path == "/a"
    # A change of another LB is not this page's to revert.
    other = LoadBalancerFactory(org=ops, name="other")
    assert client.post(f"/load-balancers/{other.pk}/changes/{update.pk}/revert/").status_code == 404
