"""The operator serves a load balancer from a second region from its page, in real Chromium, after reading what
it would do; a request to that region's node, refused before, is then served by that region's member. A real
Celery worker renders and rolls the fleets out. (`Fleet.serves` was API-only; a pool in two regions served from
one region's fleet refused requests at the other region's node.)"""

from __future__ import annotations

import socket
import time

import pytest

from apps.accounts.models import Organization, Role
from apps.accounts.services import user_create_with_membership
from apps.balancers.models import Member, PoolRegion, Region
from apps.fleets.demo.localnodes import start_local_node
from apps.fleets.models import Fleet, Node
from apps.fleets.node.process import stop_master
from tests.browser import login, shot
from tests.fleets.fleetkit import make_local_fleet, reconcile

pytestmark = [pytest.mark.browser, pytest.mark.haproxy, pytest.mark.django_db(transaction=True)]
EU_NODE = "127.0.87.1"


def _refused(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return False
    except OSError:
        return True


def test_the_operator_serves_an_lb_from_a_second_region_and_it_answers_there(
        page, haproxy_bin, tiny_backend, celery_worker_factory):
    us_backend, eu_backend = tiny_backend("us-member"), tiny_backend("eu-member")
    us = make_local_fleet(name="two", subnet=86, node_count=1, backend_address=(us_backend.address, us_backend.port))
    eu_proc = None
    try:
        pool = us.listener.default_pool
        eu_region = Region.objects.create(slug="eu-west", name="EU West")
        PoolRegion.objects.create(pool=pool, region=eu_region, max_rate_per_member=None)
        Member.objects.create(pool=pool, region=eu_region, name="eu-1", address=eu_backend.address,
                              port=eu_backend.port)
        eu = Fleet.objects.create(name="two-eu", region=eu_region)
        eu_node = Node.objects.create(fleet=eu, name="e1", address=EU_NODE, bind_address=EU_NODE,
                                      runtime_dir=f"{us.base}/e1/run", config_dir=f"{us.base}/e1/etc")
        eu_proc = start_local_node(eu_node)
        reconcile(us.fleet)
        assert us.get(us.nodes[0], "/x")[1] == "us-member"
        assert _refused(EU_NODE, us.port), "eu-west's node answered before it served the LB"

        ops = Organization.objects.get(slug="ops")
        user_create_with_membership(username="olga", password="olga-pass-123", org=ops, role=Role.ADMIN)
        celery_worker_factory(name="serve-w1", concurrency=1)
        login(page, "olga", "olga-pass-123")
        page.goto(f"/load-balancers/{us.lb.pk}/")
        card = page.locator("#lb-serving")
        card.get_by_text("us-east").first.wait_for()
        card.get_by_label("Serve from another region").select_option(label="two-eu (eu-west)")
        card.get_by_role("button", name="What would it change?").click()
        what_if = page.locator("#serving-what-if")
        what_if.get_by_text("Pool old: served in eu-west by its own members without a limit").wait_for()
        shot(page, "lb-serving-what-if")
        what_if.get_by_role("button", name="Serve from eu-west").click()
        page.locator("#serving-saved", has_text="two-eu (eu-west) now serves two").wait_for()
        page.locator("#serving-table tr", has_text="eu-west").wait_for()
        shot(page, "lb-serving-two-regions")

        deadline = time.monotonic() + 30
        while _refused(EU_NODE, us.port) or us.get(eu_node, "/x")[1] != "eu-member":
            assert time.monotonic() < deadline, "eu-west's node never served the LB"
            time.sleep(0.3)
        assert us.get(us.nodes[0], "/y")[1] == "us-member"  # each region serves its own members first
    finally:
        us.stop_all()
        if eu_proc is not None:
            stop_master(eu_proc)
