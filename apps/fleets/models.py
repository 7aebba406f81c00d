"""HAProxy fleets, nodes and TLS certificates."""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import TenantQuerySet


class Fleet(models.Model):
    name = models.SlugField(max_length=63, unique=True)
    region = models.ForeignKey("balancers.Region", on_delete=models.PROTECT, related_name="fleets")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Certificate(models.Model):
    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="certificates")
    name = models.SlugField(max_length=63)
    cert_pem = models.TextField()
    key_encrypted = models.TextField()  # Fernet, see apps.core.crypto
    subject = models.CharField(max_length=500, blank=True)
    not_after = models.DateTimeField(null=True, blank=True)
    fingerprint_sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="certificate_unique_name")]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
