"""Cloud targets: where a gcp/aws load balancer is applied."""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import TenantQuerySet


class CloudTarget(models.Model):
    class Provider(models.TextChoices):
        GCP = "gcp"
        AWS = "aws"

    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="cloud_targets")
    name = models.SlugField(max_length=63, unique=True)
    provider = models.CharField(max_length=8, choices=Provider.choices)
    project_or_account = models.CharField(max_length=128)
    regions = models.JSONField(default=list)
    # A *reference* (env var name or file path) to credentials, never the secret itself.
    credentials_ref = models.CharField(max_length=256, blank=True)
    state_backend = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
