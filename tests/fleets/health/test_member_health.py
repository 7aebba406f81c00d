"""Members' live health from real HAProxy nodes (apps.fleets.health.members): up, down with its check result,
drain, the time of the last state change — what the pool table and the dashboard show."""

from __future__ import annotations

import time

import pytest

from apps.balancers.models import Member
from apps.balancers.services import member_set_state
from apps.fleets import services
from apps.fleets.health.members import member_health
from apps.fleets.models import NodeHealth
from tests.fleets.fleetkit import make_local_fleet, reconcile
from tests.netutil import pick_free_port

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def _collect_until(fleet, members, predicate, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while True:
        services.fleet_health_collect(fleet=fleet)
        health = member_health(Member.objects.filter(pk__in=[m.pk for m in members]).select_related("region"))
        if predicate(health) or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def test_up_down_and_drain_as_the_nodes_report_them(haproxy_bin, tiny_backend) -> None:
    backend = tiny_backend("alive")
    local = make_local_fleet(name="mh", subnet=76, node_count=2, backend_address=(backend.address, backend.port))
    try:
        pool = local.listener.default_pool
        pool.health_path, pool.health_interval_s, pool.health_rise, pool.health_fall = "/", 1, 1, 1
        pool.save()
        alive = Member.objects.get(pool=pool, name="old-1")
        dead = Member.objects.create(pool=pool, region=alive.region, name="dead-1", address="127.0.0.1",
                                     port=pick_free_port())  # nothing listens there
        reconcile(local.fleet)
        health = _collect_until(local.fleet, [alive, dead],
                                lambda h: h[dead.pk].state == "down" and h[alive.pk].state == "up")
        assert (health[alive.pk].state, health[alive.pk].nodes_up, health[alive.pk].nodes_total) == ("up", 2, 2)
        assert health[dead.pk].state == "down" and health[dead.pk].nodes_up == 0
        assert health[dead.pk].nodes_in_state == 2  # down on 2/2 nodes
        assert health[dead.pk].check.startswith("L4CON"), health[dead.pk].check
        assert health[dead.pk].changed_at is not None

        member_set_state(principal=None, member=alive, admin_state="drain")
        services.member_runtime_apply(member_id=alive.pk)
        rows = NodeHealth.objects.filter(proxy__startswith=f"p{pool.pk}_", server="old-1")
        # The nodes themselves report the drain (not only the desired state in the database).
        # rows.all(): a fresh read each time (a QuerySet keeps the rows of its first evaluation).
        health = _collect_until(local.fleet, [alive], lambda h: all(r.status.startswith("DRAIN") for r in rows.all()))
        assert sorted(r.status for r in rows.all()) == ["DRAIN", "DRAIN"]
        assert health[alive.pk].state == "drain" and health[alive.pk].sessions == 0
        assert health[alive.pk].label == "drain: 0 sessions open"
        # The count names the nodes that report the drain, not the nodes up: "drained on 2/2 nodes", never "1/2".
        assert (health[alive.pk].nodes_in_state, health[alive.pk].nodes_total) == (2, 2)
        from django.template.loader import render_to_string

        alive.health = health[alive.pk]
        html = render_to_string("partials/member_health.html", {"m": alive})
        assert "<strong>drained</strong> on 2/2 nodes" in html, html
    finally:
        local.stop_all()
