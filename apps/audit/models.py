"""Append-only audit log: rows are inserted, never updated or deleted through the app."""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import RestrictedQuerySet


class AuditEventQuerySet(RestrictedQuerySet):
    def visible_to(self, principal) -> AuditEventQuerySet:
        if principal.is_operator:
            return self
        return self.filter(org_id=principal.org_id)

    def writable_by(self, principal) -> AuditEventQuerySet:
        return self.none()  # append-only


class AuditEvent(models.Model):
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=64)  # "user:3", "token:7", "system"
    # The actor in words at the time of the write ("alice (acme)", "token ci-deploy (acme)"): a user renamed
    # or a token deleted later does not rewrite history, and reading the log needs no joins.
    actor_label = models.CharField(max_length=200, blank=True, default="")
    org = models.ForeignKey("accounts.Organization", null=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=64, db_index=True)  # "route.create"
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["org", "-at"])]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type}:{self.object_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise RuntimeError("AuditEvent is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise RuntimeError("AuditEvent is append-only")

    @property
    def who(self) -> str:
        return self.actor_label or self.actor

    @property
    def object_label(self) -> str:
        """ "rollout 5", not "rollout rollout 5": the type only when the object's own text does not start with it."""
        text = self.object_repr or self.object_id
        kind = self.object_type
        if not kind or text.lower().startswith(kind.lower()):
            return text
        return f"{kind} {text}".strip()
