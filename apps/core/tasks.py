"""Housekeeping tasks."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from apps.core.models import IdempotencyRecord


@shared_task(name="core.cleanup_task")
def cleanup_task() -> dict[str, int]:
    cutoff = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_TTL_S)
    removed_keys, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return {"idempotency_records": removed_keys, "broker_messages": _clean_embedded_broker()}


def _clean_embedded_broker() -> int:
    """kombu's SQLAlchemy transport keeps delivered messages (visible=False) forever."""
    url = str(settings.CELERY_BROKER_URL)
    if not url.startswith("sqla+sqlite:///"):
        return 0
    import sqlite3

    path = url.removeprefix("sqla+sqlite:///")
    try:
        with sqlite3.connect(path, timeout=10) as db:
            cur = db.execute("DELETE FROM kombu_message WHERE visible = 0")
            return cur.rowcount
    except sqlite3.OperationalError:
        return 0  # table not created yet: nothing to clean


