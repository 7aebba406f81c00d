"""An operator's day in real Chromium, each journey ending with what a real node serves (a real Celery worker
pushes every change):

- revert a change of an LB that two fleets in two regions serve: neither region serves the route afterwards,
  and the drain made since is kept and said;
- a job made with pickers (no ids typed) drains a member when run: the nodes send its traffic to the other one.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from apps.accounts.models import Organization, Role
from apps.accounts.services import user_create_with_membership
from apps.audit.models import AuditEvent
from apps.balancers.models import Member, Region
from apps.fleets.demo.localnodes import start_local_node
from apps.fleets.models import Fleet, Node
from apps.fleets.node.process import stop_master
from tests.browser import login, shot
from tests.fleets.fleetkit import add_pool, make_local_fleet, reconcile

pytestmark = [pytest.mark.browser, pytest.mark.haproxy, pytest.mark.django_db(transaction=True)]


def _until(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _operator(page, celery_worker_factory, name: str) -> None:
    ops = Organization.objects.get(slug="ops")
    user_create_with_membership(username="olga", password="olga-pass-123", org=ops, role=Role.ADMIN)
    celery_worker_factory(name=name, concurrency=1)
    login(page, "olga", "olga-pass-123")


def test_the_operator_reverts_a_route_change_on_both_regions_and_the_drain_since_stays(
        page, haproxy_bin, tiny_backend, celery_worker_factory, otto):
    old, other, new = tiny_backend("old"), tiny_backend("old2"), tiny_backend("new")
    us = make_local_fleet(name="rvb", subnet=89, node_count=1, backend_address=(old.address, old.port))
    eu_proc = None
    try:
        pool = us.listener.default_pool
        Member.objects.create(pool=pool, region=pool.regions.get().region, name="old-2", address=other.address,
                              port=other.port)
        eu = Fleet.objects.create(name="rvb-eu", region=Region.objects.create(slug="eu-west", name="EU West"))
        eu.serves.add(us.lb)
        eu_node = Node.objects.create(fleet=eu, name="e1", address="127.0.90.1", bind_address="127.0.90.1",
                                      runtime_dir=f"{us.base}/e1/run", config_dir=f"{us.base}/e1/etc")
        eu_proc = start_local_node(eu_node)
        nodes = [us.nodes[0], eu_node]
        new_pool = add_pool(us.lb, "new", (new.address, new.port))
        made = otto.client.post("/api/v1/routes/", {"lb": us.lb.pk, "path": "/new", "priority": 1,
                                                    "targets": [{"pool": new_pool.pk}]}, format="json")
        assert made.status_code == 201, made.content
        reconcile(us.fleet)
        reconcile(eu)
        assert [us.get(n, "/new/a")[1] for n in nodes] == ["new", "new"]
        member = Member.objects.get(pool=pool, name="old-1")
        assert otto.client.post(f"/api/v1/members/{member.pk}/state/", {"admin_state": "drain"},
                                format="json").status_code in (200, 202)

        _operator(page, celery_worker_factory, "revert-w1")
        change = AuditEvent.objects.get(action="route.create", object_id=str(made.json()["id"]))
        page.goto(f"/load-balancers/{us.lb.pk}/")
        row = page.locator(f"#change-{change.pk}")
        row.wait_for()
        page.once("dialog", lambda dialog: dialog.accept())
        row.get_by_role("button", name="Revert").click()
        result = page.locator("#revert-result")
        result.wait_for()
        text = result.inner_text()
        assert "deleted route" in text and "Kept, set after it: member rvb/old/old-1 drained by" in text, text
        shot(page, "lb-change-reverted")
        # Both regions drop the route (the worker rolls both fleets out); the drained member stays idle.
        _until(lambda: [us.get(n, "/new/b")[1] for n in nodes] == ["old2", "old2"])
        assert Member.objects.get(pk=member.pk).admin_state == "drain"
    finally:
        us.stop_all()
        if eu_proc is not None:
            stop_master(eu_proc)


def test_a_job_made_with_pickers_drains_a_member_and_the_nodes_send_its_traffic_elsewhere(
        page, haproxy_bin, tiny_backend, celery_worker_factory):
    first, second = tiny_backend("first"), tiny_backend("second")
    local = make_local_fleet(name="jobd", subnet=91, node_count=1, backend_address=(first.address, first.port))
    try:
        pool = local.listener.default_pool
        Member.objects.create(pool=pool, region=pool.regions.get().region, name="old-2", address=second.address,
                              port=second.port)
        reconcile(local.fleet)
        node = local.nodes[0]
        assert {local.get(node, f"/{i}")[1] for i in range(6)} == {"first", "second"}

        _operator(page, celery_worker_factory, "jobs-w1")
        page.goto("/jobs/new/")
        page.get_by_label("Name").fill("drain-old-1")
        page.get_by_label("Kind").select_option(label="Set member state")
        params = page.locator('[data-kind-params="member_set_state"]')
        params.get_by_label("Member").select_option(label="jobd/old/old-1")  # a name, never an id
        params.get_by_label("State").select_option("drain")
        page.get_by_label("Schedule").select_option("interval")
        page.get_by_label("Every (seconds)").fill("86400")
        shot(page, "job-form-pickers")
        page.get_by_role("button", name="Create job").click()
        # The job's own page (/jobs/new/ would match a glob "**/jobs/*/" before the form is even sent).
        try:
            page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        except PlaywrightTimeout:
            raise AssertionError(f"the job was not created: {page.locator('main').inner_text()[:2000]}") from None
        page.get_by_text("jobd/old/old-1").first.wait_for()
        page.get_by_role("button", name="Run now").click()
        _until(lambda: Member.objects.get(pool=pool, name="old-1").admin_state == "drain")
        _until(lambda: {local.get(node, f"/x{i}")[1] for i in range(6)} == {"second"})
        shot(page, "job-ran")
    finally:
        local.stop_all()
