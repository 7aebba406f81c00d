"""Celery tasks for ACME: thin, take ids, idempotent (a second run finds the order running or not due)."""

from __future__ import annotations

from celery import shared_task

from apps.acme import services


@shared_task(name="acme.issue_certificate_task")
def issue_certificate_task(managed_id: int, force: bool = False) -> str | None:
    order = services.managed_certificate_issue(managed_id=managed_id, force=force)
    return None if order is None else order.status


@shared_task(name="acme.renew_due_task")
def renew_due_task() -> int:
    """Queue every managed certificate whose renewal (or retry after backoff) is due."""
    ids = services.due()
    for managed_id in ids:
        issue_certificate_task.delay(managed_id)
    services.expiring_alerts()
    return len(ids)
