"""Celery tasks for ACME: thin, take ids, idempotent (a second run finds the order running or not due)."""

from __future__ import annotations

from celery import shared_task

from apps.acme import services

BATCH = 100  # due certificates one task orders and deploys together


@shared_task(name="acme.issue_certificate_task")
def issue_certificate_task(managed_id: int, force: bool = False) -> str | None:
    order = services.managed_certificate_issue(managed_id=managed_id, force=force)
    return None if order is None else order.status


@shared_task(name="acme.issue_certificates_task")
def issue_certificates_task(managed_ids: list[int]) -> int:
    """Order and deploy several due certificates together (one render and push per fleet)."""
    return len(services.managed_certificates_issue(managed_ids=managed_ids))


@shared_task(name="acme.renew_due_task")
def renew_due_task() -> int:
    """Queue every managed certificate whose renewal (or retry after backoff) is due, in batches."""
    ids = services.due()
    for first in range(0, len(ids), BATCH):
        issue_certificates_task.delay(ids[first:first + BATCH])
    services.expiring_alerts()
    return len(ids)
