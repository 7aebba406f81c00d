"""The capacity pages in headless Chromium: the live progress bar polls, the uPlot chart draws under
the CSP, the knee is marked, apply is one click, two runs compare. Screenshots: test-output/screenshots/."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.balancers.models import PoolRegion
from apps.capacity.models import CapacityRun, CapacityTest
from tests.browser import login, shot
from tests.capacity.capacitykit import knee_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct-horse-battery"  # tests/factories.UserFactory


@pytest.fixture
def capacity_test(world, alice) -> CapacityTest:
    listener = world.listener(8090)
    response = alice.client.post("/api/v1/capacity-tests/", {
        "name": "web", "listener": listener.pk, "steps": [50, 100, 200], "step_duration_s": 2, "slo_p99_ms": 50,
        "pool": world.pool.pk, "region": "us-east"}, format="json")
    assert response.status_code == 201, response.content
    return CapacityTest.objects.get(pk=response.json()["id"])


def _no_csp_errors(pg) -> None:
    assert not [e for e in pg.console_errors if "Content Security Policy" in e or "uPlot" in e], pg.console_errors


def test_progress_bar_follows_the_run_then_the_page_shows_the_chart(page, alice, capacity_test):
    run = CapacityRun.objects.create(test=capacity_test, status="running", progress_percent=20.0, step_count=3,
                                     achieved_rate=50.0, shards_total=1)
    login(page, "alice", PASSWORD)
    page.goto(f"/capacity/runs/{run.pk}/")
    bar = page.locator("#run-progress-bar")
    assert bar.get_attribute("value") == "20.0"
    CapacityRun.objects.filter(pk=run.pk).update(progress_percent=60.0, current_step=1, achieved_rate=99.0)
    # htmx polls every second and swaps the partial in.
    expect(page.locator("#run-progress-bar")).to_have_attribute("value", "60.0", timeout=5000)
    assert "step 2 of 3" in page.locator("#run-progress").inner_text()
    shot(page, "capacity-run-progress")
    # The run finishes (as the last shard would leave it): the poller reloads the page with results.
    finished = knee_run(capacity_test.pk)
    CapacityRun.objects.filter(pk=run.pk).delete()
    page.goto(f"/capacity/runs/{finished.pk}/")
    page.locator('.capacity-chart[data-rendered="1"] canvas').first.wait_for()
    legend = page.locator(".capacity-chart").first.inner_text()
    assert "p50 ms" in legend and "p99 ms" in legend and "knee" in legend
    page.locator('[data-capacity-errors][data-rendered="1"] canvas').wait_for()
    assert page.locator("tr.capacity-knee").inner_text().startswith("2")
    shot(page, "capacity-run-chart")
    before = PoolRegion.objects.get(pool=capacity_test.pool).max_rate_per_member
    page.get_by_role("button", name="Apply to the pool…").click()
    preview = page.locator("#apply-preview")  # what it changes, before anything is written
    preview.get_by_text("39.6 req/s").first.wait_for()
    assert "max_rate_per_member" in preview.inner_text() and "capacity" in preview.inner_text()
    assert PoolRegion.objects.get(pool=capacity_test.pool).max_rate_per_member == before
    shot(page, "capacity-apply-preview")
    preview.get_by_role("button", name="Apply", exact=True).click()
    page.locator("#run-recommendation .badge-ok").wait_for()
    assert PoolRegion.objects.get(pool=capacity_test.pool).max_rate_per_member == 39.6
    _no_csp_errors(page)


def test_the_poller_reloads_into_results_when_the_run_ends(page, alice, capacity_test):
    run = knee_run(capacity_test.pk)
    CapacityRun.objects.filter(pk=run.pk).update(status="running", finished_at=None)
    login(page, "alice", PASSWORD)
    page.goto(f"/capacity/runs/{run.pk}/")
    assert page.locator("#run-progress").get_attribute("hx-trigger") == "every 1s"
    with page.expect_event("load", timeout=8000):  # HX-Refresh: the whole page reloads once
        CapacityRun.objects.filter(pk=run.pk).update(status="succeeded")
    expect(page.locator("#run-progress .badge")).to_have_text("succeeded")
    assert page.locator("#run-progress").get_attribute("hx-trigger") is None
    page.locator('.capacity-chart[data-rendered="1"] canvas').first.wait_for()
    _no_csp_errors(page)


def test_two_runs_compare_on_one_chart(page, alice, capacity_test):
    a, b = knee_run(capacity_test.pk), knee_run(capacity_test.pk)
    login(page, "alice", PASSWORD)
    page.goto("/capacity/")
    shot(page, "capacity-index")
    page.get_by_label(f"Compare run {a.pk}").check()
    page.get_by_label(f"Compare run {b.pk}").check()
    page.get_by_role("button", name="Compare two selected runs").click()
    page.locator('.capacity-chart[data-rendered="1"] canvas').wait_for()
    legend = page.locator(".capacity-chart").inner_text()
    assert f"run #{a.pk} p99 ms" in legend and f"run #{b.pk} p99 ms" in legend
    shot(page, "capacity-compare")
    _no_csp_errors(page)
