"""Celery work of cloud applies: synthesis and terraform run only in the long-lived worker."""

from __future__ import annotations

from celery import shared_task

from apps.cloud import services


@shared_task(name="cloud.plan_task")
def plan_task(apply_id: int) -> str:
    return services.run_plan(apply_id)


@shared_task(name="cloud.apply_task")
def apply_task(apply_id: int) -> str:
    return services.run_apply(apply_id)


@shared_task(name="cloud.drift_task")
def drift_task() -> int:
    """Plan every cloud LB on its target; a plan with changes after an apply is drift, shown as a run."""
    return services.plan_drift()
