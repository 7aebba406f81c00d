"""Celery tasks for ACME: thin, take ids, idempotent (a second run finds the order running or not due)."""

from __future__ import annotations

from celery import shared_task

from apps.acme import services
from apps.fleets import services as fleet_services

BATCH = 100  # due certificates one task orders and deploys together


@shared_task(name="acme.issue_certificate_task")
def issue_certificate_task(managed_id: int, force: bool = False) -> str | None:
    """One certificate asked for (API request, renew now, changed domain list), ordered together with
    every other due one: requests arriving while a batch runs queue one task each, and the first of
    them to start takes all of them, so each fleet renders and pushes once per batch rather than once
    per certificate (the tasks after it find theirs running or done and return)."""
    others = [pk for pk in services.due() if pk != managed_id][:BATCH - 1]
    orders = services.managed_certificates_issue(managed_ids=[managed_id, *others], force=force)
    mine = [o for o in orders if o.managed_id == managed_id]
    return mine[0].status if mine else None


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
    fleet_services.challenge_answers_expire()
    return len(ids)
