"""Rollouts through a real Celery worker (killed mid-rollout) and through the SSH transport."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.balancers.models import Pool
from apps.core import crypto
from apps.fleets import selectors, services
from apps.fleets.models import Fleet, Node, NodeResult, Rollout
from apps.fleets.node.transports.local import LocalTransport
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, make_local_fleet, reconcile, serving_local_fleet
from tests.processes import children
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]


@pytest.fixture
def fleet3(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="kill", subnet=72, node_count=3) as local:
        yield local


def _sigkill_worker(pid: int, pool: list[int]) -> None:
    """SIGKILL a Celery worker and its pool processes, by PID (never a process group we do not own). The pool's
    PIDs are read before (reading /proc at the moment of the kill let a slow machine finish the node first)."""
    for child in pool:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    # Then any pool process started since, found while the worker still has them as its children (once it is
    # killed they are re-parented and no longer found).
    for child in children(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def _diagnose(rollout: Rollout | None, tmp_path: Path) -> str:
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("celery-*.log")))
    if rollout is None:
        return f"no rollout{logs}"
    rollout.refresh_from_db()
    fleet = Fleet.objects.get(pk=rollout.fleet_id)
    results = list(rollout.results.values_list("node__name", "status", "error"))
    return (f"rollout {rollout.status} {rollout.error!r} results={results} lease={fleet.lease_owner!r} "
            f"until={fleet.lease_until} queued={fleet.reconcile_queued} seq={fleet.change_seq}/"
            f"{fleet.rendered_seq}{logs}")


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_rollout_leaves_no_node_half_applied_and_the_next_run_converges(
    fleet3: LocalFleet, tiny_backend, celery_worker_factory, tmp_path
) -> None:
    reconcile(fleet3.fleet)  # revision 1 everywhere, in-process
    Fleet.objects.filter(pk=fleet3.fleet.pk).update(batch_size=1)  # n1, then n2, then n3
    new = tiny_backend("new")
    add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)
    worker = celery_worker_factory(name="w1")
    pool = sorted(children(worker.pid))
    assert pool, "the prefork worker has no pool process"

    services.fleet_mark_changed(fleet=fleet3.fleet)  # what the lb_changed receiver does
    # Kill the worker while it is in the middle of a node (the canary is done, n2 is being applied).
    running = wait_for(lambda: NodeResult.objects.filter(node__name="n2", status="running",
                                                         rollout__fleet=fleet3.fleet).exists(),
                       timeout_s=30, interval_s=0.002)
    # Seen once in a whole-suite run on a loaded machine (2026-11-28): the rollout as it stood, and the worker's log.
    assert running, _diagnose(Rollout.objects.filter(fleet=fleet3.fleet).order_by("-id").first(), tmp_path)
    _sigkill_worker(worker.pid, pool)
    worker.wait(5)

    rollout = Rollout.objects.filter(fleet=fleet3.fleet).order_by("-id").first()
    assert rollout.status == Rollout.Status.RUNNING  # nobody finished it
    for node in fleet3.nodes:
        body = fleet3.get(node, "/new")[1]
        assert body in ("old", "new")  # each node serves one whole config
        if node.applied_revision_id == rollout.revision_id:
            assert body == "new"  # never recorded as applied unless it serves it
    assert Node.objects.get(fleet=fleet3.fleet, name="n3").applied_revision_id != rollout.revision_id

    celery_worker_factory(name="w2")
    services.fleet_mark_changed(fleet=fleet3.fleet)  # the next run (a change, or the periodic converge)

    converged = wait_for(lambda: Rollout.objects.get(pk=rollout.pk).status == Rollout.Status.SUCCEEDED, 30)
    assert converged, _diagnose(rollout, tmp_path)
    assert fleet3.bodies("/new") == {"n1": "new", "n2": "new", "n3": "new"}
    assert {n.applied_revision_id for n in fleet3.nodes} == {rollout.revision_id}
    assert Rollout.objects.filter(fleet=fleet3.fleet, revision=rollout.revision).count() == 1
    assert services.fleet_drift_check(fleet=Fleet.objects.get(pk=fleet3.fleet.pk)) == []


@pytest.mark.django_db
def test_a_rollout_through_the_ssh_transport(haproxy_bin, tiny_backend, sshd) -> None:
    old = tiny_backend("old")
    local = make_local_fleet(name="ssh", subnet=73, node_count=1, backend_address=(old.address, old.port))
    try:
        node = local.nodes[0]
        Node.objects.filter(pk=node.pk).update(
            transport="ssh", ssh_host=sshd.host, ssh_port=sshd.port, ssh_user=sshd.user,
            ssh_private_key_encrypted=crypto.encrypt(sshd.client_key), ssh_known_hosts=sshd.host_public_key)
        new = tiny_backend("new")
        add_route(local.lb, add_pool(local.lb, "new", (new.address, new.port)), "/new", 10)

        result = reconcile(local.fleet)

        rollout = Rollout.objects.get(pk=result["rollouts"][-1])
        assert rollout.status == Rollout.Status.SUCCEEDED, rollout.error
        assert local.get(node, "/new")[1] == "new" and local.get(node, "/")[1] == "old"
        assert services.fleet_drift_check(fleet=local.fleet) == []

        # A different host key pinned (a reinstalled or impostor host): nothing is sent.
        Node.objects.filter(pk=node.pk).update(
            ssh_known_hosts="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOdq0cHmZ6CXfPZpGQ6QdpVbKqGvJ5l2kZL0mV6cQpQS")
        add_route(local.lb, Pool.objects.get(lb=local.lb, name="new"), "/v2", 11)
        result = reconcile(local.fleet)
        rollout = Rollout.objects.get(pk=result["rollouts"][-1])
        assert rollout.status == Rollout.Status.FAILED
        assert "host key" in rollout.error
        assert local.get(node, "/v2")[1] == "old"
    finally:
        local.stop_all()


@pytest.mark.django_db
def test_a_never_configured_ssh_node_refuses_a_bind_a_stranger_holds(haproxy_bin, tiny_backend, sshd) -> None:
    """GIVEN an SSH node that never ran a Spillway config and a stranger listening on the address its
    first config binds, WHEN the first rollout runs, THEN it is refused before any push (`ss` on the
    node names the holder), and once the stranger is gone the next run converges."""
    old = tiny_backend("old")
    local = make_local_fleet(name="fresh", subnet=74, node_count=1, backend_address=(old.address, old.port))
    stranger = socket.socket()
    try:
        node = local.nodes[0]
        on_disk = LocalTransport(selectors.node_conn(node))
        before = on_disk.config_sha256()
        Node.objects.filter(pk=node.pk).update(
            transport="ssh", ssh_host=sshd.host, ssh_port=sshd.port, ssh_user=sshd.user,
            ssh_private_key_encrypted=crypto.encrypt(sshd.client_key), ssh_known_hosts=sshd.host_public_key)
        stranger.bind((node.bind_address, local.port))
        stranger.listen()

        result = reconcile(local.fleet)

        rollout = Rollout.objects.get(pk=result["rollouts"][-1])
        assert rollout.status == Rollout.Status.FAILED
        assert f"bind conflict, refused before any push: n1: {node.bind_address}:{local.port}" in rollout.error
        assert on_disk.config_sha256() == before, "nothing was pushed"

        stranger.close()
        # A refusing node is left alone until someone acts: here the operator's retry (POST /rollouts/).
        retry = services.rollout_create(fleet=local.fleet, revision=rollout.revision, enqueue=False)
        services.fleet_reconcile(fleet_id=local.fleet.pk)
        retry.refresh_from_db()
        assert retry.status == Rollout.Status.SUCCEEDED, retry.error
        assert local.get(node, "/")[1] == "old"
    finally:
        stranger.close()
        local.stop_all()
