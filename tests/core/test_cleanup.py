"""Housekeeping: expired idempotency keys and delivered embedded-broker messages are removed."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.models import IdempotencyRecord
from apps.core.tasks import cleanup_task


@pytest.mark.django_db
def test_cleanup_drops_expired_keys_and_delivered_broker_messages(settings, tmp_path):
    broker = tmp_path / "broker.sqlite3"
    with sqlite3.connect(broker) as db:
        db.execute("CREATE TABLE kombu_message (id INTEGER PRIMARY KEY, visible BOOLEAN, payload TEXT)")
        db.executemany("INSERT INTO kombu_message (visible, payload) VALUES (?, ?)",
                       [(0, "done"), (0, "done"), (1, "queued")])
    settings.CELERY_BROKER_URL = f"sqla+sqlite:///{broker}"
    settings.IDEMPOTENCY_TTL_S = 3600
    old = IdempotencyRecord.objects.create(scope="token:1", key="old", method_path="POST /x", request_hash="h")
    IdempotencyRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=2))
    fresh = IdempotencyRecord.objects.create(scope="token:1", key="fresh", method_path="POST /x", request_hash="h")

    assert cleanup_task() == {"idempotency_records": 1, "broker_messages": 2}

    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [fresh.pk]
    with sqlite3.connect(broker) as db:
        assert db.execute("SELECT payload FROM kombu_message").fetchall() == [("queued",)]
