"""The tenancy contract (tests/api_contract.py) on the scheduling endpoints."""

from __future__ import annotations

from django.utils import timezone

from apps.scheduling.models import JobRun
from tests.api_contract import TenancyContract

JOB = {"name": "nightly", "kind": "noop", "schedule_type": "cron", "cron": "30 2 * * *", "timezone": "UTC"}


class TestJobs(TenancyContract):
    url = "/api/v1/jobs/"
    update = {"cron": "45 3 * * *"}

    def make(self, request):
        return request.getfixturevalue("make_job")(request.getfixturevalue("acme"), name="made")

    def payload(self, request):
        return dict(JOB)


class TestJobRuns(TenancyContract):
    url = "/api/v1/job-runs/"
    creatable = deletable = False

    def make(self, request):
        job = request.getfixturevalue("make_job")(request.getfixturevalue("acme"), name="ran")
        return JobRun.objects.create(job=job, scheduled_for=timezone.now())

    def payload(self, request):
        return {"job": 1}
