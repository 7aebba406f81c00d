"""Cross-cutting tables: idempotency records for POST requests."""

from __future__ import annotations

from django.db import models


class IdempotencyRecord(models.Model):
    # scope = who asked ("token:7" / "user:3") so two clients never share keys.
    scope = models.CharField(max_length=64)
    key = models.CharField(max_length=128)
    method_path = models.CharField(max_length=300)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveIntegerField(null=True)
    body = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_unique_key")]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"
