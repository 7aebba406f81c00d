"""ACME accounts, managed certificates (what Spillway keeps valid) and the orders it placed for them.

The certificate itself (PEM, encrypted key, what listeners use) stays `fleets.Certificate`, so the
renderer, the listener tenancy checks and manual uploads need nothing new; a ManagedCertificate owns
one Certificate row and replaces its content on each renewal (same `certs/cert-<id>.pem` on the
nodes, so a renewal is a hot `set ssl cert`, never a reload).
"""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import TenantQuerySet


class AcmeAccount(models.Model):
    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="acme_accounts")
    directory_url = models.URLField(max_length=500)
    key_encrypted = models.TextField()  # Fernet, apps.core.crypto
    uri = models.URLField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "directory_url"], name="acme_account_unique")]

    def __str__(self) -> str:
        return f"{self.org_id}@{self.directory_url}"


class ManagedCertificate(models.Model):
    class Challenge(models.TextChoices):
        HTTP01 = "http-01"
        DNS01 = "dns-01"

    class Status(models.TextChoices):
        PENDING = "pending"  # never issued yet
        VALID = "valid"  # the last order succeeded and is deployed
        FAILED = "failed"  # the last order failed (the previous certificate, if any, still serves)

    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="managed_certificates")
    certificate = models.OneToOneField("fleets.Certificate", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="managed")
    name = models.SlugField(max_length=63)
    hostnames = models.JSONField(default=list)
    challenge = models.CharField(max_length=8, choices=Challenge.choices, default=Challenge.HTTP01)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_error_code = models.CharField(max_length=40, blank=True, default="")
    failures = models.PositiveIntegerField(default=0)  # consecutive; drives the backoff
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="managed_certificate_unique_name")]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AcmeOrder(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        VALID = "valid"
        FAILED = "failed"

    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="acme_orders")
    managed = models.ForeignKey(ManagedCertificate, on_delete=models.CASCADE, related_name="orders")
    hostnames = models.JSONField(default=list)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True, default="")
    error_code = models.CharField(max_length=40, blank=True, default="")
    serial = models.CharField(max_length=80, blank=True, default="")
    deployed = models.JSONField(default=dict)  # {"fleet/node": serial seen in a TLS handshake | error}
    started_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    # Where duration_s went, in seconds: {"queued_s": due -> claimed by a task, "order_s": order opened at the
    # CA, "publish_s": challenges published, "authorize_s": the CA validating, "finalize_s": CSR to chain,
    # "store_s", "roll_out_s": fleets rendered and pushed, "verify_s": until every node showed the serial}.
    steps = models.JSONField(default=dict, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"order {self.pk} {self.status}"
