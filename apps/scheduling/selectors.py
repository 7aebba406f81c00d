"""Reads for scheduled jobs: what a principal sees, a job's history, its next fire times."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from apps.accounts.principal import Principal
from apps.scheduling import cron, planning
from apps.scheduling.models import Job, JobRun


def job_list(*, principal: Principal, q: str = "") -> QuerySet[Job]:
    jobs = Job.objects.visible_to(principal).select_related("org").order_by("name")
    return jobs.filter(name__icontains=q) if q else jobs


def job_history(*, job: Job, limit: int = 50) -> QuerySet[JobRun]:
    """Newest slot first (the unique (job, scheduled_for) index, read backwards)."""
    return job.runs.order_by("-scheduled_for")[:limit]


def job_upcoming(*, job: Job, count: int = 5) -> list[datetime]:
    """The next `count` fire times (UTC) from the job's stored next slot; [] when paused or done."""
    try:
        return planning.upcoming(job.schedule(), first=job.next_fire_at, count=count, end_at=job.end_at)
    except cron.ScheduleError:
        return []
