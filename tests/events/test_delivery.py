"""Events reach subscriptions: once per event, signed, retried on 5xx, only within the owning org."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core import webhooks
from apps.events import services, types
from apps.events.models import Delivery, Event
from apps.events.services import event_emit
from tests.events.eventkit import SECRET, subscribe

pytestmark = pytest.mark.django_db

EMITTED_TYPES = sorted(set(types.TYPES) - {"test"})


def _drain() -> list[str]:
    """Run every due delivery the way the worker does (the task is a thin wrapper over this)."""
    return [services.delivery_attempt(pk).status
            for pk in Delivery.objects.filter(status=Delivery.Status.PENDING).values_list("pk", flat=True)]


def test_each_event_type_is_delivered_once_signed(acme, receiver, loopback_allowed):
    sub = subscribe(acme, receiver.url)
    for event_type in EMITTED_TYPES:
        event_emit(event_type, org=acme, object_type="thing", object_id="7", object_repr="web-lb",
                   data={"status": "down", "revision": 3})
    assert _drain() == ["delivered"] * len(EMITTED_TYPES)
    # A second pass, the sweeper and a duplicate task message send nothing more.
    services.deliveries_sweep()
    assert _drain() == []
    assert {services.delivery_attempt(d.pk).status for d in Delivery.objects.all()} == {"not_due"}

    assert sorted(r.headers["x-spillway-event"] for r in receiver.requests) == EMITTED_TYPES
    for received in receiver.requests:
        stamp = int(received.headers["x-spillway-timestamp"])
        assert webhooks.verify(SECRET, stamp, received.raw, received.headers["x-spillway-signature"])
        assert not webhooks.verify("another-secret-123456", stamp, received.raw,
                                   received.headers["x-spillway-signature"])
        body = received.json
        assert body["org"] == "acme" and body["object"] == {"type": "thing", "id": "7", "repr": "web-lb"}
        assert "web-lb" in body["summary"] and body["type"] == received.headers["x-spillway-event"]
    log = list(Delivery.objects.filter(subscription=sub))
    assert {d.status for d in log} == {"delivered"} and {d.attempts for d in log} == {1}


def test_a_500_is_retried_with_backoff_and_then_delivered(acme, receiver, loopback_allowed, settings):
    settings.EVENTS_RETRY_BASE_S = 30
    subscribe(acme, receiver.url)
    receiver.statuses = [500, 503]
    event_emit("rollout.failed", org=acme, object_type="loadbalancer", object_id="1", data={"error": "boom"})
    delivery = Delivery.objects.get()

    first = services.delivery_attempt(delivery.pk)
    assert first.status == "retry" and first.retry_in_s == 30
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.last_status_code == 500 and "HTTP 500" in delivery.last_error
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=25)
    assert services.delivery_attempt(delivery.pk).status == "not_due"  # the backoff holds

    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    second = services.delivery_attempt(delivery.pk)
    assert second.status == "retry" and second.retry_in_s == 120  # 4x the first delay
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert services.delivery_attempt(delivery.pk).status == "delivered"

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 3, 200)
    assert len(receiver.requests) == 3
    # The receiver can tell a retry from a new event: the delivery id stays.
    assert len({r.headers["x-spillway-delivery"] for r in receiver.requests}) == 1


def test_delivery_gives_up_after_the_last_attempt(acme, receiver, loopback_allowed, settings):
    settings.EVENTS_MAX_ATTEMPTS = 2
    subscribe(acme, receiver.url)
    receiver.statuses = [500, 500, 500]
    event_emit("job.failed", org=acme, object_type="job", object_id="1")
    pk = Delivery.objects.get().pk
    assert services.delivery_attempt(pk).status == "retry"
    Delivery.objects.filter(pk=pk).update(next_attempt_at=timezone.now())
    assert services.delivery_attempt(pk).status == "failed"
    assert Delivery.objects.get().status == "failed" and len(receiver.requests) == 2


def test_slack_format_and_type_filter(acme, receiver, loopback_allowed):
    subscribe(acme, receiver.url, format="slack", types=["overflow.started"])
    event_emit("overflow.started", org=acme, object_type="pool", object_id="4", object_repr="web",
               data={"region": "eu-west"})
    event_emit("job.failed", org=acme, object_type="job", object_id="1")  # not subscribed to
    _drain()
    assert [r.json for r in receiver.requests] == [{"text": "[acme] Pool web overflows out of eu-west"}]


def test_tenants_receive_and_see_only_their_own_events(acme, globex, ops, alice, charlie, otto, receiver,
                                                       loopback_allowed):
    theirs = subscribe(globex, receiver.url, name="globex-hook")
    mine = subscribe(acme, receiver.url, name="acme-hook")
    operator = subscribe(ops, receiver.url, name="ops-hook")
    acme_event = event_emit("job.failed", org=acme, object_type="job", object_id="1")
    fleet_event = event_emit("drift.found", object_type="node", object_id="2", object_repr="n1")  # operator's
    _drain()
    assert set(Delivery.objects.values_list("subscription_id", "event_id")) == {
        (mine.pk, acme_event.pk), (operator.pk, fleet_event.pk)}
    assert theirs.deliveries.count() == 0

    def listed(persona) -> set[int]:
        return {row["id"] for row in persona.client.get("/api/v1/events/").json()["results"]}

    assert listed(alice) == {acme_event.pk}
    assert listed(charlie) == set()
    assert listed(otto) >= {acme_event.pk, fleet_event.pk}
    assert charlie.client.get(f"/api/v1/events/{acme_event.pk}/").status_code == 404
    assert charlie.client.get(f"/api/v1/event-deliveries/?subscription={mine.pk}").status_code in (200, 400)
    assert charlie.client.get("/api/v1/event-deliveries/").json()["count"] == 0


def test_send_test_event_button(acme, alice, vera, charlie, receiver, loopback_allowed):
    created = alice.client.post("/api/v1/event-subscriptions/", {
        "name": "chat", "url": receiver.url, "types": ["job.failed"], "secret": SECRET}, format="json")
    assert created.status_code == 201, created.content
    assert "secret" not in created.json() and created.json()["secret_set"] is True
    url = f"/api/v1/event-subscriptions/{created.json()['id']}/test/"
    assert vera.client.post(url).status_code == 403
    assert charlie.client.post(url).status_code == 404
    response = alice.client.post(url)
    assert response.status_code == 202 and response.json()["type"] == "test"
    _drain()
    assert [r.headers["x-spillway-event"] for r in receiver.requests] == ["test"]
    log = alice.client.get(f"/api/v1/event-deliveries/?subscription={created.json()['id']}").json()["results"]
    assert [(d["event_type"], d["status"], d["last_status_code"]) for d in log] == [("test", "delivered", 200)]


@pytest.mark.parametrize(("url", "code"), [
    ("http://169.254.169.254/latest/meta-data", "forbidden_address"),
    ("http://127.0.0.1:6379/", "internal_address"),
    ("file:///etc/passwd", "invalid_url_scheme"),
    ("http://user:pw@hooks.example.com/", "invalid_url"),
])
def test_hostile_urls_are_refused(alice, url, code):
    response = alice.client.post("/api/v1/event-subscriptions/", {
        "name": "x", "url": url, "secret": SECRET}, format="json")
    assert response.status_code == 400 and response.json()["code"] == code


def test_subscription_needs_a_secret_and_known_types(alice):
    base = {"name": "x", "url": "https://hooks.example.com/"}
    assert alice.client.post("/api/v1/event-subscriptions/", base, format="json").json()["code"] == "secret_required"
    bad = alice.client.post("/api/v1/event-subscriptions/", {**base, "secret": SECRET, "types": ["nope"]},
                            format="json")
    assert bad.status_code == 400 and "types" in bad.json()["fields"]


def test_an_event_that_cannot_be_recorded_never_breaks_the_caller(acme):
    assert event_emit("x" * 10, org=acme, object_type="job", object_id="1", data={"bad": object()}) is None
    assert Event.objects.count() == 0


def test_a_committed_event_is_one_log_line_and_a_rolled_back_one_none(acme, caplog, django_capture_on_commit_callbacks):
    caplog.set_level("INFO", logger="apps.events.services")
    with django_capture_on_commit_callbacks(execute=True):
        event_emit("rollout.failed", org=acme, object_type="loadbalancer", object_id="1", object_repr="edge",
                   data={"rollout": 4, "error": "reload failed\nbind conflict"})
    with django_capture_on_commit_callbacks(execute=False):  # the caller's transaction rolls back
        event_emit("job.failed", org=acme, object_type="job", object_id="1", object_repr="nightly")
    lines = [r.getMessage() for r in caplog.records if r.name == "apps.events.services"]
    assert lines == [f"event rollout.failed [{acme.slug}]: Rollout 4 of edge failed: reload failed / bind conflict"]


def test_slack_text_a_tenant_wrote_cannot_mention_or_relabel_a_link(acme, receiver, loopback_allowed):
    subscribe(acme, receiver.url, format="slack")
    event_emit("job.failed", org=acme, object_type="job", object_id="1", object_repr="nightly",
               data={"status": "failed", "error": "<!channel> <https://evil.example/login|Sign in again> & more"})
    assert _drain() == ["delivered"]
    text = receiver.requests[0].json["text"]
    assert "<!channel>" not in text and "<https://" not in text
    assert "&lt;!channel&gt; &lt;https://evil.example/login|Sign in again&gt; &amp; more" in text


def test_the_delivery_log_names_the_host_never_the_internal_address_it_resolved_to(acme):
    subscribe(acme, "http://localhost:9/hook")  # a tenant's internal name (loopback not allowed here)
    event_emit("drift.found", org=acme, object_type="fleet", object_id="1", data={"detail": "x"})
    assert _drain() == ["failed"]
    error = Delivery.objects.get().last_error
    assert error.startswith("internal_address: localhost resolves to an internal address")
    assert "127.0.0.1" not in error and "::1" not in error and "jobs" not in error


@pytest.mark.parametrize("url", ["https://a..x/", f"https://{'a' * 64}.example/", "https://exa\u2028mple.com/",
                                 "https://./"])
def test_a_subscription_to_a_host_dns_cannot_carry_is_refused(alice, url):
    response = alice.client.post("/api/v1/event-subscriptions/", {"name": "bad", "url": url, "secret": "s" * 20},
                                 format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] in ("invalid_url_host", "invalid_url")


def test_a_saved_url_that_can_never_be_sent_fails_at_once_instead_of_staying_sending(acme):
    from apps.events.models import Subscription

    sub = subscribe(acme, "https://ok.example/hook")
    Subscription.objects.filter(pk=sub.pk).update(url="https://a..x/")  # saved before hosts were checked
    event_emit("drift.found", org=acme, object_type="fleet", object_id="1", data={"detail": "x"})
    assert _drain() == ["failed"]
    assert Delivery.objects.get().status == Delivery.Status.FAILED
