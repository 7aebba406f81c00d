"""One org's slow webhook receivers never delay another org's deliveries (a real events worker).

GIVEN acme with 8 subscriptions whose receivers trickle forever (a header byte every 0.2 s) and the events
worker as `runall` runs it (threads, concurrency 8, EVENTS_TIMEOUT_S=3), WHEN acme emits an event (8
deliveries that each hold a thread) and then globex emits one, THEN globex's receiver has it within 2 s,
and acme's attempts were cut at their deadline, not left "sending".
"""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from apps.events.models import Delivery
from apps.events.services import event_emit
from tests.events.eventkit import subscribe
from tests.netutil import Trickle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

WORKER_ENV = {"SCHEDULING_TENANT_URL_ALLOW_CIDRS": "127.0.0.0/8", "EVENTS_TIMEOUT_S": "3",
              "EVENTS_RETRY_BASE_S": "30"}


def test_eight_trickling_receivers_of_one_org_do_not_delay_another_orgs_delivery(acme, globex, receiver,
                                                                                 celery_worker_factory):
    celery_worker_factory(name="events-slow", queues="events", pool="threads", concurrency=8, **WORKER_ENV)
    slow = [Trickle(every_s=0.2, limit_s=60) for _ in range(8)]
    try:
        for n, server in enumerate(slow):
            subscribe(acme, f"{server.url}/hook", name=f"slow-{n}")
        subscribe(globex, receiver.url)
        with transaction.atomic():
            event_emit("drift.found", org=acme, object_type="fleet", object_id="1", data={"detail": "x"})
        deadline = time.monotonic() + 10
        while Delivery.objects.filter(status=Delivery.Status.SENDING).count() < 2:
            assert time.monotonic() < deadline, "the slow deliveries never started"
            time.sleep(0.05)
        time.sleep(0.5)  # every slow delivery the worker will take is taken now

        sent = time.monotonic()
        with transaction.atomic():
            event_emit("drift.found", org=globex, object_type="fleet", object_id="2", data={"detail": "y"})
        assert receiver.arrived.wait(10), "globex's delivery never arrived"
        waited = time.monotonic() - sent
        print(f"globex delivery arrived {waited:.3f} s after its event")
        assert waited < 2.0, f"globex waited {waited:.2f} s behind acme's slow receivers"

        # acme's attempts end at their 3 s deadline (then wait for their retry), never "sending" for long.
        time.sleep(4.0)
        stuck = Delivery.objects.filter(subscription__org=acme, status=Delivery.Status.SENDING,
                                        attempts__gte=1, claimed_at__isnull=False)
        cut = Delivery.objects.filter(subscription__org=acme, last_error__contains="DeadlineExceeded")
        assert cut.count() >= 2, list(Delivery.objects.values_list("status", "last_error"))
        assert all(d.duration_ms is None or d.duration_ms < 3500 for d in cut)
        assert stuck.count() <= 2  # at most the org's concurrency is sending at any moment
    finally:
        for server in slow:
            server.close()
