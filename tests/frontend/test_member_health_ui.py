"""Member health in the pool table (polled in place) and on the dashboard; a drain counts its open sessions
down to zero. NodeHealth rows are written as the health collection writes them (the real collection from
HAProxy is tests/fleets/health/test_member_health.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.balancers.models import Member, PoolRegion
from apps.fleets.models import Fleet, Node, NodeHealth
from tests.factories import LoadBalancerFactory, PoolFactory, RegionFactory
from tests.personas import web

pytestmark = pytest.mark.django_db



@pytest.fixture
def pool(alice):
    us = RegionFactory(slug="us-east")
    fleet = Fleet.objects.create(name="edge", region=us)
    lb = LoadBalancerFactory(name="acme-lb", org=alice.org, fleet=fleet)
    pool = PoolFactory(lb=lb, org=alice.org, name="web")
    PoolRegion.objects.create(pool=pool, region=us)
    nodes = [Node.objects.create(fleet=fleet, name=f"n{i}", address="127.0.0.1", runtime_dir=f"/run/x/n{i}",
                                 config_dir=f"/etc/x/n{i}") for i in (1, 2)]
    now = timezone.now()
    for port, (name, status, check, sessions) in enumerate((("ok-1", "UP", "L7OK", 1), ("bad-1", "DOWN", "L4CON", 0),
                                                            ("drn-1", "DRAIN", "L7OK", 3)), start=8001):
        admin = "drain" if name == "drn-1" else "active"
        Member.objects.create(pool=pool, region=us, name=name, address="192.0.2.10", port=port, admin_state=admin)
        for node in nodes:
            NodeHealth.objects.create(node=node, proxy=f"p{pool.pk}_us-east", server=name, status=status,
                                      check_status=check, sessions=sessions, updated_at=now,
                                      changed_at=now - timedelta(minutes=5))
    return pool


def test_pool_table_shows_each_members_live_health(alice, pool):
    page = web(alice).get(reverse("lb-detail", args=[pool.lb_id])).content.decode()
    ok = page.split(f'id="member-{Member.objects.get(name="ok-1").pk}-health"')[1].split("</td>")[0]
    assert "up</strong> on 2/2 nodes" in ok and "2 sessions open" in ok and "checks pass" in ok
    assert "changed 5\xa0minutes ago" in ok
    bad = page.split(f'id="member-{Member.objects.get(name="bad-1").pk}-health"')[1]
    assert "down</strong> on 2/2 nodes" in bad and "<code>L4CON</code>" in bad
    drain = page.split(f'id="member-{Member.objects.get(name="drn-1").pk}-health"')[1]
    assert "6 sessions open</span> (draining)" in drain
    assert reverse("pool-health", args=[pool.pk]) in page


def test_drain_counts_down_to_zero_in_the_polled_partial(alice, bob, charlie, pool):
    url = reverse("pool-health", args=[pool.pk])
    drn = Member.objects.get(name="drn-1")
    first = web(bob).get(url).content.decode()
    assert f'id="member-{drn.pk}-health"' in first and 'hx-swap-oob="true"' in first
    assert "6 sessions open" in first
    NodeHealth.objects.filter(server="drn-1").update(sessions=0)
    later = web(bob).get(url).content.decode().split(f'id="member-{drn.pk}-health"')[1]
    assert "drained</strong>" in later and "0 sessions open" in later and "safe to remove" in later
    assert web(charlie).get(url).status_code == 404


def test_dashboard_members_panel(alice, charlie, pool):
    page = web(alice).get(reverse("dashboard-panel", args=["members"])).content.decode()
    assert "1 up" in page and "1 down" in page and "1 draining" in page
    table = page.split('id="members-table"')[1]
    assert table.index("bad-1") < table.index("drn-1")  # down first, then draining
    assert "ok-1" not in table
    outsider = web(charlie).get(reverse("dashboard-panel", args=["members"])).content.decode()
    assert "No members yet" in outsider and "bad-1" not in outsider
