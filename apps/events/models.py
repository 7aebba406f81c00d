"""Events (what happened to an org's objects) and subscriptions that receive them as signed webhooks.

An event belongs to the org that owns its object; events with no org (fleet and node machinery)
are the operator's. A Delivery is one (subscription, event) pair, unique, so an event reaches a
subscription once however often delivery is retried or swept.
"""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import TenantQuerySet


class Event(models.Model):
    TENANT_PATH = "org"

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    org = models.ForeignKey("accounts.Organization", null=True, blank=True, on_delete=models.CASCADE,
                            related_name="+")
    type = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["org", "-at"])]

    def __str__(self) -> str:
        return f"{self.type} {self.object_type}:{self.object_id}"


class Subscription(models.Model):
    TENANT_PATH = "org"

    class Format(models.TextChoices):
        GENERIC = "generic"
        SLACK = "slack"

    org = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    url = models.CharField(max_length=2048)
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.GENERIC)
    types = models.JSONField(default=list, blank=True)  # event type names; empty = every type
    secret_encrypted = models.TextField(blank=True)  # Fernet, see apps.core.crypto
    enabled = models.BooleanField(default=True)
    # Whose authority it sends on (`user:<id>` / `token:<id>`): disabled when they leave the org
    # (apps.core.lifecycle); whoever enables it again takes it over.
    created_by = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    # What the audit log keeps (apps.audit.services.audit_snapshot): whether a secret is set, not the secret.
    audit_fields = ("name", "url", "format", "types", "enabled", "created_by")

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["org_id", "name"]
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="event_subscription_name_unique")]

    def __str__(self) -> str:
        return self.name

    def audit_extra(self) -> dict:
        return {"secret_set": bool(self.secret_encrypted)}

    def wants(self, event_type: str) -> bool:
        return event_type == "test" or not self.types or event_type in self.types


class Delivery(models.Model):
    TENANT_PATH = "subscription__org"

    class Status(models.TextChoices):
        PENDING = "pending"      # waiting for its (next) attempt
        SENDING = "sending"      # claimed by a worker
        DELIVERED = "delivered"  # the receiver answered 2xx
        FAILED = "failed"        # gave up after the last attempt, or the URL is refused

    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["subscription", "event"], name="event_delivery_once")]

    def __str__(self) -> str:
        return f"delivery of event {self.event_id} to subscription {self.subscription_id}"
