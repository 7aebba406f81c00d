"""The Events page: add a webhook, press "Send test event", read the delivery log; viewers and outsiders."""

from __future__ import annotations

import pytest

from apps.events import services
from apps.events.models import Delivery, Subscription
from tests.events.eventkit import SECRET
from tests.personas import web

pytestmark = pytest.mark.django_db



def test_add_a_webhook_and_send_a_test_event(acme, alice, vera, charlie, receiver, loopback_allowed):
    page = web(alice)
    added = page.post("/events/", {"name": "chat", "url": receiver.url, "secret": SECRET, "format": "slack",
                                   "types": ["job.failed"]})
    assert added.status_code == 200 and b"Subscription added." in added.content
    sub = Subscription.objects.get(org=acme, name="chat")
    assert (sub.format, sub.types) == ("slack", ["job.failed"])

    sent = page.post("/events/", {"test": str(sub.pk)})
    assert b"Test event sent to chat" in sent.content
    delivery = Delivery.objects.get(subscription=sub)
    assert services.delivery_attempt(delivery.pk).status == "delivered"
    assert receiver.requests[0].json == {"text": "[acme] Test event for subscription chat"}
    log = page.get("/events/").content.decode()
    assert "Send test event" in log and 'class="status-delivered"' in log

    viewer = web(vera)
    assert "chat" in viewer.get("/events/").content.decode()
    assert b"Send test event" not in viewer.get("/events/").content
    assert viewer.post("/events/", {"test": str(sub.pk)}).status_code == 403
    outsider = web(charlie)
    assert b"chat" not in outsider.get("/events/").content
    assert outsider.post("/events/", {"test": str(sub.pk)}).status_code == 404
    assert Delivery.objects.filter(subscription=sub).count() == 1


def test_a_refused_url_is_a_form_error(alice):
    response = web(alice).post("/events/", {"name": "x", "url": "http://169.254.169.254/", "secret": SECRET})
    assert response.status_code == 400 and b"link-local" in response.content
    assert not Subscription.objects.exists()
