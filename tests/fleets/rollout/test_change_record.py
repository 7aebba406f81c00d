"""Recording a change for the fleets serving an LB: every change counted, reconciles queued once, and
concurrent writers never deadlock on the fleets' rows (bench-scale's sustained run answered a route write
with a 500 when two writers locked the same two fleets' rows in opposite orders)."""

from __future__ import annotations

import random
import threading

import pytest
from django.db import connection

from apps.fleets import services
from apps.fleets.models import Fleet
from tests.factories import RegionFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleets(monkeypatch) -> list[Fleet]:
    queued: list[int] = []
    monkeypatch.setattr("apps.fleets.tasks.reconcile_task.apply_async", lambda args, **kw: queued.append(args[0]))
    region = RegionFactory()
    made = [Fleet.objects.create(name=f"f{i}", region=region) for i in range(4)]
    made[3].auto_rollout = False
    made[3].save()
    return made


def test_a_change_counts_for_every_fleet_and_queues_each_reconcile_once(fleets) -> None:
    ids = [f.pk for f in fleets]
    assert services.fleets_mark_changed(fleet_ids=ids, routes_only=True) == sorted(ids[:3])
    assert services.fleets_mark_changed(fleet_ids=list(reversed(ids))) == []  # already queued; held fleet never
    rows = {f.pk: f for f in Fleet.objects.filter(pk__in=ids)}
    assert {pk: (f.change_seq, f.route_seq, f.reconcile_queued) for pk, f in rows.items()} == {
        ids[0]: (2, 1, True), ids[1]: (2, 1, True), ids[2]: (2, 1, True), ids[3]: (2, 1, False)}
    Fleet.objects.filter(pk=ids[1]).update(reconcile_queued=False)  # its reconcile started
    assert services.fleets_mark_changed(fleet_ids=ids) == [ids[1]]


def test_concurrent_writers_in_any_order_beside_renders_locking_a_fleet_never_deadlock(fleets) -> None:
    """8 writers record changes for the same fleets in shuffled orders while 2 "renders" lock one fleet row
    and then another statement touches it (routelane._apply's shape); every call completes and is counted."""
    ids = [f.pk for f in fleets]
    errors: list[BaseException] = []
    rounds = 60

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(rounds):
                order = ids[:]
                rng.shuffle(order)
                services.fleets_mark_changed(fleet_ids=order, routes_only=rng.random() < 0.5)
                for pk in order:  # each fleet's reconcile starting (rollout.reconcile.fleet_reconcile: one row)
                    Fleet.objects.filter(pk=pk).update(reconcile_queued=False)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def render(seed: int) -> None:
        from django.db import transaction

        rng = random.Random(seed)
        try:
            for _ in range(rounds):
                pk = rng.choice(ids)
                with transaction.atomic():
                    Fleet.objects.select_for_update().get(pk=pk)
                    Fleet.objects.filter(pk=pk).update(rendered_seq=0)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=render, args=(100 + i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert set(Fleet.objects.filter(pk__in=ids).values_list("change_seq", flat=True)) == {8 * rounds}


def test_a_change_of_an_lb_marks_the_fleets_serving_it_in_one_statement(fleets, alice) -> None:
    """What every route write's commit runs (fleets/receivers.py): the fleets are found and marked by one UPDATE,
    not read first; a cloud LB's change marks none."""
    from django.test.utils import CaptureQueriesContext

    from apps.balancers.models import LoadBalancer

    own, serving, unrelated, held = fleets
    lb = LoadBalancer.objects.create(org=alice.org, name="web", fleet=own)
    serving.serves.add(lb)
    held.serves.add(lb)  # auto_rollout off: counted, not queued
    with CaptureQueriesContext(connection) as captured:
        assert services.lb_fleets_mark_changed(lb_id=lb.pk, routes_only=True) == sorted([own.pk, serving.pk])
    assert len(captured.captured_queries) == 1
    rows = {f.pk: (f.change_seq, f.route_seq, f.reconcile_queued) for f in Fleet.objects.all()}
    assert rows == {own.pk: (1, 1, True), serving.pk: (1, 1, True), unrelated.pk: (0, 0, False),
                    held.pk: (1, 1, False)}
    cloud = LoadBalancer.objects.create(org=alice.org, name="gcp", kind=LoadBalancer.Kind.GCP, fleet=unrelated)
    assert services.lb_fleets_mark_changed(lb_id=cloud.pk) == []
    assert Fleet.objects.get(pk=unrelated.pk).change_seq == 0
