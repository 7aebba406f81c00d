"""Celery tasks for event delivery: thin, take ids, idempotent (the service claims before sending)."""

from __future__ import annotations

from celery import shared_task

from apps.events import services


@shared_task(name="events.deliver_task", ignore_result=True)
def deliver_task(delivery_id: int) -> str:
    attempt = services.delivery_attempt(delivery_id)
    if attempt.status in ("retry", "deferred"):
        services._enqueue([delivery_id], countdown_s=attempt.retry_in_s)
    return attempt.status


@shared_task(name="events.sweep_task", ignore_result=True)
def sweep_task() -> int:
    return services.deliveries_sweep()
