"""What the UI says when a request fails past a form's own errors, in a real browser: a dropped connection and an
answer refused after the page was loaded. Before, htmx swapped nothing on either and the click looked like it did
nothing; now the form says what happened, and what the user typed stays in it.

The browser reaches the live server through a TCP relay the test cuts (tests/relay.py): the connection really
fails, as when the network or the web server goes away, with no request mocked."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from apps.accounts.models import Membership
from apps.balancers.demo import DEMO_PASSWORDS, load_demo
from apps.balancers.models import LoadBalancer, Member, Route
from tests.browser import login, open_page, shot
from tests.relay import Relay

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo(transactional_db) -> LoadBalancer:
    load_demo()
    return LoadBalancer.objects.get(name="edge")


@pytest.fixture
def relayed(browser, live_server) -> Iterator[tuple[object, Relay]]:
    relay = Relay(("127.0.0.1", urlparse(live_server.url).port))
    try:
        with open_page(browser, f"http://127.0.0.1:{relay.port}") as page:
            yield page, relay
    finally:
        relay.cut()


def fill_new_route(page, path: str) -> None:
    page.get_by_label("Hosts (comma-separated)").fill("acme.example.com")
    page.get_by_label("Path").fill(path)
    page.get_by_label("Priority").fill("50")


def test_a_dropped_connection_says_so_keeps_the_input_and_the_next_try_saves(relayed, demo) -> None:
    page, relay = relayed
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo.pk}/")
    fill_new_route(page, "/api")
    relay.cut()
    page.get_by_role("button", name="Add route").click()
    alert = page.locator("#route-form .request-error")
    alert.wait_for()
    assert "could not be reached" in alert.inner_text()
    assert page.get_by_label("Path").input_value() == "/api"
    assert page.get_by_label("Hosts (comma-separated)").input_value() == "acme.example.com"
    assert not Route.objects.filter(path="/api").exists()
    shot(page, "route-form-connection-failed")

    relay.mend()
    page.get_by_role("button", name="Add route").click()
    page.locator("#routes", has_text="/api").wait_for()
    assert Route.objects.filter(path="/api", org__slug="acme").count() == 1


def test_a_role_lowered_while_the_page_was_open_shows_the_servers_reason(relayed, demo) -> None:
    page, _ = relayed
    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{demo.pk}/")
    fill_new_route(page, "/reports")
    # An admin of acme makes this user a viewer in another session (the demo's acme user is its only owner, which
    # the role service keeps: the row is changed as that admin's change would leave it).
    Membership.objects.filter(user__username="acme", org__slug="acme").update(role="viewer")
    page.get_by_role("button", name="Add route").click()
    alert = page.locator("#route-form .request-error")
    alert.wait_for()
    text = alert.inner_text()
    assert "Your role cannot change routes." in text and "still here" in text
    assert page.get_by_label("Path").input_value() == "/reports"
    assert not Route.objects.filter(path="/reports").exists()
    # A second refusal replaces the note instead of stacking another under it.
    page.get_by_role("button", name="Add route").click()
    page.wait_for_function("document.querySelectorAll('#route-form .request-error').length === 1")
    page.wait_for_timeout(300)
    assert page.locator("#route-form .request-error").count() == 1

    # A refused change of a member (its form answers into its table row) is told above the table, not in the row.
    member = Member.objects.filter(pool__org__slug="acme").order_by("pk").first()
    row = page.locator(f"#member-{member.pk}")
    row.get_by_label(f"State of {member.name}").select_option("drain")
    row.get_by_role("button", name="Apply").click()
    note = page.locator(".request-error", has_text="Your role cannot")
    note.nth(1).wait_for()
    assert note.nth(1).evaluate("n => n.closest('table') === null && n.parentElement.tagName !== 'TR'")
    member.refresh_from_db()
    assert member.admin_state != "drain"
    shot(page, "member-change-refused")
