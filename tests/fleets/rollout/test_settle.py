"""fleet_settle: a change is rolled out by the time it returns, after a rollout already in flight on the
fleet (never beside it), waiting on the fleet's lease rather than probing nodes."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connections
from django.utils import timezone

from apps.fleets.models import Fleet, Rollout
from apps.fleets.rollout import execute, lease
from apps.fleets.rollout.reconcile import fleet_reconcile
from apps.fleets.rollout.settle import fleet_settle
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, changed, reconcile, serving_local_fleet
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy]

ELSEWHERE = "another-host:4242:1:abcd1234"  # a reconciler on another host: never taken over as "gone"


def _rollouts_told(before: set[int], local: LocalFleet) -> list[tuple]:
    rollouts = Rollout.objects.filter(fleet=local.fleet).exclude(pk__in=before).order_by("pk")
    return [(r.pk, r.revision.number, r.status, r.error[:300],
             [(n.node.name, n.status, n.error[:200]) for n in r.results.select_related("node").order_by("pk")])
            for r in rollouts.select_related("revision")]


@pytest.fixture
def fleet3(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="settle", subnet=77, node_count=3) as local:
        yield local


@pytest.mark.django_db
def test_the_lease_is_free_when_nobody_live_holds_it() -> None:
    from apps.balancers.models import Region

    fleet = Fleet.objects.create(name="f", region=Region.objects.create(slug="r", name="r"))
    assert lease.is_free(fleet.pk)
    assert lease.claim(fleet.pk, ELSEWHERE)
    assert not lease.is_free(fleet.pk)  # held by a live holder (not this host's: not checkable)
    Fleet.objects.filter(pk=fleet.pk).update(lease_until=timezone.now() - dt.timedelta(seconds=1))
    assert lease.is_free(fleet.pk)  # expired
    gone = f"{socket.gethostname()}:{2 ** 22 + 7}:1:deadbeef"  # this host, a PID above pid_max: no process
    assert not os.path.exists(f"/proc/{2 ** 22 + 7}")
    Fleet.objects.filter(pk=fleet.pk).update(lease_owner=gone, lease_until=timezone.now() + dt.timedelta(seconds=30))
    assert lease.is_free(fleet.pk)  # its process is gone
    lease.release(fleet.pk, gone)
    assert lease.is_free(fleet.pk)


@pytest.mark.django_db(transaction=True)
def test_a_settle_waits_for_the_lease_holder_and_then_rolls_its_change_out(fleet3: LocalFleet, tiny_backend) -> None:
    """GIVEN a reconciler elsewhere holding the fleet's lease for 1.5 s and a new route recorded
    WHEN fleet_settle runs THEN it touches no node while the lease is held, and when it returns every
    node serves the route (it rolled it out itself once the lease was free)."""
    reconcile(fleet3.fleet)
    assert lease.claim(fleet3.fleet.pk, ELSEWHERE)
    released_at: list[float] = []

    def release() -> None:
        time.sleep(1.5)
        released_at.append(time.time())
        lease.release(fleet3.fleet.pk, ELSEWHERE)
        connections.close_all()

    new = tiny_backend("new")
    add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)
    before = set(Rollout.objects.filter(fleet=fleet3.fleet).values_list("pk", flat=True))
    holder = threading.Thread(target=release)
    holder.start()
    result = fleet_settle(fleet_id=fleet3.fleet.pk)
    holder.join()

    assert not result.get("busy") and result["waited_s"] >= 1.0, result
    assert fleet3.bodies("/new") == {"n1": "new", "n2": "new", "n3": "new"}
    rollouts = list(Rollout.objects.filter(fleet=fleet3.fleet).exclude(pk__in=before))
    assert [r.status for r in rollouts] == ["succeeded"]
    assert rollouts[0].created_at.timestamp() >= released_at[0]  # nothing was started while it was held
    assert lease.is_free(fleet3.fleet.pk)


@pytest.mark.django_db(transaction=True)
def test_a_settle_during_a_rollout_returns_once_its_change_is_served_and_no_two_rollouts_overlap(
        fleet3: LocalFleet, tiny_backend, monkeypatch) -> None:
    """GIVEN a real reconcile rolling a change out node by node in another thread (slowed to ~0.3 s a
    node) WHEN a second change is settled meanwhile THEN fleet_settle returns only once every node serves
    the second change too, and the fleet's rollouts ran one after the other."""
    reconcile(fleet3.fleet)
    Fleet.objects.filter(pk=fleet3.fleet.pk).update(batch_size=1)
    apply_node = execute.apply_node

    def slow_apply(plan):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        return apply_node(plan)

    monkeypatch.setattr(execute, "apply_node", slow_apply)
    a, b = tiny_backend("a"), tiny_backend("b")
    add_route(fleet3.lb, add_pool(fleet3.lb, "a", (a.address, a.port)), "/a", 10)
    before = set(Rollout.objects.filter(fleet=fleet3.fleet).values_list("pk", flat=True))

    def first() -> None:
        try:
            changed(fleet3.fleet)
            fleet_reconcile(fleet_id=fleet3.fleet.pk)
        finally:
            connections.close_all()

    in_flight = threading.Thread(target=first)
    in_flight.start()
    assert wait_for(lambda: not lease.is_free(fleet3.fleet.pk), 10, 0.002)
    add_route(fleet3.lb, add_pool(fleet3.lb, "b", (b.address, b.port)), "/b", 20)
    result = fleet_settle(fleet_id=fleet3.fleet.pk)
    served = fleet3.bodies("/b")
    in_flight.join()

    assert not result.get("busy") and result["waited_s"] > 0, result
    # A failure once seen only in a whole suite (n1 served /b, n2 and n3 did not): say what the rollouts did.
    assert served == {"n1": "b", "n2": "b", "n3": "b"}, (served, result, _rollouts_told(before, fleet3))
    assert fleet3.bodies("/a") == {"n1": "a", "n2": "a", "n3": "a"}
    rollouts = list(Rollout.objects.filter(fleet=fleet3.fleet).exclude(pk__in=before).order_by("started_at"))
    assert rollouts and all(r.status == "succeeded" for r in rollouts), [(r.pk, r.status) for r in rollouts]
    for earlier, later in itertools.pairwise(rollouts):
        assert earlier.finished_at <= later.started_at  # one after the other, never two at once
