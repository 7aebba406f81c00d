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
    # Per region: {"network": vpc, "zone": gcp zone, "subnet_ids": [...], "security_group_ids": [...]}; the
    # balancer model has no such thing, the target does.
    networks = models.JSONField(default=dict, blank=True)
    # Per listener name: GCP ssl certificate self link or AWS ACM ARN for https listeners.
    certificate_refs = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class CloudApply(models.Model):
    """One synthesize -> plan -> (approve) -> apply run of one cloud load balancer on one target."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SYNTHESIZED = "synthesized"
        PLANNING = "planning"
        PLANNED = "planned"  # plan found no change
        AWAITING_APPROVAL = "awaiting_approval"  # plan found changes; apply waits for a deployer
        APPLYING = "applying"
        APPLIED = "applied"
        FAILED = "failed"

    TENANT_PATH = "target__org"

    target = models.ForeignKey(CloudTarget, on_delete=models.CASCADE, related_name="applies")
    lb = models.ForeignKey("balancers.LoadBalancer", on_delete=models.CASCADE, related_name="cloud_applies")
    lb_revision = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.PENDING)
    drift_check = models.BooleanField(default=False)  # started by the periodic plan, not by a user
    synth_json = models.JSONField(null=True, blank=True)
    plan_output = models.TextField(blank=True, default="")
    diff = models.TextField(blank=True, default="")
    apply_output = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=64, blank=True, default="")
    approved_by = models.CharField(max_length=64, blank=True, default="")
    approved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.lb_id}@{self.target_id}#{self.pk}"
