"""The enforcer process keeps which nodes serve which LB between its runs (enforcement.Topology), reading it again
once its refresh has passed: every run reading it built every node, fleet and region again, four times a second."""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer
from apps.fleets import enforcement
from apps.fleets.enforcement import Topology
from apps.fleets.models import Fleet, Node
from tests.factories import LoadBalancerFactory, RegionFactory

pytestmark = pytest.mark.django_db


def _node(fleet: Fleet, name: str) -> Node:
    return Node.objects.create(fleet=fleet, name=name, address="127.0.0.1", runtime_dir=f"/run/spw/{name}",
                               config_dir=f"/etc/spw/{name}")


def test_the_topology_is_read_once_per_refresh_and_a_change_is_taken_up_after_it(monkeypatch, ops) -> None:
    fleet = Fleet.objects.create(name="edge", region=RegionFactory(slug="us-east"))
    lb = LoadBalancerFactory(org=ops, fleet=fleet, kind=LoadBalancer.Kind.HAPROXY)
    first = _node(fleet, "n1")
    clock = [1000.0]
    reads = []
    real = enforcement.lb_nodes
    monkeypatch.setattr(enforcement, "lb_nodes", lambda: reads.append(1) or real())
    topology = Topology(refresh_s=1.0, clock=lambda: clock[0])

    assert set(topology.lbs()[lb.pk]) == {first.pk}
    second = _node(fleet, "n2")
    Node.objects.filter(pk=first.pk).update(enabled=False)
    clock[0] += 0.9
    assert set(topology.lbs()[lb.pk]) == {first.pk}  # within the refresh: as read
    assert len(reads) == 1

    clock[0] += 0.1
    assert set(topology.lbs()[lb.pk]) == {second.pk}  # the node added and the one disabled, once it passed
    assert len(reads) == 2
    assert set(enforcement.lb_nodes()[lb.pk]) == {second.pk}  # what a run without a kept topology reads


@pytest.mark.django_db
def test_the_enforcer_process_leaves_what_it_imported_out_of_full_collections() -> None:
    """`manage.py enforcer` freezes its heap before its first run (apps.core.gcpause): a full collection would walk
    the whole application while a run waits, four runs a second."""
    import gc

    from django.core.management import call_command

    grown = [object() for _ in range(1000)]  # tracked objects made after the test process froze its own heap
    before = gc.get_freeze_count()
    call_command("enforcer", "--once")
    assert gc.get_freeze_count() >= before + len(grown)
