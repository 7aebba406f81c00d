"""Deliveries through a real Celery worker on the events queue (the way `runall` runs it): every event type
arrives once; a 500 is retried by the worker after its backoff and then arrives, with the same delivery id."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from apps.events import types
from apps.events.models import Delivery
from apps.events.services import event_emit
from tests.events.eventkit import subscribe
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

EMITTED_TYPES = sorted(set(types.TYPES) - {"test"})
WORKER_ENV = {"SCHEDULING_TENANT_URL_ALLOW_CIDRS": "127.0.0.0/8", "EVENTS_RETRY_BASE_S": "1"}


def test_every_event_type_reaches_the_receiver_once_through_the_events_worker(acme, receiver, celery_worker_factory):
    celery_worker_factory(name="events-w1", queues="events", concurrency=2, **WORKER_ENV)
    subscribe(acme, receiver.url)
    for event_type in EMITTED_TYPES:
        with transaction.atomic():  # delivery is enqueued when this commits
            event_emit(event_type, org=acme, object_type="thing", object_id="7", data={"revision": 3})
    wait_until(lambda: Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == len(EMITTED_TYPES), 30.0)
    time.sleep(1.0)  # room for a duplicate to show up, if the worker would send one
    assert sorted(r.headers["x-spillway-event"] for r in receiver.requests) == EMITTED_TYPES
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}


def test_a_500_is_retried_by_the_worker_after_its_backoff(acme, receiver, celery_worker_factory):
    celery_worker_factory(name="events-w2", queues="events", concurrency=2, **WORKER_ENV)
    subscribe(acme, receiver.url)
    receiver.statuses = [500]
    with transaction.atomic():
        event_emit("rollout.failed", org=acme, object_type="loadbalancer", object_id="1", data={"error": "boom"})
    wait_until(lambda: Delivery.objects.filter(status=Delivery.Status.DELIVERED).exists(), 30.0)
    delivery = Delivery.objects.get()
    assert (delivery.attempts, delivery.last_status_code) == (2, 200)
    assert len(receiver.requests) == 2
    first, second = receiver.requests
    assert first.headers["x-spillway-delivery"] == second.headers["x-spillway-delivery"]
    assert delivery.delivered_at is not None
