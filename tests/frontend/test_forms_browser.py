"""A customer builds its own pool (with per-region capacity), adds a member and routes to it, all through
the UI forms in real Chromium, and the request is then served through the real demo HAProxy fleet
(4 nodes, 2 regions, a real Celery worker pushing the change)."""

from __future__ import annotations

import pytest

from apps.accounts.models import Organization
from apps.balancers.demo import DEMO_PASSWORDS
from apps.balancers.models import Member, Pool, PoolRegion
from tests.browser import login, shot
from tests.frontend.demokit import NODES, ROLLOUT_TIMEOUT_MS, through_node
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_customer_creates_its_own_pool_member_and_route_and_it_is_served(page, demo_fleet, tiny_backend):
    lb = demo_fleet
    backend = tiny_backend("shop-backend", address="127.0.26.9")
    # The operator's allowance for acme's private network (a customer may not proxy loopback otherwise).
    Organization.objects.filter(slug="acme").update(member_networks=["127.0.26.0/24"])

    login(page, "acme", DEMO_PASSWORDS["acme"])
    page.goto(f"/load-balancers/{lb.pk}/")
    page.locator("#new-pool").click()
    page.wait_for_url("**/pools/new/")
    # First a mistake: the error comes back next to its field, what was typed stays.
    page.get_by_label("Name").fill("Shop Pool!")
    page.get_by_role("button", name="Create pool").click()
    page.locator("#f-name-err").wait_for()
    shot(page, "form-pool-inline-error")
    page.get_by_label("Name").fill("shop")
    page.locator("input[name='region_us-east']").check()
    page.get_by_label("Max rate per member in us-east").fill("40")
    page.get_by_label("Capacity scaler in us-east").fill("0.5")
    shot(page, "form-pool-filled")
    page.get_by_role("button", name="Create pool").click()
    page.wait_for_url(f"**/load-balancers/{lb.pk}/*")
    pool = Pool.objects.get(lb=lb, name="shop")
    assert pool.org.slug == "acme"
    capacity = PoolRegion.objects.get(pool=pool)
    assert (capacity.region.slug, capacity.max_rate_per_member, capacity.capacity_scaler) == ("us-east", 40, 0.5)
    page.locator(f"#pool-{pool.pk}-capacity", has_text="us-east: 40 req/s per member, scaler 0.50").wait_for()

    page.locator(f"a[href='/pools/{pool.pk}/members/new/']").first.click()
    page.get_by_label("Name").fill("shop-1")
    page.get_by_label("Region").select_option("us-east")
    page.get_by_label("Address").fill(backend.address)
    page.get_by_label("Port").fill(str(backend.port))
    page.get_by_role("button", name="Add member").click()
    page.wait_for_url(f"**/load-balancers/{lb.pk}/*")
    member = Member.objects.get(pool=pool, name="shop-1")
    page.locator(f"#member-{member.pk}-health").wait_for()
    shot(page, "form-member-added")

    page.get_by_label("Hosts (comma-separated)").fill("acme.example.com")
    page.get_by_label("Path", exact=True).fill("/shop")
    page.locator("#rf-pool").select_option(str(pool.pk))
    page.get_by_label("Priority").fill("150")
    page.get_by_role("button", name="Add route and push").click()
    # Behind acme's own "/" route (priority 100) it would never serve: said next to the priority.
    page.locator("#rf-priority-err", has_text="would never serve a request").wait_for()
    page.get_by_label("Priority").fill("50")
    page.get_by_role("button", name="Add route and push").click()
    page.locator("#routes tr", has_text="/shop").wait_for()
    # The push rolls out node by node through the Celery worker: wait until the us-east nodes serve it.
    served = wait_for(lambda: all(through_node(a, "/shop/cart", "acme.example.com")[1].startswith("shop-backend")
                                  for a in NODES["us-east"]), ROLLOUT_TIMEOUT_MS / 1000)
    page.locator("#deploy-summary.badge-done").wait_for(timeout=ROLLOUT_TIMEOUT_MS)
    shot(page, "form-route-pushed")
    assert served

    for address in NODES["us-east"]:
        code, body = through_node(address, "/shop/cart", "acme.example.com")
        assert (code, body.split()[0] if body else "") == (200, "shop-backend"), (address, code, body)
    assert backend.hits > 0
