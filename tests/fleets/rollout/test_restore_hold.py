"""A real pg_dump / pg_restore of the database behind a fleet whose nodes moved on since the dump: the first
rollout after the restore touches no node, shows what it would change, and waits for an operator."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client

from apps.audit.models import AuditEvent
from apps.fleets import caches
from apps.fleets.models import Fleet, Node, Rollout
from apps.fleets.node.transports.local import LocalTransport
from apps.fleets.queries import node_conn
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, reconcile, serving_local_fleet
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]


@pytest.fixture
def fleet2(otto, haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="restored", subnet=81, node_count=2) as local:
        yield local


def _pg(tool: str, *args: str) -> None:
    s = connection.settings_dict
    argv = [tool, "-h", s["HOST"] or "127.0.0.1", "-p", str(s["PORT"] or 5432), "-U", s["USER"], *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.django_db(transaction=True)
def test_after_a_restore_from_an_older_dump_no_node_is_rolled_back_until_an_operator_confirms(
    fleet2: LocalFleet, tiny_backend, otto, alice, tmp_path
) -> None:
    reconcile(fleet2.fleet)  # revision 1 on both nodes
    new = tiny_backend("new")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    add_route(fleet2.lb, pool, "/before-dump", 10)
    reconcile(fleet2.fleet)
    dump = tmp_path / "spillway.dump"
    name = connection.settings_dict["NAME"]
    _pg("pg_dump", "--format=custom", f"--file={dump}", name)

    add_route(fleet2.lb, pool, "/after-dump", 11)  # a change made after the backup
    reconcile(fleet2.fleet)
    assert set(fleet2.bodies("/after-dump").values()) == {"new"}
    served = LocalTransport(node_conn(fleet2.nodes[0])).read_served()
    assert served is not None and b'"revision": 3' in served

    connection.close()
    _pg("pg_restore", "--clean", "--if-exists", "--single-transaction", f"--dbname={name}", str(dump))
    caches.reset()  # as a control plane started again after the restore
    fleet = Fleet.objects.get(pk=fleet2.fleet.pk)
    assert fleet.desired_revision == 2  # the database went back; the nodes did not

    # A tenant's write after the restore renders revision 3 again, with other contents than the nodes' 3.
    add_route(fleet2.lb, pool, "/after-restore", 12)
    reconcile(fleet)
    assert set(fleet2.bodies("/after-dump").values()) == {"new"}  # nothing was rolled back
    assert set(fleet2.bodies("/after-restore").values()) == {"old"}  # nor pushed
    fleet.refresh_from_db()
    hold = fleet.restore_hold
    assert {n["node"]: n["serves_revision"] for n in hold["nodes"]} == {"n1": 3, "n2": 3}
    assert hold["database_newest_revision"] == 3
    routes_map = next(m for name, m in hold["would_change"]["maps"].items() if m["lost"])
    assert any("/after-dump" in key for key in routes_map["lost_keys"])
    assert any("/after-restore" in key for key in routes_map["gained_keys"])
    newest = Rollout.objects.filter(fleet=fleet).order_by("-id").first()
    assert newest.status == Rollout.Status.PENDING  # waits; no node result moved
    assert not newest.results.exclude(status="pending").exists()
    # The periodic converge leaves a held fleet alone too.
    from apps.fleets import services

    assert services.fleet_converge(fleet=fleet) is None
    # "Check drift" finds the nodes off the database's revision and says what happens to them: nothing, yet.
    from apps.fleets.rollout.drift import fleet_drift_report

    assert set(fleet_drift_report(fleet=fleet).drifted) == {"n1", "n2"}
    for node in Node.objects.filter(fleet=fleet):
        assert "held after a restore" in node.status_detail, node.status_detail
    repairs = {e.after["repair"] for e in AuditEvent.objects.filter(action="node.drift")}
    assert repairs and all("held after a restore" in r for r in repairs)

    # On the fleet page, for operators only (the maps hold every tenant's routes).
    web = Client()
    web.force_login(otto.user)
    page = web.get(f"/fleets/{fleet.pk}/").content.decode()
    assert "Held: the nodes serve revisions this database does not know" in page
    assert "n1 serves revision 3" in page and "/after-dump" in page and "confirm-restore" in page
    web.force_login(alice.user)
    assert "restore-hold" not in web.get(f"/fleets/{fleet.pk}/").content.decode()
    assert web.post(f"/fleets/{fleet.pk}/do/confirm-restore/").status_code in (403, 404)
    assert Fleet.objects.get(pk=fleet.pk).restore_hold

    # Through the API: the hold shows on the fleet; a customer cannot see it or confirm it; an operator can.
    url = f"/api/v1/fleets/{fleet.pk}/"
    assert otto.client.get(url).json()["restore_hold"]["nodes"][0]["serves_revision"] == 3
    assert alice.client.post(f"{url}confirm-restore/").status_code == 404
    answer = otto.client.post(f"{url}confirm-restore/")
    assert answer.status_code == 200 and answer.json()["restore_hold"] == {}
    services.fleet_reconcile(fleet_id=fleet.pk)  # what the queued reconcile does
    assert wait_for(lambda: set(fleet2.bodies("/after-restore").values()) == {"new"}, 10)
    assert set(fleet2.bodies("/after-dump").values()) == {"old"}  # the operator chose the database's state
    assert {n.applied_revision.number for n in Node.objects.filter(fleet=fleet)} == {fleet.desired_revision}

    assert AuditEvent.objects.filter(action="fleet.restore_confirmed", actor_label__contains="otto").exists()
