"""/api/v1/jobs/ and /api/v1/job-runs/: what a client sees, including tenancy and validation errors."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from apps.scheduling.models import Job, JobRun
from tests.factories import MemberFactory, PoolFactory, PoolRegionFactory, RegionFactory

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"
RUNS = "/api/v1/job-runs/"
BERLIN_DAILY = {"name": "nightly-drain", "kind": "noop", "schedule_type": "cron", "cron": "30 2 * * *",
                "timezone": "Europe/Berlin"}


def create(persona, **overrides):
    return persona.client.post(JOBS, {**BERLIN_DAILY, **overrides}, format="json")


def test_a_cron_job_shows_a_description_and_its_next_five_times(alice) -> None:
    response = create(alice)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert "02:30" in body["description"] and "Europe/Berlin" in body["description"]
    times = [datetime.fromisoformat(t) for t in body["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times) and times[0] > datetime.now(UTC)
    assert {t.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M") for t in times} <= {
        "02:30", "03:00"}
    assert body["next_fire_at"] == body["next_fire_times"][0]
    assert body["org"] == "acme" and body["enabled"] is True and response.has_header("ETag")


@pytest.mark.parametrize(("fields", "code", "field"), [
    ({"cron": "61 * * * *"}, "invalid_cron", "cron"),
    ({"cron": "0 0 30 2 *"}, "invalid_cron", "cron"),
    ({"timezone": "Mars/Olympus"}, "invalid_timezone", "timezone"),
    ({"schedule_type": "interval", "interval_s": None}, "invalid_interval", "interval_s"),
    ({"schedule_type": "once", "run_at": "2001-01-01T00:00:00Z"}, "run_at_in_past", "run_at"),
    ({"params": {"sleep_s": 1, "colour": "red"}}, "invalid_params", "params.colour"),
    ({"params": {"sleep_s": "1"}}, "invalid_params", "params.sleep_s"),
    ({"webhook_url": "http://169.254.169.254/latest/meta-data/", "webhook_secret": "s" * 20},
     "forbidden_address", "webhook_url"),
    ({"webhook_url": "ftp://hooks.example.com/x", "webhook_secret": "s" * 20}, "invalid_url_scheme", "webhook_url"),
    ({"webhook_url": "https://hooks.example.com/x"}, "webhook_secret_required", "webhook_secret"),
])
def test_invalid_jobs_are_refused_with_a_code_and_the_field(alice, fields, code, field) -> None:
    response = create(alice, **fields)
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert field in response.json()["fields"]


def test_a_drain_window_job_may_only_name_members_its_org_can_see(alice, charlie) -> None:
    region = RegionFactory(slug="eu-west")
    own = MemberFactory(pool=PoolRegionFactory(pool=PoolFactory(org=alice.org), region=region).pool, region=region)
    foreign_pool = PoolFactory(org=charlie.org)
    foreign = MemberFactory(pool=foreign_pool, region=region)
    ok = create(alice, kind="member_set_state", params={"member": own.pk, "admin_state": "drain"})
    assert ok.status_code == 201, ok.json()
    refused = create(alice, name="steal", kind="member_set_state",
                     params={"member": foreign.pk, "admin_state": "drain"})
    assert refused.status_code == 400
    assert refused.json()["fields"]["params.member"] == [f"member {foreign.pk} not found."]


def test_fleet_kinds_are_for_the_operator_only(alice) -> None:
    response = create(alice, kind="fleet_rollout", params={"fleet": 1})
    assert response.status_code in (400, 403)
    assert response.json()["code"] == "operator_only"


def test_the_webhook_secret_is_accepted_but_never_shown(alice) -> None:
    response = create(alice, webhook_url="https://hooks.example.com/spillway", webhook_secret="x" * 32)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert "webhook_secret" not in body and body["webhook_secret_set"] is True
    assert "x" * 32 not in str(alice.client.get(f"{JOBS}{body['id']}/").json())
    assert Job.objects.get(pk=body["id"]).webhook_secret_encrypted not in ("", "x" * 32)


def test_run_now_creates_a_manual_run_visible_in_the_history(alice) -> None:
    job_id = create(alice).json()["id"]
    response = alice.client.post(f"{JOBS}{job_id}/run/")
    assert response.status_code == 202
    run = response.json()
    assert run["trigger"] == "manual" and run["status"] == "pending" and run["job"] == job_id
    history = alice.client.get(RUNS, {"job": job_id}).json()
    assert [r["id"] for r in history["results"]] == [run["id"]]


def test_pause_stops_the_schedule_and_cancels_waiting_runs_and_resume_restarts_it(alice) -> None:
    job_id = create(alice).json()["id"]
    run_id = alice.client.post(f"{JOBS}{job_id}/run/").json()["id"]
    paused = alice.client.post(f"{JOBS}{job_id}/pause/").json()
    assert paused["enabled"] is False and paused["next_fire_at"] is None and paused["next_fire_times"] == []
    assert "paused" in paused["description"]
    assert JobRun.objects.get(pk=run_id).status == "cancelled"
    resumed = alice.client.post(f"{JOBS}{job_id}/resume/").json()
    assert resumed["enabled"] is True and len(resumed["next_fire_times"]) == 5


def test_changing_the_schedule_moves_the_next_fire_time(alice) -> None:
    job = create(alice).json()
    response = alice.client.patch(f"{JOBS}{job['id']}/", {"schedule_type": "interval", "interval_s": 600},
                                  format="json")
    assert response.status_code == 200, response.json()
    times = [datetime.fromisoformat(t) for t in response.json()["next_fire_times"]]
    assert [b - a for a, b in itertools.pairwise(times)] == [timedelta(minutes=10)] * 4
    assert response.json()["description"].startswith("Every 10 minutes")


def test_if_match_protects_edits_but_not_against_the_dispatcher(alice) -> None:
    job_id = create(alice).json()["id"]
    etag = alice.client.get(f"{JOBS}{job_id}/")["ETag"]
    # The dispatcher moving the job on is not an edit: the ETag still matches.
    Job.objects.filter(pk=job_id).update(next_fire_at=datetime.now(UTC) + timedelta(days=3), last_status="failed")
    assert alice.client.get(f"{JOBS}{job_id}/")["ETag"] == etag
    ok = alice.client.patch(f"{JOBS}{job_id}/", {"max_retries": 2}, format="json", HTTP_IF_MATCH=etag)
    assert ok.status_code == 200
    stale = alice.client.patch(f"{JOBS}{job_id}/", {"max_retries": 3}, format="json", HTTP_IF_MATCH=etag)
    assert stale.status_code == 412


def test_preview_describes_a_schedule_without_saving_it(alice) -> None:
    response = alice.client.get(f"{JOBS}preview/", {"schedule_type": "cron", "cron": "*/15 * * * *",
                                                    "timezone": "UTC"})
    assert response.status_code == 200
    assert response.json()["description"].startswith("Every 15 minutes")
    assert len(response.json()["next_fire_times"]) == 5
    bad = alice.client.get(f"{JOBS}preview/", {"schedule_type": "cron", "cron": "bogus"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cron"
    assert not Job.objects.exists()


def test_cancel_a_waiting_run_and_runs_cannot_be_created_directly(alice) -> None:
    job_id = create(alice).json()["id"]
    run_id = alice.client.post(f"{JOBS}{job_id}/run/").json()["id"]
    assert alice.client.post(RUNS, {"job": job_id}, format="json").status_code == 405
    cancelled = alice.client.post(f"{RUNS}{run_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert alice.client.post(f"{RUNS}{run_id}/cancel/").json()["code"] == "run_finished"


# --- tenancy --------------------------------------------------------------------------------


def test_anonymous_gets_401(anon) -> None:
    assert anon.get(JOBS).status_code == 401
    assert anon.get(RUNS).status_code == 401


def test_a_viewer_reads_but_cannot_change_or_run(alice, vera) -> None:
    job_id = create(alice).json()["id"]
    assert vera.client.get(f"{JOBS}{job_id}/").status_code == 200
    assert create(vera, name="mine").status_code == 403
    assert vera.client.post(f"{JOBS}{job_id}/run/").status_code == 403
    assert vera.client.post(f"{JOBS}{job_id}/pause/").status_code == 403
    assert vera.client.patch(f"{JOBS}{job_id}/", {"enabled": False}, format="json").status_code == 403
    assert vera.client.delete(f"{JOBS}{job_id}/").status_code == 403


def test_an_editor_can_create_and_run(bob) -> None:
    job_id = create(bob).json()["id"]
    assert bob.client.post(f"{JOBS}{job_id}/run/").status_code == 202


def test_an_outsider_gets_404_and_sees_nothing(alice, charlie) -> None:
    job_id = create(alice).json()["id"]
    run_id = alice.client.post(f"{JOBS}{job_id}/run/").json()["id"]
    assert charlie.client.get(f"{JOBS}{job_id}/").status_code == 404
    assert charlie.client.post(f"{JOBS}{job_id}/run/").status_code == 404
    assert charlie.client.post(f"{JOBS}{job_id}/pause/").status_code == 404
    assert charlie.client.delete(f"{JOBS}{job_id}/").status_code == 404
    assert charlie.client.get(f"{RUNS}{run_id}/").status_code == 404
    assert charlie.client.post(f"{RUNS}{run_id}/cancel/").status_code == 404
    assert charlie.client.get(JOBS).json()["results"] == []
    # A foreign job id in a filter answers exactly like a missing one (no existence oracle).
    foreign, missing = charlie.client.get(RUNS, {"job": job_id}), charlie.client.get(RUNS, {"job": 987654})
    assert foreign.status_code == missing.status_code == 400
    assert foreign.json() == missing.json()
    # ...and cannot create a job in acme's name.
    refused = create(charlie, name="sneaky", org="acme")
    assert refused.status_code == 400 and "org" in refused.json()["fields"]


def test_the_operator_sees_every_orgs_jobs(alice, otto) -> None:
    job_id = create(alice).json()["id"]
    assert otto.client.get(f"{JOBS}{job_id}/").status_code == 200


def test_deleting_a_job_removes_its_history(alice) -> None:
    job_id = create(alice).json()["id"]
    alice.client.post(f"{JOBS}{job_id}/run/")
    assert alice.client.delete(f"{JOBS}{job_id}/").status_code == 204
    assert not JobRun.objects.filter(job_id=job_id).exists()
