"""Jobs UI through Django's test client: list, form with live preview, actions, history, tenancy."""

from __future__ import annotations

import re

import pytest

from apps.scheduling.models import Job, JobRun
from tests.personas import HTMX, web

pytestmark = pytest.mark.django_db


def assert_csp_clean(html: str) -> None:
    """The CSP blocks inline scripts and style attributes: the pages must not rely on them."""
    assert not re.search(r"\sstyle=", html)
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)


def test_the_list_shows_next_run_and_last_status(alice, make_job) -> None:
    job = make_job(alice.org, "nightly", schedule_type="cron", cron="30 2 * * *", timezone="Europe/Berlin")
    Job.objects.filter(pk=job.pk).update(last_status="failed")
    response = web(alice).get("/jobs/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "nightly" in html and "At 02:30 AM, Europe/Berlin" in html
    assert job.next_fire_at.strftime("%Y-%m-%d %H:%M:%S") in html
    assert 'badge badge-failed">failed' in html
    assert_csp_clean(html)


def test_the_form_previews_the_schedule_as_you_type(alice) -> None:
    client = web(alice)
    page = client.get("/jobs/new/")
    assert page.status_code == 200 and 'hx-get="/jobs/preview/"' in page.content.decode()
    assert_csp_clean(page.content.decode())
    preview = client.get("/jobs/preview/", {"schedule_type": "cron", "cron": "30 2 * * *",
                                            "timezone": "Europe/Berlin"}, **HTMX).content.decode()
    assert "At 02:30 AM, Europe/Berlin" in preview
    assert preview.count("<li>") == 5 and ("CET" in preview or "CEST" in preview)
    bad = client.get("/jobs/preview/", {"schedule_type": "cron", "cron": "99 * * * *"}, **HTMX).content.decode()
    assert "invalid_cron" in bad


def test_creating_a_job_from_the_form(alice) -> None:
    response = web(alice).post("/jobs/new/", {
        "name": "drain-window", "kind": "noop", "p.noop.message": "hi", "schedule_type": "interval",
        "interval_s": "3600", "timezone": "UTC", "misfire_policy": "skip", "misfire_grace_s": "60",
        "concurrency_policy": "forbid", "max_retries": "1", "retry_backoff_s": "10", "timeout_s": "60",
        "enabled": "on"}, **HTMX)
    job = Job.objects.get(name="drain-window")
    assert response.status_code == 200 and response["HX-Redirect"] == f"/jobs/{job.pk}/"
    assert job.params == {"sleep_s": 0.0, "fail": False, "fail_attempts": 0, "message": "hi"}
    assert job.interval_s == 3600 and job.misfire_policy == "skip" and job.enabled


def test_form_errors_come_back_next_to_their_fields(alice) -> None:
    response = web(alice).post("/jobs/new/", {
        "name": "broken", "kind": "noop", "p.noop.sleep_s": "x", "schedule_type": "cron",
        "cron": "61 * * * *", "timezone": "UTC"}, **HTMX)
    assert response.status_code == 422
    html = response.content.decode()
    assert "job-cron-err" in html and "61" in html
    assert not Job.objects.filter(name="broken").exists()
    bad_param = web(alice).post("/jobs/new/", {"name": "broken", "kind": "noop", "p.noop.sleep_s": "x",
                                                   "schedule_type": "cron", "cron": "0 2 * * *"}, **HTMX)
    assert bad_param.status_code == 422 and "sleep_s must be a number" in bad_param.content.decode()


def test_editing_keeps_the_webhook_secret_unless_a_new_one_is_typed(alice, make_job) -> None:
    job = make_job(alice.org, "hooked", webhook_url="https://hooks.example.com/x", webhook_secret="s" * 24)
    before = job.webhook_secret_encrypted
    page = web(alice).get(f"/jobs/{job.pk}/edit/").content.decode()
    assert "s" * 24 not in page and "leave empty to keep" in page
    response = web(alice).post(f"/jobs/{job.pk}/edit/", {
        "name": "hooked", "kind": "noop", "schedule_type": "interval", "interval_s": "120",
        "webhook_url": "https://hooks.example.com/x", "webhook_secret": ""}, **HTMX)
    assert response.status_code == 200, response.content.decode()
    job.refresh_from_db()
    assert job.interval_s == 120 and job.webhook_secret_encrypted == before


def test_run_now_and_pause_from_the_list(alice, make_job) -> None:
    job = make_job(alice.org, "clicky")
    client = web(alice)
    row = client.post(f"/jobs/{job.pk}/run/", {"from": "list"}, **HTMX)
    assert row.status_code == 200 and f'id="job-{job.pk}"' in row.content.decode()
    assert JobRun.objects.filter(job=job, trigger="manual").count() == 1
    paused = client.post(f"/jobs/{job.pk}/pause/", {"from": "list"}, **HTMX).content.decode()
    assert "Resume" in paused and "paused" in paused
    job.refresh_from_db()
    assert not job.enabled
    client.post(f"/jobs/{job.pk}/resume/", {"from": "list"}, **HTMX)
    job.refresh_from_db()
    assert job.enabled and job.next_fire_at is not None


def test_the_detail_page_shows_the_history(alice, make_job) -> None:
    job = make_job(alice.org, "historic")
    client = web(alice)
    client.post(f"/jobs/{job.pk}/run/", **HTMX)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Run history" in html and "manual" in html and "badge badge-pending" in html
    assert html.count("<li>") >= 5  # next runs
    assert_csp_clean(html)
    assert "manual" in client.get(f"/jobs/{job.pk}/runs/", **HTMX).content.decode()


def test_a_viewer_sees_jobs_but_cannot_act(alice, vera, make_job) -> None:
    job = make_job(alice.org, "look-dont-touch")
    client = web(vera)
    html = client.get("/jobs/").content.decode()
    assert "look-dont-touch" in html and "Run now" not in html
    assert client.post(f"/jobs/{job.pk}/run/", **HTMX).status_code == 403
    assert client.post(f"/jobs/{job.pk}/pause/", **HTMX).status_code == 403
    assert client.post("/jobs/new/", {"name": "x", "kind": "noop"}, **HTMX).status_code == 403
    assert not JobRun.objects.exists()


def test_an_outsider_gets_404_and_an_empty_list(alice, charlie, make_job) -> None:
    job = make_job(alice.org, "private")
    client = web(charlie)
    assert "private" not in client.get("/jobs/").content.decode()
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    assert client.get(f"/jobs/{job.pk}/edit/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/run/", **HTMX).status_code == 404
    assert client.post(f"/jobs/{job.pk}/delete/", **HTMX).status_code == 404
    assert Job.objects.filter(pk=job.pk).exists()


def test_a_job_acting_on_a_member_is_made_with_a_picker_and_shows_and_exports_names(alice, charlie) -> None:
    """pool_region / member were ids typed as raw JSON ("pool_region must be the id of a pool region")."""
    from tests.factories import LoadBalancerFactory, MemberFactory, PoolFactory, RegionFactory

    region = RegionFactory(slug="eu-west")
    pool = PoolFactory(lb=LoadBalancerFactory(org=alice.org, name="web"), org=alice.org, name="api")
    member = MemberFactory(pool=pool, region=region, name="m1")
    theirs = MemberFactory(pool=PoolFactory(lb=LoadBalancerFactory(org=charlie.org, name="gweb"), org=charlie.org,
                                            name="gapi"), region=region, name="g1")
    form = web(alice).get("/jobs/new/").content.decode()
    assert "web/api/m1</option>" in form
    assert "gweb/gapi/g1" not in form  # another tenant's member is not offered
    response = web(alice).post("/jobs/new/", {
        "name": "drain-m1", "kind": "member_set_state", "p.member_set_state.member": str(member.pk),
        "p.member_set_state.admin_state": "drain", "schedule_type": "once", "run_at": "2030-01-01T00:00:00",
        "timezone": "UTC"}, **HTMX)
    assert response.status_code == 200, response.content.decode()[:2000]
    job = Job.objects.get(name="drain-m1")
    assert job.params == {"member": member.pk, "admin_state": "drain"}
    detail = web(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "web/api/m1" in detail and f">{member.pk}<" not in detail
    exported = alice.client.get("/api/v1/export/").json()["jobs"]
    assert exported[0]["params"] == {"member": "web/api/m1", "admin_state": "drain"}
    # The API takes the name too; another tenant's name answers like a missing one.
    by_name = alice.client.post("/api/v1/jobs/", {"name": "by-name", "kind": "member_set_state",
                                                  "params": {"member": "web/api/m1", "admin_state": "active"},
                                                  "schedule_type": "once", "run_at": "2030-01-01T00:00:00Z"},
                                format="json")
    assert by_name.status_code == 201 and Job.objects.get(name="by-name").params["member"] == member.pk
    foreign = alice.client.post("/api/v1/jobs/", {"name": "foreign", "kind": "member_set_state",
                                                  "params": {"member": "gweb/gapi/g1", "admin_state": "drain"},
                                                  "schedule_type": "once", "run_at": "2030-01-01T00:00:00Z"},
                                format="json")
    assert foreign.status_code == 400 and "No member named 'gweb/gapi/g1'" in foreign.json()["detail"]
    assert theirs.pk not in [j.params.get("member") for j in Job.objects.all()]
