"""Dashboard panels with the test Client: what operators and customers see, worst checks first,
nothing of another tenant (items or counts), and a query count that does not grow with rows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from itertools import count

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.services import principal_for_user
from apps.audit.models import AuditEvent
from apps.balancers.models import LoadBalancer, Member, Pool, Region, Route
from apps.fleets.models import ConfigRevision, Fleet, Node, NodeHealth, NodeResult, Rollout
from apps.traffic.models import CapacityState, OverflowPoint
from apps.traffic.selectors import region_overflow
from tests.personas import web

pytestmark = pytest.mark.django_db

PANELS = ("fleets", "checks", "members", "overflow", "rollouts", "audit", "lbs")
_seq = count(1)


@dataclass
class World:
    us: Region
    eu: Region
    edge: LoadBalancer
    fleet: Fleet
    acme_pool: Pool
    globex_pool: Pool
    n1: Node
    n2: Node



def health(node: Node, pool: Pool, region: str, server: str, status: str, check: str = "L7OK") -> NodeHealth:
    return NodeHealth.objects.create(node=node, proxy=f"p{pool.pk}_{region}", server=server, status=status,
                                     check_status=check, updated_at=timezone.now())


def points(pool: Pool, region: str, *, demand: float, out: float, capacity: float | None, buckets: int = 6) -> None:
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(seconds=now.second % 10)
    OverflowPoint.objects.bulk_create([
        OverflowPoint(pool=pool, time=start - timedelta(seconds=10 * i), resolution_s=10, region=region,
                      capacity=capacity, demand=demand, local=demand - out, out=out, inflow=0.0)
        for i in range(buckets)
    ])
    CapacityState.objects.create(pool=pool, region=region, healthy_members=2, capacity=capacity)


def rollout(fleet: Fleet, status: str, nodes: list[Node], done: int) -> Rollout:
    number = next(_seq)
    revision = ConfigRevision.objects.create(fleet=fleet, number=number, text="global\n", sha256=f"{number:064x}")
    r = Rollout.objects.create(fleet=fleet, revision=revision, from_revision=number - 1, status=status)
    for i, node in enumerate(nodes):
        NodeResult.objects.create(rollout=r, node=node, status="succeeded" if i < done else "pending")
    return r


@pytest.fixture
def world(ops, acme, globex) -> World:
    us = Region.objects.create(slug="us-east", name="US East")
    eu = Region.objects.create(slug="eu-west", name="EU West")
    fleet = Fleet.objects.create(name="edge-us", region=us, desired_revision=2)
    edge = LoadBalancer.objects.create(org=ops, name="edge", shared=True, fleet=fleet)
    pools = {}
    for org, priority in ((acme, 100), (globex, 200)):
        pool = Pool.objects.create(lb=edge, org=org, name=f"{org.slug}-web")
        Member.objects.create(pool=pool, region=us, name=f"{org.slug}-m1", address="127.0.20.1", port=9101)
        Route.objects.create(lb=edge, org=org, hosts=[f"{org.slug}.example.com"], path="/", priority=priority)
        pools[org.slug] = pool
    Route.objects.create(lb=edge, org=globex, hosts=["globex.example.com"], path="/b", priority=201)
    n1 = Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/r1", config_dir="/c1",
                             status="up")
    n2 = Node.objects.create(fleet=fleet, name="n2", address="127.0.0.2", runtime_dir="/r2", config_dir="/c2",
                             status="down", status_detail="connection refused")
    # globex-m1 is down on both nodes; acme-m1 is failing on one ("UP 1/3"), fine on the other.
    health(n1, pools["globex"], "us-east", "globex-m1", "DOWN", "L4CON")
    health(n2, pools["globex"], "us-east", "globex-m1", "DOWN", "L4TOUT")
    health(n1, pools["acme"], "us-east", "acme-m1", "UP 1/3", "L7STS")
    health(n2, pools["acme"], "us-east", "acme-m1", "UP", "L7OK")
    health(n1, pools["acme"], "us-east", "BACKEND", "UP", "")
    points(pools["acme"], "us-east", demand=30.0, out=5.0, capacity=25.0)
    points(pools["globex"], "us-east", demand=700.0, out=300.0, capacity=400.0)
    rollout(fleet, "succeeded", [n1, n2], done=2)
    rollout(fleet, "running", [n1, n2], done=1)
    AuditEvent.objects.create(actor="user:1", org=acme, action="route.create", object_type="route", object_id="1")
    AuditEvent.objects.create(actor="user:2", org=globex, action="pool.secretive", object_type="pool",
                              object_id="2")
    return World(us=us, eu=eu, edge=edge, fleet=fleet, acme_pool=pools["acme"], globex_pool=pools["globex"],
                 n1=n1, n2=n2)


def test_operator_sees_every_panel_with_its_data(world, otto) -> None:
    page = web(otto).get("/").content.decode()
    assert "edge-us" in page and "1 down" in page and "connection refused" in page
    assert "2 behind" in page  # desired revision 2, neither node has applied it
    assert re.search(r"edge-us/n2</td>\s*<td><span class=\"badge badge-down\">down", page)
    assert "globex-m1" in page and "acme-m1" in page and "L4CON" in page
    # Overflow summed over both pools in us-east: capacity 425, demand 730, out 305.
    table = page[page.index('id="overflow-table"'):]
    assert "425.0/s" in table and "730.0" in table and "305.0" in table
    assert 'id="overflow-series"' in page and 'id="overflow-chart"' in page
    running = Rollout.objects.get(status="running")
    assert f'href="/fleets/rollouts/{running.pk}/"' in page and "1/2" in page
    assert "route.create" in page and "pool.secretive" in page
    for panel in ("fleets", "checks", "members", "overflow", "rollouts", "audit"):
        assert f'hx-get="/dashboard/{panel}/' in page
    assert page.count('hx-trigger="every 5s"') == 6


def test_failing_checks_are_listed_worst_first(world, otto) -> None:
    partial = web(otto).get("/dashboard/checks/").content.decode()
    assert "<html" not in partial
    # Down on both nodes comes before failing on one of two; a passing server is not listed.
    assert partial.index("globex-m1") < partial.index("acme-m1")
    assert "down on 2/2" in partial and "failing on 1/2" in partial
    Node.objects.filter(pk=world.n2.pk).update(enabled=False)  # a disabled node's rows do not count
    partial = web(otto).get("/dashboard/checks/").content.decode()
    assert "down on 1/1" in partial


def test_customer_sees_only_its_own_items_and_counts(world, alice) -> None:
    page = web(alice).get("/").content.decode()
    assert "acme-m1" in page and "globex-m1" not in page and "L4CON" not in page
    assert "route.create" in page and "pool.secretive" not in page
    # The shared LB carries 1 acme route and 2 globex routes: acme's count is 1.
    row = re.search(r'<a href="/load-balancers/\d+/">edge</a>.*?</tr>', page, re.S).group(0)
    assert re.findall(r"<td>(\d+)</td>", row)[0] == "1"
    # Overflow is acme's pool alone, and node server counts only acme's servers.
    table = page[page.index('id="overflow-table"'):]
    assert "25.0/s" in table and "30.0" in table and "730.0" not in table
    assert "1/1" in page[page.index('id="dash-node-'):]  # acme-m1 on n1, not 2/2 with globex's
    assert "connection refused" not in page  # node error details are for operators


def test_outsider_sees_none_of_acmes_items(world, charlie) -> None:
    client = web(charlie)
    checks = client.get("/dashboard/checks/").content.decode()
    assert "globex-m1" in checks and "acme-m1" not in checks
    audit = client.get("/dashboard/audit/").content.decode()
    assert "pool.secretive" in audit and "route.create" not in audit
    overflow = client.get("/dashboard/overflow/").content.decode()
    assert "700.0" in overflow and "730.0" not in overflow
    lbs = client.get("/dashboard/lbs/").content.decode()
    row = re.search(r'<a href="/load-balancers/\d+/">edge</a>.*?</tr>', lbs, re.S).group(0)
    assert re.findall(r"<td>(\d+)</td>", row)[0] == "2"


def test_each_panel_renders_alone_and_unknown_panels_are_404(world, otto) -> None:
    client = web(otto)
    for panel in PANELS:
        response = client.get(f"/dashboard/{panel}/", HTTP_HX_REQUEST="true")
        assert response.status_code == 200 and b"<html" not in response.content, panel
    assert client.get("/dashboard/nope/").status_code == 404
    assert Client().get("/dashboard/fleets/").status_code == 302  # login first


def test_a_customer_without_fleets_sees_clear_empty_states(charlie) -> None:
    page = web(charlie).get("/").content.decode()
    assert "No fleets serve your load balancers yet" in page and "No HAProxy nodes yet, so no health checks" in page
    assert "No rollouts yet" in page and "No load balancers yet" in page


def test_no_check_passes_when_no_node_answers(otto) -> None:
    """0/2 nodes up reads no health check at all: the panel must not say every check passes."""
    fleet = Fleet.objects.create(name="dark", region=Region.objects.create(slug="dark-1", name="Dark"))
    for k in range(2):
        Node.objects.create(fleet=fleet, name=f"n{k}", address="127.0.0.1", runtime_dir=f"/rd{k}",
                            config_dir=f"/cd{k}", status=Node.Status.DOWN)
    panel = web(otto).get("/dashboard/checks/").content.decode()
    assert "Every health check passes" not in panel
    assert "No health results: 0/2 nodes up" in panel
    Node.objects.filter(name="n0").update(status=Node.Status.UP)
    panel = web(otto).get("/dashboard/checks/").content.decode()
    assert "Every health check passes on the 1/2 nodes that answer; 1 not up" in panel
    Node.objects.update(status=Node.Status.UP)
    assert "Every health check passes (2/2 nodes up)" in web(otto).get("/dashboard/checks/").content.decode()


def grow(world: World, n: int) -> None:
    """n more LBs with a pool, 3 members, a route, a fleet with 2 nodes and their health rows,
    traffic points, rollouts and audit events for each of acme and globex."""
    for i in range(n):
        tag = next(_seq)
        fleet = Fleet.objects.create(name=f"f{tag}", region=world.eu if i % 2 else world.us, desired_revision=1)
        nodes = [Node.objects.create(fleet=fleet, name=f"n{k}", address="127.0.0.1", runtime_dir=f"/r{tag}{k}",
                                     config_dir=f"/c{tag}{k}", status=("up", "drifted", "down")[k % 3])
                 for k in range(2)]
        for org in (world.acme_pool.org, world.globex_pool.org):
            lb = LoadBalancer.objects.create(org=org, name=f"lb{tag}-{org.slug}", fleet=fleet)
            pool = Pool.objects.create(lb=lb, org=org, name=f"pool{tag}")
            Route.objects.create(lb=lb, org=org, hosts=[f"h{tag}.{org.slug}.example.com"], path="/", priority=1)
            Route.objects.create(lb=world.edge, org=org, hosts=[f"{org.slug}.example.com"], path=f"/{tag}",
                                 priority=1000 + tag * 2 + (org.slug == "acme"))
            for k in range(3):
                Member.objects.create(pool=pool, region=world.us, name=f"m{k}", address="127.0.20.1", port=9101 + k)
                for node in nodes:
                    health(node, pool, "us-east", f"m{k}", ("UP", "DOWN", "UP 2/3")[(k + i) % 3], "L4CON")
            points(pool, "us-east" if i % 2 else "eu-west", demand=10.0 * (i + 1), out=i, capacity=None)
            AuditEvent.objects.create(actor="user:1", org=org, action="pool.create", object_type="pool",
                                      object_id=str(pool.pk))
        rollout(fleet, "failed", nodes, done=1)


def queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("persona", ["otto", "alice"])
def test_query_count_does_not_grow_with_rows(world, persona, request) -> None:
    client = web(request.getfixturevalue(persona))
    urls = ["/", "/?window=24h", *[f"/dashboard/{p}/" for p in PANELS]]
    client.get("/")  # session and principal lookups warm up the same way for both sizes
    grow(world, 2)
    before = {url: queries(client, url) for url in urls}
    grow(world, 12)
    after = {url: queries(client, url) for url in urls}
    assert after == before
    assert before["/"] <= 25, before


def test_long_windows_read_5_min_points_then_the_newest_10_s_ones(world, otto) -> None:
    now = timezone.now().replace(microsecond=0)
    coarse = now - timedelta(seconds=int(now.timestamp()) % 300 + 3600)
    OverflowPoint.objects.create(pool=world.acme_pool, time=coarse, resolution_s=300, region="eu-west",
                                 capacity=10.0, demand=40.0, local=10.0, out=30.0)
    OverflowPoint.objects.create(pool=world.acme_pool, time=coarse - timedelta(days=2), resolution_s=300,
                                 region="eu-west", capacity=10.0, demand=99.0, local=10.0, out=89.0)
    principal = principal_for_user(otto.user, None)
    day = region_overflow(principal, 86400, now=now)
    assert day["resolution_s"] == 300 and day["series"]["time"][0] == int(coarse.timestamp())
    eu = day["series"]["regions"]["eu-west"]
    assert eu["demand"][0] == 40.0 and 99.0 not in eu["demand"]  # two days old: outside the window
    # After the last 5 min point come the fixture's 10 s points (not downsampled yet).
    assert len(day["series"]["time"]) == 1 + 6 and day["latest_time"] > coarse
    short = region_overflow(principal, 900, now=now)
    assert short["resolution_s"] == 10 and len(short["series"]["time"]) == 6
    us = {r["region"]: r for r in short["regions"]}["us-east"]
    assert (us["capacity"], us["demand"], us["out"]) == (425.0, 730.0, 305.0)
    assert [p.pool_id for p in short["top"]] == [world.globex_pool.pk, world.acme_pool.pk]


def test_a_long_windows_mean_weighs_each_bucket_by_its_length(world, otto) -> None:
    """GIVEN one 5 min point in eu-west and the fixture's six 10 s points (the newest minute, not
    downsampled yet) in us-east, WHEN the 24 h mean is taken, THEN a 10 s bucket counts 1/30 of a
    5 min one: the newest minute must not outweigh the hours before it."""
    now = timezone.now().replace(microsecond=0)
    coarse = now - timedelta(seconds=int(now.timestamp()) % 300 + 3600)
    OverflowPoint.objects.create(pool=world.acme_pool, time=coarse, resolution_s=300, region="eu-west",
                                 capacity=10.0, demand=40.0, local=10.0, out=30.0)

    day = region_overflow(principal_for_user(otto.user, None), 86400, now=now)

    mean = {r["region"]: r["mean"] for r in day["regions"]}
    span_s = 300 + 6 * 10
    assert mean["eu-west"]["demand"] == round(40.0 * 300 / span_s, 3)
    assert mean["us-east"]["demand"] == round(730.0 * 60 / span_s, 3)


def test_a_fleet_with_nothing_rendered_is_neither_on_desired_nor_behind(world, otto) -> None:
    """Before its first render a fleet has no desired revision: its nodes are not '2/2 on desired' and not
    'behind' (both false; the page walk found the first on the demo's fresh fleets)."""
    Fleet.objects.filter(pk=world.fleet.pk).update(desired_revision=0)
    panel = web(otto).get("/dashboard/fleets/").content.decode()
    fleet_row = panel.split("edge-us</a>", 1)[1].split("</tr>", 1)[0]
    assert "nothing rendered yet" in fleet_row, fleet_row
    assert "behind" not in panel, panel  # the fleet's row and its nodes' rows
