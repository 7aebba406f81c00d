"""The jobs UI in real headless Chromium: the schedule preview follows typing, a job is created and run.

Uses the UI suite's fixtures (tests/browser.py): Playwright, a live server, screenshots.
"""

from __future__ import annotations

import re

import pytest

from apps.scheduling.models import Job, JobRun
from tests.browser import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_create_a_job_with_the_live_preview_then_run_it(page, alice) -> None:
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    login(page, "alice", "correct-horse-battery")
    page.goto("/jobs/new/")
    page.get_by_label("Cron (minute hour day month weekday)").fill("30 2 * * *")
    page.get_by_label("Time zone").fill("Europe/Berlin")
    preview = page.locator("#schedule-preview")
    preview.get_by_text("At 02:30 AM, Europe/Berlin").wait_for()
    assert preview.locator("li").count() == 5
    page.get_by_label("Cron (minute hour day month weekday)").fill("*/15 * * * *")
    preview.get_by_text("Every 15 minutes").wait_for()

    # Switching to an interval shows its field and hides the cron ones.
    page.get_by_label("Schedule", exact=True).select_option("interval")
    assert page.get_by_label("Every (seconds)").is_visible()
    assert not page.get_by_label("Cron (minute hour day month weekday)").is_visible()
    page.get_by_label("Every (seconds)").fill("90")
    preview.get_by_text("Every 90 seconds").wait_for()
    page.get_by_label("Name").fill("browser-made")
    shot(page, "jobs-form")
    page.get_by_role("button", name="Create job").click()
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = Job.objects.get(name="browser-made")
    assert job.interval_s == 90 and job.next_fire_at is not None

    page.get_by_role("button", name="Run now").click()
    page.locator("#runs").get_by_text("manual").wait_for()
    assert JobRun.objects.filter(job=job, trigger="manual").count() == 1
    shot(page, "jobs-detail")
    page.goto("/jobs/")
    page.locator("#jobs").get_by_text("browser-made").wait_for()
    shot(page, "jobs-list")
    assert missing == []
    assert not [e for e in page.console_errors if "Content Security Policy" in e]


def test_form_errors_show_next_to_the_field(page, alice) -> None:
    login(page, "alice", "correct-horse-battery")
    page.goto("/jobs/new/")
    page.get_by_label("Name").fill("bad-cron")
    page.get_by_label("Cron (minute hour day month weekday)").fill("61 * * * *")
    # Waited for by its answer, so a failure says which side failed: the POST (never sent, slow, or not a 422)
    # or the swap of its answer (CI once timed out on the error with neither known).
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/jobs/new/"),
                              timeout=30_000) as answer:
        page.get_by_role("button", name="Create job").click()
    assert answer.value.status == 422
    page.locator("#job-cron-err").wait_for()
    assert "61" in page.locator("#job-cron-err").inner_text()
    assert not Job.objects.filter(name="bad-cron").exists()
