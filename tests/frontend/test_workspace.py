"""LB workspace and hostname pages, server-rendered (the browser journeys: test_workspace_browser.py)."""

from __future__ import annotations

import re

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import (
    HostnameClaim,
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    Route,
    RouteTarget,
    StaticIP,
)
from apps.fleets import services as fleet_services
from apps.fleets.models import Fleet, Node, Rollout
from tests.personas import web

pytestmark = pytest.mark.django_db



def _pool(lb, org, name, region, address):
    pool = Pool.objects.create(lb=lb, org=org, name=name)
    PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=50)
    Member.objects.create(pool=pool, region=region, name="m1", address=address, port=9101)
    return pool


def _route(lb, org, host, priority, pool, path="/"):
    route = Route.objects.create(lb=lb, org=org, hosts=[host], path=path, priority=priority)
    RouteTarget.objects.create(route=route, pool=pool, weight=100)
    return route


@pytest.fixture
def edge(ops, acme, globex):
    """A shared LB of the operators carrying routes of acme and globex, served by one fleet."""
    region = Region.objects.create(slug="us-east", name="US East")
    fleet = Fleet.objects.create(name="edge-us", region=region)
    lb = LoadBalancer.objects.create(org=ops, name="edge", shared=True, fleet=fleet)
    Listener.objects.create(lb=lb, name="http", port=18081)
    Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                        config_dir="/etc/spw/n1", status="up")
    acme_pool = _pool(lb, acme, "acme-web", region, "127.0.20.1")
    globex_pool = _pool(lb, globex, "globex-web", region, "127.0.20.2")
    HostnameClaim.objects.create(org=acme, hostname="acme.example.com", status="approved")
    HostnameClaim.objects.create(org=acme, hostname="*.acme.test", status="approved")
    HostnameClaim.objects.create(org=globex, hostname="globex.example.com", status="approved")
    return {
        "lb": lb, "fleet": fleet, "region": region, "acme_pool": acme_pool, "globex_pool": globex_pool,
        "acme_routes": [_route(lb, acme, "acme.example.com", p, acme_pool, f"/r{p}") for p in (300, 100, 200)],
        "globex_route": _route(lb, globex, "globex.example.com", 150, globex_pool),
    }


def priorities(html: str) -> list[int]:
    return [int(p) for p in re.findall(r'<tr id="route-\d+"><td>(\d+)</td>', html)]


def test_routes_sort_by_priority_both_ways_and_the_header_toggles(edge, alice):
    client = web(alice)
    lb = edge["lb"]
    page = client.get(f"/load-balancers/{lb.pk}/").content.decode()
    assert priorities(page) == [100, 200, 300]  # only acme's routes, ascending
    assert f'hx-get="/load-balancers/{lb.pk}/routes/?order=desc"' in page
    partial = client.get(f"/load-balancers/{lb.pk}/routes/", {"order": "desc"}).content.decode()
    assert "<html" not in partial and priorities(partial) == [300, 200, 100]
    assert f'hx-get="/load-balancers/{lb.pk}/routes/?order=asc"' in partial and 'aria-sort="descending"' in partial


def test_inline_edit_shows_errors_next_to_the_field_and_saves_through_route_save(edge, alice):
    client = web(alice)
    route = edge["acme_routes"][1]  # priority 100
    pool = edge["acme_pool"]
    form = client.get(f"/routes/{route.pk}/edit/", HTTP_HX_REQUEST="true").content.decode()
    assert f'name="weight_{pool.pk}"' in form and 'value="100"' in form
    assert f"weight_{edge['globex_pool'].pk}" not in form  # another tenant's pool is no target

    taken = client.post(f"/routes/{route.pk}/edit/", {"hosts": "acme.example.com", "path": "/r100",
                                                      "path_match": "prefix", "priority": "200",
                                                      f"weight_{pool.pk}": "100"}, HTTP_HX_REQUEST="true")
    assert taken.status_code == 422
    body = taken.content.decode()
    # A priority of another acme route: refused next to the priority field. (Globex's 150 is no
    # collision: priorities are per tenant, so nothing about globex can show here.)
    assert re.search(rf'id="re{route.pk}-priority-err" class="field-error">Priority 200 is already used', body)
    assert "globex" not in body and 'value="200"' in body
    unclaimed = client.post(f"/routes/{route.pk}/edit/", {"hosts": "globex.example.com", "path": "/r100",
                                                          "priority": "100", f"weight_{pool.pk}": "100"})
    assert unclaimed.status_code == 422 and f'id="re{route.pk}-hosts-err"' in unclaimed.content.decode()
    revision = LoadBalancer.objects.get(pk=edge["lb"].pk).revision

    saved = client.post(f"/routes/{route.pk}/edit/", {"hosts": "shop.acme.test, acme.example.com",
                                                      "path": "/shop", "path_match": "exact", "priority": "110",
                                                      f"weight_{pool.pk}": "40"}, HTTP_HX_REQUEST="true")
    assert saved.status_code == 200
    assert f'<tr id="route-{route.pk}"><td>110</td>' in saved.content.decode()
    route.refresh_from_db()
    assert (route.hosts, route.path, route.path_match, route.priority) == (
        ["acme.example.com", "shop.acme.test"], "/shop", "exact", 110)
    assert list(route.targets.values_list("pool_id", "weight")) == [(pool.pk, 40)]
    assert LoadBalancer.objects.get(pk=edge["lb"].pk).revision == revision + 1
    assert AuditEvent.objects.filter(action="route.update", object_id=str(route.pk)).count() == 1


def test_deleting_a_route_removes_its_row_and_only_its_owner_may(edge, alice, charlie, vera):
    route = edge["acme_routes"][0]
    assert web(charlie).delete(f"/routes/{route.pk}/").status_code == 404
    assert web(vera).delete(f"/routes/{route.pk}/").status_code == 403
    response = web(alice).delete(f"/routes/{route.pk}/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response.content == b""
    assert not Route.objects.filter(pk=route.pk).exists()
    assert AuditEvent.objects.filter(action="route.delete", object_id=str(route.pk)).exists()


def test_another_tenants_route_claim_and_decide_urls_are_404(edge, alice, charlie):
    client = web(alice)
    globex_route = edge["globex_route"]
    globex_claim = HostnameClaim.objects.get(hostname="globex.example.com")
    for url in (f"/routes/{globex_route.pk}/", f"/routes/{globex_route.pk}/edit/", f"/hostnames/{globex_claim.pk}/"):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/routes/{globex_route.pk}/edit/", {"priority": "1"}).status_code == 404
    own_claim = HostnameClaim.objects.get(hostname="acme.example.com")
    # Deciding is an operator's: for a customer the URL does not exist, even for its own claim.
    assert client.post(f"/hostnames/{own_claim.pk}/approve/").status_code == 404
    assert client.get(f"/routes/{edge['acme_routes'][0].pk}/").status_code == 200
    page = client.get(f"/hostnames/{own_claim.pk}/").content.decode()
    assert "/r100" in page and "globex" not in page


def test_workspace_and_lb_search_show_a_customer_nothing_of_another_tenant(edge, alice, charlie, globex):
    LoadBalancer.objects.create(org=globex, name="globex-private")
    own = LoadBalancer.objects.create(org=edge["acme_pool"].org, name="acme-private")
    client = web(alice)
    page = client.get(f"/load-balancers/{edge['lb'].pk}/").content.decode()
    assert "globex" not in page and "acme-web" in page
    assert "Listeners" not in page  # a shared LB's listeners are the operators'
    search = client.get("/load-balancers/", {"q": "private"}, HTTP_HX_REQUEST="true").content.decode()
    assert "acme-private" in search and "globex-private" not in search
    assert client.get(f"/load-balancers/{own.pk}/").status_code == 200
    claims = client.get("/hostnames/").content.decode()
    assert "globex" not in claims and "acme.example.com" in claims


def test_member_weight_and_state_go_through_the_service_and_show_in_the_row(edge, alice):
    member = edge["acme_pool"].members.get()
    client = web(alice)
    response = client.post(f"/members/{member.pk}/state/", {"admin_state": "active", "weight": "37"},
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert '<td class="weight">37</td>' in response.content.decode()
    member.refresh_from_db()
    assert member.weight == 37 and member.admin_state == "active"
    event = AuditEvent.objects.get(action="member.state", object_id=str(member.pk))
    assert event.before["weight"] == 100 and event.after["weight"] == 37

    bad = client.post(f"/members/{member.pk}/state/", {"admin_state": "active", "weight": "300"})
    assert bad.status_code == 422 and f'id="member-{member.pk}-err"' in bad.content.decode()
    assert "256" in bad.content.decode()
    member.refresh_from_db()
    assert member.weight == 37


def test_a_weight_change_queues_the_runtime_api_task_after_commit(edge, alice, monkeypatch,
                                                                   django_capture_on_commit_callbacks):
    """GIVEN a member of a pool served by a fleet WHEN its weight changes in the workspace THEN, once
    the transaction commits, the fleets receiver queues the task that sets it on every node."""
    from apps.fleets import receivers, tasks

    member = edge["acme_pool"].members.get()
    queued: list[int] = []
    monkeypatch.setattr(tasks.member_runtime_task, "apply_async", lambda args, *rest, **kw: queued.append(*args))
    monkeypatch.setattr(receivers.services, "fleet_mark_changed", lambda **kwargs: False)  # no broker needed
    with django_capture_on_commit_callbacks(execute=True):
        web(alice).post(f"/members/{member.pk}/state/", {"admin_state": "drain", "weight": "5"})
    assert queued == [member.pk]


def test_previewing_a_new_route_shows_its_diff_and_keeps_nothing(edge, alice):
    fleet_services.fleet_render(fleet=edge["fleet"])  # revision 1: what the nodes would serve now
    Fleet.objects.filter(pk=edge["fleet"].pk).update(desired_revision=1)
    lb = edge["lb"]
    revision, routes, events = lb.revision, Route.objects.count(), AuditEvent.objects.count()
    response = web(alice).post(f"/load-balancers/{lb.pk}/routes/preview/", {
        "hosts": "shop.acme.test", "path": "/", "path_match": "prefix", "priority": "120",
        "pool": edge["acme_pool"].pk}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert re.search(r'<span class="add">\+.*shop\.acme\.test', body), body
    assert "globex" not in body and "passes haproxy -c" in body
    assert f"<code>p{edge['acme_pool'].pk}</code> = pool {edge['acme_pool'].name}" in body  # the legend
    assert 'value="shop.acme.test"' in body  # the form keeps what was typed, ready to save
    lb.refresh_from_db()
    assert (lb.revision, Route.objects.count(), AuditEvent.objects.count()) == (revision, routes, events)

    refused = web(alice).post(f"/load-balancers/{lb.pk}/routes/preview/", {
        "hosts": "globex.example.com", "path": "/", "priority": "121", "pool": edge["acme_pool"].pk})
    assert refused.status_code == 422 and 'id="rf-hosts-err"' in refused.content.decode()


def test_the_deploy_panel_polls_until_every_node_serves_the_revision(edge, alice):
    lb, fleet = edge["lb"], edge["fleet"]
    Fleet.objects.filter(pk=fleet.pk).update(change_seq=2, rendered_seq=1, reconcile_queued=True)
    waiting = web(alice).get(f"/load-balancers/{lb.pk}/deploy/").content.decode()
    assert 'hx-trigger="every 1s"' in waiting and "queued" in waiting
    assert "served by <span id=\"deploy-done\">0</span> of 1 node" in waiting

    revision = fleet_services.fleet_render(fleet=fleet)
    rollout = fleet_services.rollout_create(fleet=fleet, revision=revision, enqueue=False)
    Fleet.objects.filter(pk=fleet.pk).update(rendered_seq=2, reconcile_queued=False)
    running = web(alice).get(f"/load-balancers/{lb.pk}/deploy/").content.decode()
    assert 'hx-trigger="every 1s"' in running and f'/fleets/rollouts/{rollout.pk}/' in running
    assert 'badge-pending">pending' in running

    Rollout.objects.filter(pk=rollout.pk).update(status="succeeded")
    rollout.results.update(status="succeeded")
    Node.objects.filter(fleet=fleet).update(applied_revision=revision)
    done = web(alice).get(f"/load-balancers/{lb.pk}/deploy/").content.decode()
    assert 'hx-trigger="every 1s"' not in done and 'id="deploy-summary" class="badge badge-done">done' in done
    assert "served by <span id=\"deploy-done\">1</span> of 1 node" in done


def test_operators_see_revision_history_with_diff_links_customers_only_rollouts(edge, alice, otto):
    revision = fleet_services.fleet_render(fleet=edge["fleet"])
    fleet_services.rollout_create(fleet=edge["fleet"], revision=revision, enqueue=False)
    url = f"/load-balancers/{edge['lb'].pk}/"
    operator = web(otto).get(url).content.decode()
    assert f'/fleets/{edge["fleet"].pk}/revisions/1/' in operator and "Config revisions" in operator
    assert "globex.example.com" in operator  # operators see every tenant's routes
    customer = web(alice).get(url).content.decode()
    assert "Config revisions" not in customer and "/fleets/rollouts/" in customer
    assert "Add route and push" in customer  # the fleet rolls out on save


def test_static_ips_reserve_and_release_for_the_callers_org(edge, alice, charlie, acme, globex):
    ip_pool = IpPool.objects.create(name="vips", cidr="10.9.0.0/30", region=edge["region"])
    StaticIP.objects.create(pool=ip_pool, address="10.9.0.2", org=globex, state="reserved")
    client = web(alice)
    url = f"/load-balancers/{edge['lb'].pk}/static-ips/"
    taken = client.post(url, {"pool": ip_pool.pk, "address": "10.9.0.2"})
    assert taken.status_code == 422 and 'id="ip-address-err"' in taken.content.decode()
    outside = client.post(url, {"pool": ip_pool.pk, "address": "10.8.0.1"})
    assert outside.status_code == 422 and "is not inside 10.9.0.0/30" in outside.content.decode()
    reserved = client.post(url, {"pool": ip_pool.pk, "address": ""})
    body = reserved.content.decode()
    assert reserved.status_code == 200 and "10.9.0.1" in body and "10.9.0.2" not in body  # globex's is hidden
    ip = StaticIP.objects.get(address="10.9.0.1")
    assert ip.org == acme and ip.state == "reserved"
    assert web(charlie).post(f"/load-balancers/{edge['lb'].pk}/static-ips/{ip.pk}/release/").status_code == 404
    released = client.post(f"/load-balancers/{edge['lb'].pk}/static-ips/{ip.pk}/release/")
    assert released.status_code == 200
    ip.refresh_from_db()
    assert ip.state == "free" and ip.org is None


def test_hostname_requests_go_pending_and_operators_decide(edge, alice, charlie, otto):
    customer = web(alice)
    requested = customer.post("/hostnames/", {"hostname": "Shop.Acme.Example"}, HTTP_HX_REQUEST="true")
    assert requested.status_code == 200 and "pending until an operator approves" in requested.content.decode()
    claim = HostnameClaim.objects.get(hostname="shop.acme.example")
    assert claim.status == "pending" and claim.org == alice.org
    overlap = customer.post("/hostnames/", {"hostname": "globex.example.com"})
    body = overlap.content.decode()
    assert overlap.status_code == 422 and 'id="claim-hostname-err"' in body and "already claimed" in body
    assert "globex</td>" not in body  # never says who holds it
    invalid = customer.post("/hostnames/", {"hostname": "bad host\nname"})
    assert invalid.status_code == 422 and 'id="claim-hostname-err"' in invalid.content.decode()

    # globex's pending claim counts for operators only, never in acme's count.
    HostnameClaim.objects.create(org=charlie.org, hostname="api.globex.example", status="pending")
    mine = customer.get("/hostnames/").content.decode()
    assert '<span id="pending-count">1</span>' in mine and "api.globex.example" not in mine
    ops = web(otto)
    listing = ops.get("/hostnames/").content.decode()
    assert '<span id="pending-count">2</span>' in listing
    assert listing.index("shop.acme.example") < listing.index("acme.example.com</code>")  # pending first
    assert ops.get("/hostnames/", {"status": "pending"}).content.decode().count('<tr id="claim-') == 2
    decided = ops.post(f"/hostnames/{claim.pk}/approve/", HTTP_HX_REQUEST="true").content.decode()
    assert '<span id="pending-count">1</span>' in decided
    claim.refresh_from_db()
    assert claim.status == "approved" and claim.decided_at is not None
    assert AuditEvent.objects.filter(action="hostnameclaim.approve", object_id=str(claim.pk)).exists()
    other = HostnameClaim.objects.get(hostname="api.globex.example")
    ops.post(f"/hostnames/{other.pk}/reject/")
    other.refresh_from_db()
    assert other.status == "rejected"


def test_a_viewer_sees_the_workspace_without_controls(edge, vera):
    page = web(vera).get(f"/load-balancers/{edge['lb'].pk}/").content.decode()
    assert "acme-web" in page and "New route" not in page and "Apply</button>" not in page
    assert "Request a hostname" not in web(vera).get("/hostnames/").content.decode()
    assert web(vera).post("/hostnames/", {"hostname": "x.acme.example"}).status_code == 403


def test_an_operator_previews_held_changes_and_pushes_back_to_the_workspace(edge, otto, alice):
    fleet = edge["fleet"]
    fleet_services.fleet_render(fleet=fleet)
    Fleet.objects.filter(pk=fleet.pk).update(desired_revision=1, auto_rollout=False, change_seq=1)
    Route.objects.filter(pk=edge["acme_routes"][0].pk).update(path="/held")
    client = web(otto)
    page = client.get(f"/load-balancers/{edge['lb'].pk}/").content.decode()
    assert "changes held until pushed" in page
    preview = client.post(f"/fleets/lb/{edge['lb'].pk}/preview/", {"next": "workspace"},
                          HTTP_HX_REQUEST="true").content.decode()
    assert "/held" in preview and 'name="next" value="workspace"' in preview
    pushed = client.post(f"/fleets/lb/{edge['lb'].pk}/push/", {"next": "workspace"}, HTTP_HX_REQUEST="true")
    assert pushed.headers["HX-Redirect"] == f"/load-balancers/{edge['lb'].pk}/"
    rollout = Rollout.objects.order_by("-id").first()
    assert rollout.revision.number == 2 and rollout.status == "pending"
    # A customer on the shared LB previews its own lines but cannot push other tenants' changes.
    customer_preview = web(alice).post(f"/fleets/lb/{edge['lb'].pk}/preview/", {"next": "workspace"},
                                       HTTP_HX_REQUEST="true").content.decode()
    assert "Push now" not in customer_preview
    assert web(alice).post(f"/fleets/lb/{edge['lb'].pk}/push/", {"next": "workspace"}).status_code == 403


def _grow(edge, n: int) -> None:
    acme, region = edge["acme_pool"].org, edge["region"]
    for i in range(n):
        pool = _pool(edge["lb"], acme, f"extra-{n}-{i}", region, f"127.0.{30 + n}.{i + 1}")
        Member.objects.create(pool=pool, region=region, name="m2", address=f"127.0.{60 + n}.{i + 1}", port=9101)
        _route(edge["lb"], acme, "acme.example.com", 1000 + 10 * n + i, pool, f"/x{n}-{i}")


def test_the_workspace_query_count_does_not_grow_with_routes_pools_and_members(edge, otto, alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def count(persona) -> int:
        client = web(persona)
        client.get("/hostnames/")  # the session's first request saves it; count a steady page view
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(f"/load-balancers/{edge['lb'].pk}/").status_code == 200
        return len(ctx.captured_queries)

    _grow(edge, 2)
    small = {"operator": count(otto), "customer": count(alice)}
    _grow(edge, 12)
    assert {"operator": count(otto), "customer": count(alice)} == small
    assert small["operator"] <= 25, small
