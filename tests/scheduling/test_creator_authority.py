"""A scheduled job does not outlive the authority of whoever made it: a job created with a short-lived token
stops running (the run fails with `creator_revoked`, the job is paused) once that token is revoked or
expires, or once its creating user is no longer an editor of the org; an editor who resumes it takes it over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken, Membership, Role
from apps.accounts.services import token_create, token_revoke
from apps.scheduling import runner
from apps.scheduling.models import Job, JobRun

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"
JOB = {"name": "ci-drain", "kind": "noop", "schedule_type": "interval", "interval_s": 600, "timezone": "UTC"}


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _run_once(client: APIClient, job_id: int) -> JobRun:
    response = client.post(f"{JOBS}{job_id}/run/")
    assert response.status_code == 202, response.content
    run_id = response.json()["id"]
    runner.run_chunk([run_id], worker="w1")
    return JobRun.objects.get(pk=run_id)


@pytest.fixture
def ci(alice):
    """A 10-minute CI token of alice's (write scope), and the job it created."""
    created = token_create(org=alice.org, name="ci", scopes=["read", "write"], user=alice.user,
                           expires_at=timezone.now() + timedelta(minutes=10))
    client = _client(created.secret)
    response = client.post(JOBS, JOB, format="json")
    assert response.status_code == 201, response.content
    return created, response.json()["id"]


def test_a_job_runs_while_its_creating_token_is_valid(ci, alice) -> None:
    _, job_id = ci
    assert _run_once(alice.client, job_id).status == "succeeded"


def test_a_revoked_creating_token_ends_the_job(ci, alice, bob) -> None:
    created, job_id = ci
    token_revoke(token=ApiToken.objects.get(pk=created.token.pk), principal=None)
    run = _run_once(alice.client, job_id)
    assert run.status == "failed" and run.error.startswith("creator_revoked:")
    job = Job.objects.get(pk=job_id)
    assert job.enabled is False and job.next_fire_at is None
    # An editor who resumes it takes it over; it runs on their authority from then on.
    assert bob.client.post(f"{JOBS}{job_id}/resume/").status_code == 200
    assert _run_once(bob.client, job_id).status == "succeeded"


def test_an_expired_creating_token_ends_the_job(ci, alice) -> None:
    created, job_id = ci
    ApiToken.objects.filter(pk=created.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    run = _run_once(alice.client, job_id)
    assert run.status == "failed" and "revoked or has expired" in run.error


def test_a_job_of_a_user_who_is_no_longer_an_editor_stops(bob, alice) -> None:
    job_id = bob.client.post(JOBS, JOB, format="json").json()["id"]
    Membership.objects.filter(user=bob.user, org=bob.org).update(role=Role.VIEWER)
    run = _run_once(alice.client, job_id)
    assert run.status == "failed" and "no longer an editor" in run.error


def test_an_outsider_cannot_resume_or_run_a_paused_job(ci, alice, charlie) -> None:
    created, job_id = ci
    token_revoke(token=ApiToken.objects.get(pk=created.token.pk), principal=None)
    _run_once(alice.client, job_id)
    assert charlie.client.post(f"{JOBS}{job_id}/resume/").status_code == 404
    assert Job.objects.get(pk=job_id).enabled is False


def test_an_operators_job_for_a_customer_org_keeps_running(otto, acme) -> None:
    response = otto.client.post(JOBS, {**JOB, "org": "acme"}, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).org == acme
    assert _run_once(otto.client, response.json()["id"]).status == "succeeded"
