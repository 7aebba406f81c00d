"""The operator drains a node from the fleet page in real Chromium, and a real upstream HAProxy stops sending
it requests; "Back in service" brings it back. A real Celery worker pushes the drain (a map entry: no reload).

(The same drain through the API, with a request open on the node finishing, is tests/fleets/test_node_drain.py.)
"""

from __future__ import annotations

import time

import pytest

from apps.accounts.models import Organization, Role
from apps.accounts.services import user_create_with_membership
from apps.fleets.models import Node
from tests.browser import login, shot
from tests.fleets.drainkit import node_workers, status_of, upstream_served, upstream_statuses

pytestmark = [pytest.mark.browser, pytest.mark.haproxy, pytest.mark.django_db(transaction=True)]


def _until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_operator_drains_a_node_from_the_fleet_page_and_the_upstream_honours_it(
        page, healthy_pair, upstream, celery_worker_factory):
    local = healthy_pair
    url, sock = upstream
    ops = Organization.objects.get(slug="ops")
    user_create_with_membership(username="olga", password="olga-pass-123", org=ops, role=Role.ADMIN)
    celery_worker_factory(name="drain-w1", concurrency=1)
    n1 = Node.objects.get(fleet=local.fleet, name="n1")
    workers = node_workers(local)

    login(page, "olga", "olga-pass-123")
    page.goto(f"/fleets/{local.fleet.pk}/")
    row = page.locator(f"#node-{n1.pk}")
    row.get_by_text("/spillway/healthz").wait_for()
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    row.get_by_role("button", name="Drain").click()
    page.locator(f"#node-{n1.pk} .node-service", has_text="drained").wait_for()
    assert asked and asked[0].startswith("Drain n1?"), asked  # the page asks first (data-confirm, no inline JS)
    _until(lambda: upstream_statuses(sock)["n1"] == "DOWN")  # the worker pushed it; the upstream's check saw 503
    shot(page, "node-drained")
    before = upstream_served(sock)
    for _ in range(10):
        assert status_of(f"{url}/x") == 200
    after = upstream_served(sock)
    assert (after["n1"] - before["n1"], after["n2"] - before["n2"]) == (0, 10)
    assert node_workers(local) == workers  # no reload on either node

    page.get_by_role("button", name="Back in service").first.click()
    _until(lambda: upstream_statuses(sock)["n1"] == "UP")
    page.goto(f"/fleets/{local.fleet.pk}/")
    assert page.locator(f"#node-{n1.pk} .node-service").count() == 0
    shot(page, "node-back-in-service")
