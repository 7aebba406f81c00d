"""Last-known-good on the node: a node rebooted while the control plane is down (every HAProxy process killed,
its runtime directory wiped as a tmpfs /run is at boot, started again from its own files) serves exactly the last
verified revision, including what reached it through the runtime API without a reload: route map entries, a
member drained and a member re-weighted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.balancers.models import Member
from apps.fleets.config.render.frontends import map_bucket, routes_map_name
from apps.fleets.models import Node
from apps.fleets.node.transports.local import LocalTransport
from apps.fleets.queries import node_conn
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, reconcile, serving_local_fleet

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]


@pytest.fixture
def fleet2(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="reboot", subnet=82, node_count=2) as local:
        yield local


def _servers(node: Node) -> dict[tuple[str, str], int | None]:
    """Each server's effective weight: HAProxy 2.6 has no drain keyword in a config, so the file says weight 0
    where the runtime API said `drain` (shown as DRAIN, with the weight kept for later): the same traffic."""
    transport = LocalTransport(node_conn(node))
    try:
        return {(r.pxname, r.svname): 0 if r.status == "DRAIN" else r.weight
                for r in transport.stats().show_stat() if r.type == 2}
    finally:
        transport.close()


def _reboot(local: LocalFleet, node: Node) -> None:
    """Every process of the node killed at once (no graceful stop), /run emptied, HAProxy started from disk."""
    proc = local.procs.pop(node.name)
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                and _parent(p) == proc.pid]
    for pid in [*children, proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(5)
    shutil.rmtree(node.runtime_dir, ignore_errors=True)  # sockets and the saved server state go with a reboot
    os.makedirs(node.runtime_dir)
    local.start(node)


def _parent(entry: Path) -> int | None:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.django_db(transaction=True)
def test_a_node_rebooted_with_the_control_plane_down_serves_the_last_verified_revision_with_its_runtime_changes(
    fleet2: LocalFleet, tiny_backend
) -> None:
    reconcile(fleet2.fleet)
    new, spare = tiny_backend("new"), tiny_backend("spare")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    Member.objects.create(pool=pool, region=pool.regions.first().region, name="new-2", address=spare.address,
                          port=spare.port)
    add_route(fleet2.lb, pool, "/a", 10)
    reconcile(fleet2.fleet)
    n1 = Node.objects.get(fleet=fleet2.fleet, name="n1")
    worker = n1.worker_pid

    # Through the runtime API only (no reload): a route, a drain, a weight.
    add_route(fleet2.lb, pool, "/b", 11)
    Member.objects.filter(name="new-1").update(admin_state=Member.AdminState.DRAIN)
    Member.objects.filter(name="new-2").update(weight=37)
    reconcile(fleet2.fleet)
    n1.refresh_from_db()
    assert n1.worker_pid == worker, "the changes were meant to reach the node without a reload"
    before = _servers(n1)
    drained = [k for k in before if k[1].startswith("new-1")]
    reweighted = [k for k in before if k[1].startswith("new-2")]
    assert drained and all(before[k] == 0 for k in drained)
    assert reweighted and all(before[k] == 37 for k in reweighted)
    assert set(fleet2.bodies("/b").values()) == {"spare"}  # new-1 drained: new-2 answers

    _reboot(fleet2, n1)  # no control plane involved from here

    assert _servers(n1) == before
    assert fleet2.get(n1, "/b")[1] == "spare"
    assert fleet2.get(n1, "/a")[1] == "spare"
    assert fleet2.get(n1, "/")[1] == "old"
    assert LocalTransport(node_conn(n1)).config_sha256() == n1.applied_sha256  # the verified files, unchanged


@pytest.mark.django_db(transaction=True)
def test_a_node_rebooted_with_the_control_plane_down_still_answers_an_open_acme_http01_challenge(
    fleet2: LocalFleet,
) -> None:
    """Answers are published at runtime (no revision, no reload) and written into the node's challenge map file,
    whose content the set's digest leaves out: the node is not drifted by them, and keeps them through a reboot."""
    from apps.fleets import services

    reconcile(fleet2.fleet)
    token, value = "tok-reboot_1", "tok-reboot_1.thumbprint"
    assert services.acme_challenges_set(add={token: value}) == {"reboot-fleet/n1": None, "reboot-fleet/n2": None}
    n1 = Node.objects.get(fleet=fleet2.fleet, name="n1")
    assert LocalTransport(node_conn(n1)).config_sha256() == n1.applied_sha256  # answers are not drift
    assert services.fleet_drift_check(fleet=fleet2.fleet) == []

    _reboot(fleet2, n1)

    assert fleet2.get(n1, f"/.well-known/acme-challenge/{token}") == (200, value)
    assert fleet2.get(n1, "/.well-known/acme-challenge/unknown")[1] != value


@pytest.mark.django_db(transaction=True)
def test_the_drift_check_adopts_a_worker_restarted_from_the_verified_files_without_a_reload(
    fleet2: LocalFleet, tiny_backend
) -> None:
    """After a reboot the node serves its verified files through a new worker. A reload would only start the same
    files again (~5 s over SSH, holding the fleet's changes): the check reads every live map and adopts it."""
    from apps.audit.models import AuditEvent
    from apps.fleets import services

    reconcile(fleet2.fleet)
    new = tiny_backend("new")
    add_route(fleet2.lb, add_pool(fleet2.lb, "new", (new.address, new.port)), "/a", 10)
    reconcile(fleet2.fleet)
    n1 = Node.objects.get(fleet=fleet2.fleet, name="n1")
    _reboot(fleet2, n1)
    rebooted = LocalTransport(node_conn(n1)).stats().show_info()["Pid"]
    assert int(rebooted) != n1.worker_pid

    assert services.fleet_drift_check(fleet=fleet2.fleet) == []
    n1.refresh_from_db()
    assert n1.status == Node.Status.UP
    assert n1.worker_pid == int(rebooted), "adopted, not reloaded"
    assert int(LocalTransport(node_conn(n1)).stats().show_info()["Pid"]) == int(rebooted)
    assert AuditEvent.objects.filter(action="node.drift", object_id=str(n1.pk),
                                     after__repair__startswith="adopted").exists()
    assert fleet2.get(n1, "/a/x")[1] == "new"


@pytest.mark.django_db(transaction=True)
def test_a_restarted_worker_whose_live_maps_differ_from_its_files_is_put_back_not_trusted(
    fleet2: LocalFleet, tiny_backend
) -> None:
    """A worker started from the verified files and then changed through its socket is not adopted as it stands:
    the check reads every map (not only the due ones), puts the entry back, and only then adopts it."""
    from apps.fleets import services

    reconcile(fleet2.fleet)
    new = tiny_backend("new")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    add_route(fleet2.lb, pool, "/a", 10)
    reconcile(fleet2.fleet)
    n1 = Node.objects.get(fleet=fleet2.fleet, name="n1")
    services.fleet_drift_check(fleet=fleet2.fleet)  # this process read the maps just now: none is due
    _reboot(fleet2, n1)
    stats = LocalTransport(node_conn(n1)).stats()
    routes_map = routes_map_name(f"maps/{fleet2.lb.name}.http", map_bucket("*"))
    stats.command(f"set map {routes_map} */a/ p{fleet2.listener.default_pool_id}")
    assert fleet2.get(n1, "/a/x")[1] == "old"

    assert services.fleet_drift_check(fleet=fleet2.fleet, all_maps=False) == []
    assert fleet2.get(n1, "/a/x")[1] == "new"
