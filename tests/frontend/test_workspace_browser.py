"""The customer journey in a real browser against the real demo fleet (4 HAProxy nodes in 2 regions)
and a real Celery worker: claim a hostname, get it approved, route it, preview the diff, push, watch
each node take it, and find it served; then a weight change, and tenancy by URL."""

from __future__ import annotations

import re

import pytest

from apps.balancers import demo as balancers_demo
from apps.balancers.demo import DEMO_PASSWORDS
from apps.balancers.models import HostnameClaim, LoadBalancer, Member, Route
from apps.fleets import selectors
from apps.fleets.config.render import backend_name
from apps.fleets.models import Node
from apps.fleets.node.runtime_api import HAProxySocket
from tests.browser import login, shot
from tests.frontend.demokit import NODES, ROLLOUT_TIMEOUT_MS, through_node
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

def server_weights(member: Member) -> dict[str, int | None]:
    """The member's weight as each demo node's HAProxy reports it (`show stat`)."""
    backend = backend_name(member.pool_id, member.region.slug, "http")
    weights = {}
    for node in Node.objects.select_related("fleet"):
        rows = HAProxySocket(selectors.node_conn(node).stats_socket_path).show_stat()
        weights[f"{node.fleet.name}/{node.name}"] = next(
            (r.weight for r in rows if r.pxname == backend and r.svname == member.name), None)
    return weights


def test_customer_claims_a_hostname_routes_it_previews_pushes_and_it_is_served(page, browser, live_server,
                                                                             demo_fleet):
    lb = demo_fleet
    host = "shop.acme.test"
    nodes = [a for addrs in NODES.values() for a in addrs]
    assert all(not through_node(a, "/shop/cart", host)[1].startswith("acme-") for a in nodes)

    # 1. acme asks for the hostname: pending until an operator approves.
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.get_by_role("link", name="Hostnames").click()
    page.get_by_label("Hostname (or *.wildcard)").fill(host)
    page.get_by_role("button", name="Request claim").click()
    page.get_by_text("pending until an operator approves it").wait_for()
    assert "pending" in page.locator("#claims tr", has_text=host).inner_text()
    shot(page, "hostnames-customer-pending")

    # 2. Not approved yet: the route form refuses the host, next to the field.
    page.goto(f"/load-balancers/{lb.pk}/")
    page.get_by_label("Hosts (comma-separated)").fill(host)
    page.get_by_label("Path", exact=True).fill("/shop")
    page.get_by_label("Priority").fill("150")
    page.get_by_role("button", name="Preview change").click()
    page.locator("#rf-hosts-err").wait_for()
    assert "not covered by an approved hostname claim" in page.locator("#rf-hosts-err").inner_text()

    # 3. The operator sees it among pending claims of all orgs and approves it.
    ops_context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    try:
        ops = ops_context.new_page()
        login(ops, "admin", DEMO_PASSWORDS["admin"])
        ops.goto("/hostnames/?status=pending")
        row = ops.locator("#claims tr", has_text=host)
        assert "acme" in row.inner_text()
        shot(ops, "hostnames-operator-pending")
        row.get_by_role("button", name=f"Approve {host}").click()
        ops.locator("#pending-count", has_text=re.compile(r"^0$")).wait_for()  # not "10"
    finally:
        ops_context.close()
    assert HostnameClaim.objects.get(hostname=host).status == "approved"

    # 4. Preview: the diff shows the new route's lines; nothing is saved yet.
    revision = LoadBalancer.objects.get(pk=lb.pk).revision
    page.get_by_role("button", name="Preview change").click()
    preview = page.locator("#route-preview")
    preview.wait_for()
    added = preview.locator("pre.diff span.add", has_text=host)
    assert added.count() >= 2, preview.inner_text()  # both fleets' configs gain the route
    assert "globex" not in preview.inner_text()
    assert not Route.objects.filter(hosts__contains=[host]).exists()
    assert LoadBalancer.objects.get(pk=lb.pk).revision == revision
    shot(page, "route-preview-diff")

    # 5. Save and push: the workspace follows the rollout the change started, node by node.
    page.get_by_role("button", name="Add route and push").click()
    page.locator("#routes tr", has_text=host).wait_for()
    route = Route.objects.get(hosts__contains=[host])
    status = page.locator("#deploy-status")
    page.locator("#deploy-summary").wait_for()
    page.evaluate("window.sameDocument = true")  # survives htmx swaps, not a reload
    shot(page, "deploy-rolling-out")
    page.locator("#deploy-summary.badge-done").wait_for(timeout=ROLLOUT_TIMEOUT_MS)
    rows = status.locator("#deploy-nodes tbody tr")
    assert rows.count() == 4
    for i in range(4):
        text = rows.nth(i).inner_text()
        assert "succeeded" in text and text.rstrip().endswith("yes"), text
    assert f"Revision {route.lb.revision}" in status.inner_text()
    assert page.evaluate("window.sameDocument === true")  # progress arrived by polling, no reload
    shot(page, "deploy-done")

    # 6. Served through every demo node with the Host header, by acme's pool.
    for address in nodes:
        code, body = through_node(address, "/shop/cart", host)
        assert code == 200 and re.fullmatch(r"acme-(us-east|eu-west)-\d /shop/cart\n", body), (address, body)

    # 7. The rollout page (reused from fleets) shows the same per-node result.
    page.locator("#deploy-nodes a").first.click()
    page.wait_for_url("**/fleets/rollouts/*/")
    page.locator("#rollout-progress .badge-succeeded").first.wait_for()
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_a_weight_change_shows_in_the_member_row_and_on_every_node(page, demo_fleet):
    member = Member.objects.select_related("region").get(pool__name="acme-web", name="us-east-1")
    assert set(server_weights(member).values()) == {100}
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo_fleet.pk}/")
    row = page.locator(f"#member-{member.pk}")
    row.get_by_label(f"Weight of {member.name}").fill("7")
    row.get_by_role("button", name="Apply").click()
    page.locator(f"#member-{member.pk} td.weight", has_text="7").wait_for()
    shot(page, "member-weight")
    member.refresh_from_db()
    assert member.weight == 7
    # The worker sets it through each node's runtime API (and the revision's rollout agrees).
    assert wait_for(lambda: set(server_weights(member).values()) == {7}, timeout_s=60), server_weights(member)


@pytest.fixture
def demo(transactional_db) -> LoadBalancer:
    balancers_demo.load_demo()
    return LoadBalancer.objects.get(name="edge")


def test_routes_sort_edit_inline_with_errors_and_delete(page, demo):
    acme_pool = demo.pools.get(name="acme-web")
    for priority, path in ((400, "/c"), (300, "/b")):
        route = Route.objects.create(lb=demo, org=acme_pool.org, hosts=["acme.example.com"], path=path,
                                     priority=priority)
        route.targets.create(pool=acme_pool, weight=100)
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo.pk}/")

    def order() -> list[str]:
        return [c.strip() for c in page.locator("#routes tbody tr td:first-child").all_inner_texts()]

    assert order() == ["100", "300", "400"]  # acme's own routes only (globex's 200 is not shown)
    page.get_by_role("link", name="Priority ▲").click()
    page.get_by_role("link", name="Priority ▼").wait_for()
    assert order() == ["400", "300", "100"] and page.url.endswith("?order=desc")
    page.get_by_role("link", name="Priority ▼").click()
    page.get_by_role("link", name="Priority ▲").wait_for()
    assert order() == ["100", "300", "400"]

    # Inline edit: acme's own /b holds priority 300 (globex's 200 would be no collision: priorities are
    # per tenant); the error sits by the field.
    route = Route.objects.get(lb=demo, priority=400)
    page.get_by_role("button", name="Edit route 400").click()
    row = page.locator(f"#route-{route.pk}")
    row.get_by_label("Priority").fill("300")
    row.get_by_label("Path").fill("/checkout")
    row.get_by_label("Weight to acme-web").fill("60")
    row.get_by_label("Priority").press("Enter")  # a real form: Enter submits
    error = page.locator(f"#re{route.pk}-priority-err")
    error.wait_for()
    assert "Priority 300 is already used" in error.inner_text()
    assert row.get_by_label("Path").input_value() == "/checkout"  # what was typed stays
    shot(page, "route-inline-edit-error")
    row.get_by_label("Priority").fill("50")  # ahead of acme's "/" at 100, or it could never serve
    row.get_by_role("button", name="Save").click()
    page.locator(f"#route-{route.pk} td", has_text="acme-web (60)").wait_for()
    route.refresh_from_db()
    assert (route.priority, route.path) == (50, "/checkout")

    # Delete asks first; dismissing keeps the route, accepting removes its row.
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Delete route 50").click()
    page.wait_for_timeout(300)
    assert Route.objects.filter(pk=route.pk).exists()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete route 50").click()
    page.locator(f"#route-{route.pk}").wait_for(state="detached")
    assert not Route.objects.filter(pk=route.pk).exists()
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_a_customer_gets_404_for_another_tenants_route_and_claim_pages(page, demo):
    globex_route = Route.objects.get(lb=demo, org__slug="globex")
    globex_claim = HostnameClaim.objects.get(hostname="globex.example.com")
    own_claim = HostnameClaim.objects.get(hostname="acme.example.com")
    login(page, "acme", DEMO_PASSWORDS["acme"])
    for url in (f"/routes/{globex_route.pk}/", f"/routes/{globex_route.pk}/edit/",
                f"/hostnames/{globex_claim.pk}/"):
        response = page.goto(url)
        assert response.status == 404, url
        assert page.get_by_role("heading", name="Not found").is_visible()
        assert "globex" not in page.content()
    page.goto("/hostnames/")
    assert "globex" not in page.content()
    page.get_by_role("link", name="acme.example.com").click()
    page.wait_for_url(f"**/hostnames/{own_claim.pk}/")
    assert page.get_by_role("link", name="edge").is_visible()  # the route that uses it
    shot(page, "hostname-detail")
