"""Drift that sees the live state, against real HAProxy nodes: out-of-band map and server changes are
found, shown, audited and put back through the runtime API; an on-disk edit is shown and audited too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.audit.models import AuditEvent
from apps.fleets import services
from apps.fleets.config.render.frontends import map_bucket, routes_map_name
from apps.fleets.models import Node, NodeResult
from apps.fleets.node.live import parse_servers_state
from apps.fleets.node.runtime_api import HAProxySocket
from apps.fleets.rollout.drift import fleet_drift_report
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, reconcile, serving_local_fleet

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


@pytest.fixture
def fleet2(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="live", subnet=72, node_count=2) as local:
        yield local


def _stats(node: Node) -> HAProxySocket:
    return HAProxySocket(f"{node.runtime_dir}/stats.sock")


def test_an_out_of_band_map_edit_and_server_state_change_are_found_audited_and_repaired(
        fleet2: LocalFleet, tiny_backend) -> None:
    new = tiny_backend("new")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    add_route(fleet2.lb, pool, "/new", 10)
    reconcile(fleet2.fleet)
    n1, n2 = fleet2.nodes
    assert fleet2.get(n1, "/new/x")[1] == "new"
    routes_map = routes_map_name("maps/live.http", map_bucket("*"))
    old_backend = f"p{fleet2.listener.default_pool_id}_us-east"

    # Someone with the stats socket re-points /new on n1 and puts n2's only old server in maint.
    _stats(n1).command(f"set map {routes_map} */new/ p{fleet2.listener.default_pool_id}")
    _stats(n2).command(f"set server {old_backend}/old-1 state maint")
    assert fleet2.get(n1, "/new/x")[1] == "old"

    report = fleet_drift_report(fleet=fleet2.fleet)

    assert set(report.repaired) == {"n1", "n2"} and not report.drifted
    assert any(f"*/new/ -> p{fleet2.listener.default_pool_id} (should be p{pool.pk})" in line
               for line in report.repaired["n1"])
    assert report.repaired["n2"] == [f"server {old_backend}/old-1: maint weight 100 (should be active weight 100)"]
    assert fleet2.get(n1, "/new/x")[1] == "new"
    assert parse_servers_state(_stats(n2).show_servers_state())[(old_backend, "old-1")] == ("active", 100)
    n1.refresh_from_db()
    assert n1.status == Node.Status.UP and "live state repaired" in n1.status_detail
    events = AuditEvent.objects.filter(action="node.drift").order_by("id")
    assert {e.object_repr for e in events} >= {str(n1), str(n2)}
    assert "put back through the runtime API" in events.last().after["repair"]
    # What the audit log records, the events say: found and repaired, per node, for subscribers.
    from apps.events.models import Event

    for node in (n1, n2):
        sent = set(Event.objects.filter(object_type="node", object_id=str(node.pk)).values_list("type", flat=True))
        assert {"drift.found", "drift.repaired"} <= sent, (node.name, sent)

    assert fleet_drift_report(fleet=fleet2.fleet).summary().startswith("No drift: all 2 node(s)")


def test_a_frontend_paused_or_shut_down_over_the_socket_is_found_and_serves_again(fleet2: LocalFleet) -> None:
    """Route changes no longer probe the listeners (their read-back proves them), so the drift check looks:
    a frontend paused with `disable frontend` is enabled again through the runtime API (same worker); one
    stopped with `shutdown frontend` cannot be, so the node shows drifted and the converge reloads it."""
    reconcile(fleet2.fleet)
    n1, n2 = fleet2.nodes
    workers = {n.name: n.worker_pid for n in (n1, n2)}
    frontend = f"fe_{fleet2.lb.name}.http"  # the listener's (render/frontends)
    assert {r.pxname for r in _stats(n1).show_stat() if r.svname == "FRONTEND"} >= {frontend}
    _stats(n1).command(f"disable frontend {frontend}")
    _stats(n2).command(f"shutdown frontend {frontend}")
    assert fleet2.get(n1)[0] == 0 and fleet2.get(n2)[0] == 0  # refused

    report = fleet_drift_report(fleet=fleet2.fleet)

    assert report.repaired == {"n1": [f"frontend {frontend}: PAUSED (should be OPEN: it does not accept "
                                      "connections)"]}
    assert fleet2.get(n1) == (200, "old")
    assert list(report.drifted) == ["n2"]
    assert f"frontend {frontend}: STOP" in report.drifted["n2"][0] and "a reload repairs it" in report.drifted["n2"][-1]
    assert AuditEvent.objects.filter(action="node.drift", object_id=str(n2.pk)).exists()

    services.fleet_converge(fleet=fleet2.fleet, check_drift=False, enqueue=False)
    services.fleet_reconcile(fleet_id=fleet2.fleet.pk)
    # The master still holds a stopped frontend's socket (a probe's connect succeeds): verify reads its status.
    result = NodeResult.objects.filter(node=n2).latest("id")
    assert "frontend(s) not accepting connections: fe_live.http (STOP): reloading" in result.error, result.error
    assert fleet2.get(n2) == (200, "old")
    after = {n.name: n.worker_pid for n in fleet2.nodes}
    assert after["n1"] == workers["n1"] and after["n2"] != workers["n2"]
    assert fleet_drift_report(fleet=fleet2.fleet).summary().startswith("No drift: all 2 node(s)")


def test_an_on_disk_edit_is_shown_audited_and_repaired_by_converge(fleet2: LocalFleet) -> None:
    reconcile(fleet2.fleet)
    n1 = fleet2.nodes[0]
    with open(f"{n1.config_dir}/current/haproxy.cfg", "a") as cfg:
        cfg.write("\n# hand edit\n")

    report = fleet_drift_report(fleet=fleet2.fleet)

    assert list(report.drifted) == ["n1"] and "config on disk" in report.drifted["n1"][0]
    event = AuditEvent.objects.get(action="node.drift", object_id=str(n1.pk))
    assert "config on disk" in event.before["differences"][0] and "converge" in event.after["repair"]
    rollout = services.fleet_converge(fleet=fleet2.fleet, check_drift=False, enqueue=False)
    services.fleet_reconcile(fleet_id=fleet2.fleet.pk)
    rollout.refresh_from_db()
    assert rollout.status == "succeeded"
    assert services.fleet_drift_check(fleet=fleet2.fleet) == []


def test_the_periodic_check_sees_a_disk_edit_at_once_and_reads_the_files_when_due(fleet2: LocalFleet,
                                                                                 monkeypatch) -> None:
    """Between two reads of the files (as often as the live maps: LIVE_MAPS_EVERY_S), each converge compares every
    file's name, mode, size and mtime with the set as pushed: an edit that changes them is drift at the next
    converge. One that keeps the size and sets the mtime back is found by "Check drift" at once, and by the
    periodic check once the files are due."""
    import os

    from apps.fleets.rollout import drift

    monkeypatch.setattr(drift, "LIVE_MAPS_EVERY_S", 3.0)
    monkeypatch.setattr(drift, "QUIET_S", 0.0)
    from apps.fleets.node.transports.local import LocalTransport

    reconcile(fleet2.fleet)
    assert fleet_drift_report(fleet=fleet2.fleet, all_maps=False).summary().startswith("No drift")  # read: clean
    reads: list[str] = []
    real_read_tree = LocalTransport._read_tree
    monkeypatch.setattr(LocalTransport, "_read_tree",
                        lambda self, root: reads.append(root) or real_read_tree(self, root))
    assert fleet_drift_report(fleet=fleet2.fleet, all_maps=False).summary().startswith("No drift")
    assert reads == []  # not due: no file read
    cfg = f"{fleet2.nodes[0].config_dir}/current/haproxy.cfg"
    original = Path(cfg).read_bytes()
    times = os.stat(cfg)

    with open(cfg, "ab") as handle:
        handle.write(b"\n# hand edit\n")
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)  # files not due
    assert list(report.drifted) == ["n1"] and "config on disk" in report.drifted["n1"][0]

    with open(cfg, "wb") as handle:  # the same size, the mtime set back: only a read of the files sees it
        handle.write(original.replace(b"global", b"GLOBAL", 1))
    os.utime(cfg, ns=(times.st_atime_ns, times.st_mtime_ns))
    Node.objects.filter(pk=fleet2.nodes[0].pk).update(status=Node.Status.UP, status_detail="")
    assert list(fleet_drift_report(fleet=fleet2.fleet).drifted) == ["n1"]  # "Check drift"
    Node.objects.filter(pk=fleet2.nodes[0].pk).update(status=Node.Status.UP, status_detail="")
    time.sleep(3.1)
    assert list(fleet_drift_report(fleet=fleet2.fleet, all_maps=False).drifted) == ["n1"]


def test_push_and_check_drift_say_so_when_they_find_nothing_to_do(fleet2: LocalFleet, otto) -> None:
    from django.test import Client

    reconcile(fleet2.fleet)
    fleet2.fleet.refresh_from_db()
    client = Client()
    client.force_login(otto.user)
    page = client.get(f"/fleets/{fleet2.fleet.pk}/").content.decode()
    assert 'hx-target="#fleet-action-result"' in page

    push = client.post(f"/fleets/{fleet2.fleet.pk}/do/push/", HTTP_HX_REQUEST="true").content.decode()
    assert push == f"Nothing to push: revision {fleet2.fleet.desired_revision} already holds every change."
    check = client.post(f"/fleets/{fleet2.fleet.pk}/do/converge/", HTTP_HX_REQUEST="true").content.decode()
    assert check == "No drift: all 2 node(s) run their verified config, maps and server states. Nothing to converge."


def test_a_node_address_change_re_renders_and_re_verifies_it(fleet2: LocalFleet, otto,
                                                             django_capture_on_commit_callbacks) -> None:
    reconcile(fleet2.fleet)
    n2 = fleet2.nodes[1]
    old_address = n2.address
    with django_capture_on_commit_callbacks(execute=True):
        services.node_save(principal=otto.principal, node=n2,
                           data={"address": "127.0.72.9", "bind_address": "127.0.72.9"})
    n2.refresh_from_db()
    assert n2.status == Node.Status.DRIFTED and "re-verifying" in n2.status_detail
    services.fleet_reconcile(fleet_id=fleet2.fleet.pk)

    n2.refresh_from_db()
    assert n2.status == Node.Status.UP and n2.applied_sha256
    assert fleet2.get(n2, "/")[1] == "old"  # served on the new address
    moved_away = fleet2.get(n2.__class__(bind_address=old_address), "/")
    assert moved_away[0] == 0, moved_away  # nothing listens on the old one any more
    assert services.fleet_drift_check(fleet=fleet2.fleet) == []


def test_the_enforcement_loops_live_limits_are_not_drift_but_a_missing_key_is(fleet2: LocalFleet) -> None:
    """GIVEN the enforcement loop raised a node's share of its region (set map on chain.limits.map, as it
    does every second) THEN converge's drift check leaves it alone: repairing it put every node back to
    the static shares for a second at every converge (make bench-overflow-fleet: a region served ~94% of
    its capacity at 1x). A key missing from that map is still drift and put back."""
    from apps.fleets.config.render.chain import LIMITS_MAP

    reconcile(fleet2.fleet)
    n1 = fleet2.nodes[0]
    limits = dict(_stats(n1).show_map(LIMITS_MAP))
    backend = sorted(limits)[0]
    _stats(n1).command(f"set map {LIMITS_MAP} {backend} 77")

    report = fleet_drift_report(fleet=fleet2.fleet)

    assert not report.repaired and not report.drifted, report.summary()
    assert dict(_stats(n1).show_map(LIMITS_MAP))[backend] == "77"
    assert not AuditEvent.objects.filter(action="node.drift").exists()

    _stats(n1).command(f"del map {LIMITS_MAP} {backend}")
    report = fleet_drift_report(fleet=fleet2.fleet)
    assert list(report.repaired) == ["n1"] and any(f"missing {backend}" in line for line in report.repaired["n1"])
    assert backend in dict(_stats(n1).show_map(LIMITS_MAP))


def test_the_periodic_check_reads_live_maps_as_they_fall_due_and_check_drift_reads_them_at_once(
        fleet2: LocalFleet, tiny_backend, monkeypatch) -> None:
    """Each converge (every 10 s) checks disk, worker and server states; a node's large maps are read back
    once LIVE_MAPS_EVERY_S have passed since they were last found clean (200k lines a node at 100k routes).
    An out-of-band map edit is repaired by the first periodic check after that, and at once by "Check drift"."""
    from apps.fleets.rollout import drift

    # Long enough that the check, the edit and the next look all fall inside it on a slow machine.
    monkeypatch.setattr(drift, "LIVE_MAPS_EVERY_S", 3.0)
    monkeypatch.setattr(drift, "QUIET_S", 0.0)  # the fleet counts as quiet right after its rollouts
    new = tiny_backend("new")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    add_route(fleet2.lb, pool, "/new", 10)
    reconcile(fleet2.fleet)
    n1 = fleet2.nodes[0]
    routes_map = routes_map_name("maps/live.http", map_bucket("*"))
    default = f"p{fleet2.listener.default_pool_id}"
    assert services.fleet_drift_check(fleet=fleet2.fleet, all_maps=False) == []  # maps read: clean

    _stats(n1).command(f"set map {routes_map} */new/ {default}")
    assert fleet_drift_report(fleet=fleet2.fleet, all_maps=False).summary().startswith("No drift")  # not due
    assert fleet2.get(n1, "/new/x")[1] == "old"
    time.sleep(3.1)
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)
    assert list(report.repaired) == ["n1"] and f"*/new/ -> {default} (should be p{pool.pk})" in report.repaired["n1"][0]
    assert fleet2.get(n1, "/new/x")[1] == "new"

    # "Check drift" (the button, the API) reads every map whatever the cadence.
    _stats(n1).command(f"set map {routes_map} */new/ {default}")
    report = fleet_drift_report(fleet=fleet2.fleet)
    assert list(report.repaired) == ["n1"]
    assert fleet2.get(n1, "/new/x")[1] == "new"
    # A server state change is seen by every periodic check, maps due or not.
    old_backend = f"{default}_us-east"
    _stats(n1).command(f"set server {old_backend}/old-1 state maint")
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)
    assert report.repaired == {"n1": [f"server {old_backend}/old-1: maint weight 100 (should be active weight 100)"]}


def test_the_periodic_check_puts_off_a_fleet_its_rollouts_move_and_check_drift_does_not(
        fleet2: LocalFleet, monkeypatch) -> None:
    """A first look that a rollout ran beside saw nodes between two revisions, not drift: the periodic check
    does not then hold the fleet's lease (route changes would wait for its reads) but looks again at the next
    converge. While rollouts run it leaves live maps last found clean (CPU in the process rolling changes out)
    until they are MAX_DEFER_S overdue, then reads them under the lease; maps found differing are read at the
    next check. "Check drift" checks everything at once."""
    from django.utils import timezone

    from apps.fleets.models import ConfigRevision, Rollout
    from apps.fleets.rollout import drift

    monkeypatch.setattr(drift, "LIVE_MAPS_EVERY_S", 0.0)
    monkeypatch.setattr(drift, "QUIET_S", 0.0)
    monkeypatch.setattr(drift, "_DEFERRED_SINCE", {})
    monkeypatch.setattr(drift, "_MAPS_READ", {})
    add_route(fleet2.lb, fleet2.listener.default_pool, "/r", 10)
    reconcile(fleet2.fleet)
    n1 = fleet2.nodes[0]
    routes_map = routes_map_name("maps/live.http", map_bucket("*"))
    default = f"p{fleet2.listener.default_pool_id}"
    fleet2.fleet.refresh_from_db()
    revision = ConfigRevision.objects.get(fleet=fleet2.fleet, number=fleet2.fleet.desired_revision)
    assert _stats(n1).command(f"add map {routes_map} */edited/ {default}").strip() == ""

    # A rollout that starts while the first look reads the nodes.
    look = drift._looks_clean

    def look_beside_a_rollout(fleet, due_after_s):
        found = look(fleet, due_after_s)
        Rollout.objects.create(fleet=fleet, revision=revision, status=Rollout.Status.SUCCEEDED)
        return found

    monkeypatch.setattr(drift, "_looks_clean", look_beside_a_rollout)
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)
    assert report.skipped and not report.repaired and "*/edited/" in dict(_stats(n1).show_map(routes_map))
    monkeypatch.setattr(drift, "_looks_clean", look)
    assert not AuditEvent.objects.filter(action="node.drift").exists()
    # Maps found differing are read at the next check, busy or not (here a rollout is pending).
    active = Rollout.objects.create(fleet=fleet2.fleet, revision=revision, status=Rollout.Status.PENDING)
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)
    assert list(report.repaired) == ["n1"] and "*/edited/" not in dict(_stats(n1).show_map(routes_map))

    # Maps last found clean wait while the rollout is pending (the rest is checked, and clean).
    _stats(n1).command(f"add map {routes_map} */edited/ {default}")
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)
    assert report.checked == 2 and not report.repaired and "*/edited/" in dict(_stats(n1).show_map(routes_map))
    # MAX_DEFER_S overdue: the check takes the lease, reads them and repairs.
    monkeypatch.setattr(drift, "MAX_DEFER_S", 0.0)
    report = fleet_drift_report(fleet=fleet2.fleet, all_maps=False)
    assert list(report.repaired) == ["n1"] and "*/edited/" not in dict(_stats(n1).show_map(routes_map))
    monkeypatch.setattr(drift, "MAX_DEFER_S", 300.0)

    # "Check drift" does not wait for the rollout.
    _stats(n1).command(f"add map {routes_map} */edited/ {default}")
    assert not fleet_drift_report(fleet=fleet2.fleet, all_maps=False).repaired
    assert list(fleet_drift_report(fleet=fleet2.fleet).repaired) == ["n1"]
    # Once no rollout runs, the periodic check reads the maps, finds and repairs as before.
    active.status = Rollout.Status.SUCCEEDED
    active.save(update_fields=["status"])
    _stats(n1).command(f"add map {routes_map} */edited/ {default}")
    assert list(fleet_drift_report(fleet=fleet2.fleet, all_maps=False).repaired) == ["n1"]
    assert AuditEvent.objects.filter(action="node.drift").count() == 4
    # A rollout that ended less than QUIET_S ago counts as running: changes are still coming.
    monkeypatch.setattr(drift, "QUIET_S", 60.0)
    Rollout.objects.filter(pk=active.pk).update(finished_at=timezone.now())
    _stats(n1).command(f"add map {routes_map} */edited/ {default}")
    assert not fleet_drift_report(fleet=fleet2.fleet, all_maps=False).repaired
    assert "*/edited/" in dict(_stats(n1).show_map(routes_map))
