"""The dashboard in a real browser: the demo fleet's health updates through htmx polling, no reload."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.balancers.demo import DEMO_PASSWORDS, load_demo
from apps.balancers.models import Pool
from apps.fleets import demo as fleet_demo
from apps.fleets.models import Node, NodeHealth
from apps.traffic.models import OverflowPoint
from tests.browser import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo_fleet(transactional_db) -> list[Node]:
    """The demo (LB `edge`, two tenants) and its fleet rows: 2 regions x 2 nodes, all up, some traffic."""
    load_demo()
    fleet_demo.load_demo()
    Node.objects.update(status=Node.Status.UP, last_seen=timezone.now())
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(seconds=int(now.timestamp()) % 10)
    points = []
    for pool in Pool.objects.all():
        for i in range(30):
            demand = 60.0 + 5 * (i % 7)
            points += [OverflowPoint(pool=pool, time=start - timedelta(seconds=10 * i), resolution_s=10,
                                     region="us-east", capacity=50.0, demand=demand, local=50.0, out=demand - 50.0),
                       OverflowPoint(pool=pool, time=start - timedelta(seconds=10 * i), resolution_s=10,
                                     region="eu-west", capacity=100.0, demand=20.0, local=20.0,
                                     inflow=demand - 50.0)]
    OverflowPoint.objects.bulk_create(points)
    return list(Node.objects.select_related("fleet").order_by("fleet__name", "name"))


def test_operator_sees_fleet_health_change_live_without_a_reload(page, demo_fleet) -> None:
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    login(page, "admin", DEMO_PASSWORDS["admin"])
    health = page.locator("#fleet-health")
    assert "demo-us-east" in health.inner_text() and "demo-eu-west" in health.inner_text()
    assert "behind" not in health.inner_text()  # nothing rendered yet: no node is behind
    assert "Every health check passes" in page.locator("#failing-checks").inner_text()
    page.locator("#overflow-chart .uplot").wait_for()  # vendored uPlot drew the timeline
    page.evaluate("window.__sameDocument = true")
    before = len(navigations)

    node = demo_fleet[0]
    Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN, status_detail="master socket refused")
    pool = Pool.objects.get(name="acme-web")
    NodeHealth.objects.create(node=demo_fleet[1], proxy=f"p{pool.pk}_us-east", server="us-east-1", status="DOWN",
                              check_status="L4CON", updated_at=timezone.now())
    # The panels poll every 5 s: the change shows up within two polls.
    page.locator(f"#dash-node-{node.pk} .badge-down").wait_for(timeout=12_000)
    page.locator("#failing-checks", has_text="us-east-1").wait_for(timeout=12_000)
    assert "1 down" in health.inner_text()
    assert page.evaluate("window.__sameDocument") is True and len(navigations) == before
    shot(page, "dashboard-live-operator")
    assert not [e for e in page.console_errors if "Content Security Policy" in e]
