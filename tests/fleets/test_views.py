"""Fleet UI pages: what operators and customers see, live partials, preview and rollback buttons."""

from __future__ import annotations

import pytest

from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region, Route, RouteTarget
from apps.fleets import services
from apps.fleets.models import Fleet, Node, NodeResult, Rollout
from tests.personas import web

pytestmark = pytest.mark.django_db


@pytest.fixture
def edge(ops, acme):
    region = Region.objects.create(slug="us-east", name="US East")
    fleet = Fleet.objects.create(name="edge-us", region=region)
    lb = LoadBalancer.objects.create(org=ops, name="edge", shared=True, fleet=fleet)
    pool = Pool.objects.create(lb=lb, org=acme, name="acme-web")
    PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=50)
    Member.objects.create(pool=pool, region=region, name="m1", address="127.0.20.1", port=9101)
    route = Route.objects.create(lb=lb, org=acme, hosts=["acme.example.com"], path="/", priority=100)
    RouteTarget.objects.create(route=route, pool=pool, weight=100)
    Listener.objects.create(lb=lb, name="http", port=18081)
    node = Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                               config_dir="/etc/spw/n1", status="up")
    revision = services.fleet_render(fleet=fleet)
    rollout = services.rollout_create(fleet=fleet, revision=revision, enqueue=False)
    Rollout.objects.filter(pk=rollout.pk).update(status="failed", error="node n1: reload failed: acme.example.com")
    NodeResult.objects.filter(rollout=rollout).update(status="rolled_back", error="secret detail")
    Node.objects.filter(pk=node.pk).update(applied_revision=revision)
    return {"fleet": fleet, "lb": lb, "rollout": rollout, "revision": revision, "route": route}



def test_operator_sees_fleet_nodes_revisions_and_the_diff(edge, otto) -> None:
    client = web(otto)
    listing = client.get("/fleets/").content.decode()
    assert "edge-us" in listing and "1/1" in listing

    page = client.get(f"/fleets/{edge['fleet'].pk}/").content.decode()
    assert "n1" in page and "127.0.0.1" in page and "Config revisions" in page and "Render and push now" in page
    assert f'hx-get="/fleets/{edge["fleet"].pk}/nodes/"' in page

    revision = client.get(f"/fleets/{edge['fleet'].pk}/revisions/1/").content.decode()
    assert 'class="add"' in revision and "frontend fe_edge.http" in revision


def test_rollout_page_polls_while_active_and_offers_rollback_when_done(edge, otto) -> None:
    client = web(otto)
    rollout = edge["rollout"]
    done = client.get(f"/fleets/rollouts/{rollout.pk}/").content.decode()
    assert "rolled_back" in done and "secret detail" in done and "hx-trigger=\"every 1s\"" not in done
    Rollout.objects.filter(pk=rollout.pk).update(status="running")
    running = client.get(f"/fleets/rollouts/{rollout.pk}/progress/").content.decode()
    assert 'hx-trigger="every 1s"' in running and "<progress" in running
    # A node that took the change without a reload (runtime map update) says so instead of a time.
    rollout.results.update(status="succeeded", reload_ms=None, duration_ms=6.0)
    assert ">no reload</span>" in client.get(f"/fleets/rollouts/{rollout.pk}/progress/").content.decode()


def test_customer_sees_the_fleet_of_a_shared_lb_but_no_config_or_errors(edge, alice, charlie) -> None:
    client = web(alice)
    page = client.get(f"/fleets/{edge['fleet'].pk}/").content.decode()
    assert "node 1" in page and "Config revisions" not in page and "127.0.0.1" not in page
    assert client.get(f"/fleets/{edge['fleet'].pk}/revisions/1/").status_code == 404
    progress = client.get(f"/fleets/rollouts/{edge['rollout'].pk}/").content.decode()
    assert "secret detail" not in progress and "acme.example.com" not in progress
    assert client.post(f"/fleets/rollouts/{edge['rollout'].pk}/rollback/").status_code == 404

    LoadBalancer.objects.filter(pk=edge["lb"].pk).update(shared=False)
    assert web(charlie).get(f"/fleets/{edge['fleet'].pk}/").status_code == 404


def test_preview_page_renders_the_pending_diff_and_push_rolls_it_out(edge, otto) -> None:
    Fleet.objects.filter(pk=edge["fleet"].pk).update(auto_rollout=False)
    Route.objects.filter(pk=edge["route"].pk).update(path="/shop")
    client = web(otto)
    page = client.get(f"/fleets/lb/{edge['lb'].pk}/preview/").content.decode()
    assert "held" in page

    preview = client.post(f"/fleets/lb/{edge['lb'].pk}/preview/", HTTP_HX_REQUEST="true").content.decode()
    assert "/shop/ p" in preview and "Push now" in preview

    pushed = client.post(f"/fleets/lb/{edge['lb'].pk}/push/", HTTP_HX_REQUEST="true")
    rollout = Rollout.objects.order_by("-id").first()
    assert pushed.headers["HX-Redirect"] == f"/fleets/rollouts/{rollout.pk}/"
    assert rollout.revision.number == 2 and rollout.status == "pending"


def test_rollback_button_queues_a_rollback_rollout(edge, otto) -> None:
    services.fleet_render(fleet=edge["fleet"])
    Route.objects.filter(pk=edge["route"].pk).update(path="/v2")
    second = services.fleet_push(fleet=edge["fleet"])
    response = web(otto).post(f"/fleets/rollouts/{second.pk}/rollback/", HTTP_HX_REQUEST="true")
    back = Rollout.objects.order_by("-id").first()
    assert response.headers["HX-Redirect"] == f"/fleets/rollouts/{back.pk}/"
    assert back.kind == "rollback" and back.revision.number == 1


def test_a_node_of_a_fleet_with_nothing_rendered_is_not_called_behind(ops, otto):
    """'behind' means the node serves an older revision than the fleet wants; with nothing rendered yet there is
    nothing to be behind (the walk of every page found every new fleet's nodes marked behind)."""
    region = Region.objects.create(slug="us-west", name="US West")
    fleet = Fleet.objects.create(name="fresh", region=region)
    node = Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/run/spw/f1",
                               config_dir="/etc/spw/f1")
    page = web(otto).get(f"/fleets/{fleet.pk}/").content.decode()
    row = page.split(f'id="node-{node.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "behind" not in row
    Fleet.objects.filter(pk=fleet.pk).update(desired_revision=1)
    page = web(otto).get(f"/fleets/{fleet.pk}/").content.decode()
    assert "behind" in page.split(f'id="node-{node.pk}"', 1)[1].split("</tr>", 1)[0]


def test_fleet_pages_and_lists_leave_each_revisions_bulk_unread(edge, otto) -> None:
    """A full revision at 100k routes holds megabytes of text and snapshot, and a fleet serving many LBs an entry per
    LB: joined to every node and rollout row, the fleet page and its panels (polled every 2-3 s) read them all, 0.9 s
    a node. What the pages and lists show comes from the other columns: their statements never select the bulk."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fleet, revision = edge["fleet"], edge["revision"]
    for i in range(2, 6):
        Node.objects.create(fleet=fleet, name=f"n{i}", address="127.0.0.1", runtime_dir=f"/run/spw/n{i}",
                            config_dir=f"/etc/spw/n{i}", status="up", applied_revision=revision)
    Fleet.objects.filter(pk=fleet.pk).update(desired_revision=revision.number)
    bulk = ('"snapshot"', '"text"', '"diff"', '"validation_output"', '"lb_revisions"', '"problems"')
    page, api = web(otto), otto.client
    with CaptureQueriesContext(connection) as captured:
        shown = {
            "page": page.get(f"/fleets/{fleet.pk}/").content.decode(),
            "nodes": page.get(f"/fleets/{fleet.pk}/nodes/").content.decode(),
            "rollouts": page.get(f"/fleets/{fleet.pk}/rollouts/").content.decode(),
            "api nodes": api.get(f"/api/v1/nodes/?fleet={fleet.pk}").json(),
            "api rollouts": api.get(f"/api/v1/rollouts/?fleet={fleet.pk}").json(),
        }
    revision_selects = [q["sql"] for q in captured.captured_queries
                        if q["sql"].startswith("SELECT") and '"fleets_configrevision"' in q["sql"]]
    assert revision_selects
    assert not [sql for sql in revision_selects if any(f'"fleets_configrevision".{col}' in sql for col in bulk)]
    # What they show is still there: every node on the desired revision, the rollout's revision number.
    assert shown["nodes"].count(f"<td>{revision.number} / {revision.number}</td>") == 5
    assert "behind" not in shown["nodes"]
    assert {n["name"] for n in shown["api nodes"]["results"]} == {"n1", "n2", "n3", "n4", "n5"}
    assert {n["applied_revision"] for n in shown["api nodes"]["results"]} == {revision.number}
    assert [r["revision"] for r in shown["api rollouts"]["results"]] == [revision.number]
    # The revisions list answers each revision's lb_revisions, not its text, diff, check output or snapshot.
    with CaptureQueriesContext(connection) as captured:
        revisions = api.get(f"/api/v1/config-revisions/?fleet={fleet.pk}").json()
    assert not [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT") and any(
        f'"fleets_configrevision".{col}' in q["sql"] for col in bulk[:4])]
    listed = [(r["number"], r["sha256"]) for r in revisions["results"]]
    assert listed == [(revision.number, revision.sha256)]
    detail = api.get(f"/api/v1/config-revisions/{revision.pk}/").json()  # the one that answers the bulk still does
    assert detail["text"] == revision.text and detail["diff"] == revision.diff
    assert f"#{revision.number}" in shown["page"] and "→ 1" in shown["rollouts"]
