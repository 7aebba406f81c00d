"""The tenancy contract (tests/api_contract.py) on events, subscriptions and the delivery log."""

from __future__ import annotations

from apps.events.models import Delivery, Event
from apps.events.services import event_emit
from tests.api_contract import TenancyContract
from tests.events.eventkit import SECRET, subscribe


class TestEvents(TenancyContract):
    url = "/api/v1/events/"
    creatable = False
    deletable = False

    def make(self, request):
        return Event.objects.create(org=request.getfixturevalue("acme"), type="job.failed", object_type="job",
                                    object_id="1", object_repr="nightly")

    def payload(self, request):
        return {"type": "forged"}


class TestSubscriptions(TenancyContract):
    url = "/api/v1/event-subscriptions/"
    update = {"enabled": False}

    def make(self, request):
        return subscribe(request.getfixturevalue("acme"), "https://hooks.example.com/x")

    def payload(self, request):
        return {"name": "chat", "url": "https://hooks.example.com/spillway", "format": "slack",
                "types": ["job.failed", "rollout.failed"], "secret": SECRET}


class TestDeliveries(TenancyContract):
    url = "/api/v1/event-deliveries/"
    creatable = False
    deletable = False

    def make(self, request):
        acme = request.getfixturevalue("acme")
        sub = subscribe(acme, "https://hooks.example.com/x")
        event = event_emit("job.failed", org=acme, object_type="job", object_id="1")
        return Delivery.objects.get(subscription=sub, event=event)

    def payload(self, request):
        return {"status": "delivered"}
