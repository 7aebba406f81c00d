"""Writes for events: emit, subscriptions, and one delivery attempt.

`event_emit` is what other apps call at the point something happened. It never raises into its
caller (a rollout must not fail because an event row could not be written) and it enqueues the
deliveries only when the caller's transaction commits, so a rolled-back change sends nothing.

Delivery guarantees: one Delivery row per (subscription, event); an attempt first claims the row
with a conditional UPDATE (pending and due → sending), so two workers, a retry and the sweeper never
send the same attempt twice. A 2xx answer ends it; anything else is retried with backoff
(`types.backoff_s`) up to EVENTS_MAX_ATTEMPTS; a URL the address policy refuses fails at once.

Fairness: an attempt has one deadline, EVENTS_TIMEOUT_S, for all of it (apps.core.outbound), and an org has
at most EVENTS_ORG_CONCURRENCY attempts sending at once: a claim beyond that leaves the delivery pending
and tries again shortly (`deferred`, not an attempt). One org's slow receivers therefore hold at most that
many of the events worker's threads, and every other org's deliveries go on at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.audit.services import audited_delete, audited_save
from apps.core import crypto, quotas, webhooks
from apps.core.enqueue import enqueue
from apps.core.errors import DomainError
from apps.core.prepared import PreparedQuery
from apps.events import types
from apps.events.models import Delivery, Event, Subscription

log = logging.getLogger(__name__)

MIN_SECRET_LEN = 16
STALE_CLAIM_S = 60.0
DEFER_S = 0.5  # an org at its concurrency: look again this soon
_ORG_LOCK_NS = 7301  # pg_advisory_xact_lock(namespace, org id): one claim per org at a time


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


# Read for every event recorded (each rollout's, on a route change's path): compiled once (apps.core.prepared).
_ORG_SUBSCRIPTIONS = PreparedQuery(lambda org_id: Subscription.objects.filter(org_id=org_id, enabled=True),
                                   {"org_id": (1, 2)})
_OPERATOR_SUBSCRIPTIONS = PreparedQuery(lambda: Subscription.objects.filter(org__kind="operator", enabled=True), {})


def event_emit(event_type: str, *, org: Any = None, obj: Any = None, object_type: str = "", object_id: Any = "",
               object_repr: str = "", data: dict[str, Any] | None = None,
               only: Subscription | None = None) -> Event | None:
    """Record an event about `obj` (or the given object_* fields) for `org` (None: the operator's).

    Returns the event, or None when it could not be recorded (logged, never raised).
    """
    if obj is not None:
        object_type = object_type or obj._meta.model_name
        object_id = object_id or obj.pk
        object_repr = object_repr or str(obj)
    try:
        with transaction.atomic():  # a savepoint: a failure here leaves the caller's transaction usable
            event = Event.objects.create(org=org, type=event_type[:64], object_type=object_type[:64],
                                         object_id=str(object_id)[:64], object_repr=object_repr[:200],
                                         data=data or {})
            if only is not None:
                subscriptions = [only]
            else:
                enabled = _ORG_SUBSCRIPTIONS.all(org_id=org.pk) if org is not None else _OPERATOR_SUBSCRIPTIONS.all()
                subscriptions = [s for s in enabled if s.wants(event_type)]
            now = timezone.now()
            ids = [d.pk for d in Delivery.objects.bulk_create(
                [Delivery(subscription=s, event=event, next_attempt_at=now) for s in subscriptions])]
    except Exception:
        log.exception("event %s on %s:%s not recorded", event_type, object_type, object_id)
        return None
    if ids:
        transaction.on_commit(lambda: _enqueue(ids))
    # One log line per event, once it is real (committed): `make run` shows these on its console.
    text = types.summary(event.type, object_repr, event.data).replace("\n", " / ")
    line = f"event {event.type} [{getattr(org, 'slug', None) or 'operator'}]: {text}"
    transaction.on_commit(lambda: log.info("%s", line))
    return event


def _enqueue(delivery_ids: list[int], countdown_s: float = 0.0) -> None:
    for delivery_id in delivery_ids:
        try:
            enqueue("events.deliver_task", delivery_id, countdown=countdown_s or None)
        except Exception:  # broker down: the sweeper sends it later
            log.exception("delivery %s not enqueued", delivery_id)


# --- subscriptions ------------------------------------------------------------------------------------


def subscription_save(*, principal: Any, subscription: Subscription, data: dict[str, Any],
                      secret: str | None = None) -> Subscription:
    if subscription.pk is None:
        subscription.org = principal.org
        quotas.check_count(subscription.org, "event_subscriptions")
    if principal is not None and (subscription.pk is None or (data.get("enabled") and not subscription.enabled)):
        data = {**data, "created_by": principal.actor}  # made, or turned on again: it sends on this one's authority
    org = subscription.org
    url = data.get("url", subscription.url)
    try:
        webhooks.parse_url(url, webhooks.org_policy(org))
    except webhooks.UnsafeUrl as exc:
        raise DomainError(exc.code, exc.message, field="url") from None
    unknown = sorted(set(data.get("types") or []) - set(types.TYPES))
    if unknown:
        raise DomainError("unknown_event_type", f"Unknown event type(s): {', '.join(unknown)}; choose from "
                          f"{', '.join(sorted(types.TYPES))}.", field="types")
    if "types" in data:
        data = {**data, "types": sorted(set(data["types"] or []))}
    if secret:
        if len(secret) < MIN_SECRET_LEN:
            raise DomainError("secret_too_short", f"The signing secret needs at least {MIN_SECRET_LEN} characters.",
                              field="secret")
        data = {**data, "secret_encrypted": crypto.encrypt(secret)}
    elif not subscription.secret_encrypted:
        raise DomainError("secret_required", "A signing secret is required (receivers verify the signature with it).",
                          field="secret")
    return audited_save(principal=principal, obj=subscription, data=data)


def subscriptions_stop_for(org: Any, actors: set[str], principal: Any) -> int:
    """Disable the org's subscriptions made by a member who left (apps.core.lifecycle)."""
    stopped = 0
    for subscription in Subscription.objects.filter(org=org, created_by__in=actors, enabled=True):
        audited_save(principal=principal, obj=subscription, data={"enabled": False})
        stopped += 1
    return stopped


def subscription_delete(*, principal: Any, subscription: Subscription) -> None:
    audited_delete(principal=principal, obj=subscription)


def subscription_send_test(*, principal: Any, subscription: Subscription) -> Event | None:
    """The "send test event" button: one `test` event delivered to this subscription only."""
    quotas.check_rate(subscription.org, "test_sends_per_hour")
    return event_emit("test", org=subscription.org, obj=subscription, only=subscription,
                      data={"sent_by": principal.actor})


# --- delivery -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    status: str  # delivered | retry | failed | not_due | deferred
    detail: str = ""
    retry_in_s: float = 0.0


def event_document(event: Event) -> dict[str, Any]:
    return {"id": event.pk, "type": event.type, "at": event.at.isoformat(),
            "org": event.org.slug if event.org_id else None, "object_type": event.object_type,
            "object_id": event.object_id, "object_repr": event.object_repr, "data": event.data}


@contextmanager
def _log_write() -> Iterator[None]:
    """A write to the delivery log that does not wait for the WAL flush (PostgreSQL `synchronous_commit=off`,
    this transaction only). A crash of PostgreSQL itself can lose the last fraction of a second of such
    writes — never corrupt them — and the worst that does is one more send of a delivery (receivers dedupe by
    X-Spillway-Delivery), which webhooks are anyway (at least once). Two flushes per delivery were most of
    its time under load (bench-events)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield


def _claim(delivery_id: int, now) -> str:
    """Claim a due delivery for this attempt: "claimed", "not_due", or "deferred" (its org is at its limit)."""
    limit = int(_setting("EVENTS_ORG_CONCURRENCY", 2))
    with _log_write():
        row = Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING, next_attempt_at__lte=now
                                      ).values_list("subscription__org_id", flat=True).first()
        if row is None:
            return "not_due"
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # count and claim as one step per org
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_ORG_LOCK_NS, row])
        sending = Delivery.objects.filter(subscription__org_id=row, status=Delivery.Status.SENDING,
                                          claimed_at__gte=now - timedelta(seconds=STALE_CLAIM_S)).count()
        pending = Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING, next_attempt_at__lte=now)
        if sending >= limit:
            pending.update(next_attempt_at=now + timedelta(seconds=DEFER_S))
            return "deferred"
        claimed = pending.update(status=Delivery.Status.SENDING, claimed_at=now, attempts=F("attempts") + 1)
    return "claimed" if claimed else "not_due"


def delivery_attempt(delivery_id: int) -> Attempt:
    """One attempt of one delivery; safe to call twice at once (the claim lets one through)."""
    now = timezone.now()
    claim = _claim(delivery_id, now)
    if claim == "deferred":
        return Attempt("deferred", retry_in_s=DEFER_S)
    if claim != "claimed":
        return Attempt("not_due")
    with _log_write():
        delivery = Delivery.objects.select_related("subscription__org", "event__org").get(pk=delivery_id)
    sub, event = delivery.subscription, delivery.event
    code, error, elapsed_ms, final = None, "", None, False
    try:
        reply = webhooks.deliver(
            sub.url, secret=crypto.decrypt(sub.secret_encrypted), event=event.type,
            payload=types.body(sub.format, event_document(event)), delivery_id=str(delivery.pk),
            timeout_s=_setting("EVENTS_TIMEOUT_S", 5.0), policy=webhooks.org_policy(sub.org))
        code, elapsed_ms = reply.status, reply.elapsed_ms
        if not 200 <= reply.status < 300:
            error = f"HTTP {reply.status}: {reply.body[:200].decode(errors='replace')}"
    except webhooks.UnsafeUrl as exc:
        error, final = f"{exc.code}: {exc.message}", True
    except OSError as exc:  # refused, reset, or cut at the deadline (outbound.DeadlineExceeded)
        error = f"{type(exc).__name__}: {exc}"
    except (UnicodeError, ValueError) as exc:  # a URL saved before hosts were checked: it can never be sent
        error, final = f"invalid_url: {exc}", True
    done = timezone.now()
    row = Delivery.objects.filter(pk=delivery_id)
    if not error:
        with _log_write():
            row.update(status=Delivery.Status.DELIVERED, delivered_at=done, last_status_code=code, last_error="",
                       duration_ms=elapsed_ms)
        return Attempt("delivered")
    if final or delivery.attempts >= int(_setting("EVENTS_MAX_ATTEMPTS", 6)):
        with _log_write():
            row.update(status=Delivery.Status.FAILED, last_status_code=code, last_error=error[:500],
                       duration_ms=elapsed_ms)
        return Attempt("failed", error)
    wait_s = types.backoff_s(delivery.attempts, _setting("EVENTS_RETRY_BASE_S", 10.0))
    with _log_write():
        row.update(status=Delivery.Status.PENDING, last_status_code=code, last_error=error[:500],
                   duration_ms=elapsed_ms, next_attempt_at=done + timedelta(seconds=wait_s))
    return Attempt("retry", error, wait_s)


def deliveries_sweep() -> int:
    """Re-enqueue due deliveries whose message was lost, and free claims a dead worker left behind."""
    now = timezone.now()
    Delivery.objects.filter(status=Delivery.Status.SENDING,
                            claimed_at__lt=now - timedelta(seconds=STALE_CLAIM_S)).update(
        status=Delivery.Status.PENDING, next_attempt_at=now)
    due = list(Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=now - timedelta(seconds=5))
               .values_list("pk", flat=True)[:500])
    _enqueue(due)
    return len(due)
