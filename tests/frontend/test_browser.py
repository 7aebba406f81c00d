"""The UI as people use it, in a real browser: operator and customer journeys, tenancy by URL."""

from __future__ import annotations

import pytest

from apps.balancers.demo import DEMO_PASSWORDS, load_demo
from apps.balancers.models import LoadBalancer, Member, Route
from tests.browser import login, shot, wait_for_result

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo(transactional_db):
    load_demo()
    return LoadBalancer.objects.get(name="edge")


def test_operator_sees_the_dashboard_with_every_load_balancer(page, demo):
    login(page, "admin", DEMO_PASSWORDS["admin"])
    assert page.get_by_role("heading", name="Dashboard").is_visible()
    assert page.get_by_role("link", name="edge").is_visible()
    shot(page, "dashboard-operator")
    page.get_by_role("link", name="edge").click()
    page.wait_for_url(f"**/load-balancers/{demo.pk}/")
    # The operator sees both tenants' routes on the shared LB.
    routes = page.locator("#routes").inner_text()
    assert "acme.example.com" in routes and "globex.example.com" in routes
    shot(page, "lb-workspace-operator")
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_customer_creates_a_route_with_inline_errors_then_success(page, demo):
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo.pk}/")
    routes = page.locator("#routes").inner_text()
    assert "acme.example.com" in routes and "globex" not in page.content()
    page.get_by_label("Hosts (comma-separated)").fill("acme.example.com")
    page.get_by_label("Path").fill("/bad path")
    page.get_by_label("Priority").fill("50")  # ahead of acme's "/" at 100, or /api could never serve
    page.get_by_role("button", name="Add route").click()
    error = page.locator("#rf-path-err")
    wait_for_result(page, error)
    assert "forbidden character" in error.inner_text()
    shot(page, "route-form-error")
    page.get_by_label("Path").fill("/api")
    page.get_by_role("button", name="Add route").click()
    page.locator("#routes", has_text="/api").wait_for()
    assert Route.objects.filter(path="/api", org__slug="acme").exists()
    shot(page, "lb-workspace-customer")


def test_customer_cannot_route_another_tenants_hostname(page, demo):
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo.pk}/")
    page.get_by_label("Hosts (comma-separated)").fill("globex.example.com")
    page.get_by_label("Path").fill("/steal")
    page.get_by_label("Priority").fill("151")
    page.get_by_role("button", name="Add route").click()
    wait_for_result(page, page.locator("#rf-hosts-err"))
    assert "not covered by an approved hostname claim" in page.locator("#rf-hosts-err").inner_text()
    assert not Route.objects.filter(path="/steal").exists()


def test_draining_a_member_changes_its_state(page, demo):
    member = Member.objects.filter(pool__org__slug="acme").order_by("pk").first()
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo.pk}/")
    row = page.locator(f"#member-{member.pk}")
    row.get_by_label(f"State of {member.name}").select_option("drain")
    row.get_by_role("button", name="Apply").click()
    page.locator(f"#member-{member.pk} .state-drain").wait_for()
    member.refresh_from_db()
    assert member.admin_state == "drain"


def test_customer_gets_404_for_another_tenants_pages(page, demo):
    globex_lb = LoadBalancer.objects.create(name="globex-private", org=demo.org.__class__.objects.get(slug="globex"))
    login(page, "acme", DEMO_PASSWORDS["acme"])
    response = page.goto(f"/load-balancers/{globex_lb.pk}/")
    assert response.status == 404
    assert page.get_by_role("heading", name="Not found").is_visible()
    globex_member = Member.objects.filter(pool__org__slug="globex").first()
    status = page.evaluate(
        """async (id) => (await fetch(`/members/${id}/state/`, {method: 'POST',
            headers: {'X-CSRFToken': document.cookie.replace(/.*csrftoken=([^;]*).*/, '$1')},
            body: new URLSearchParams({admin_state: 'maint'})})).status""", globex_member.pk)
    assert status in (403, 404)
    globex_member.refresh_from_db()
    assert globex_member.admin_state == "active"
    shot(page, "not-found")
