"""Cloud targets: where a gcp/aws load balancer is applied."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.tenancy import RestrictedQuerySet, TenantQuerySet


class CloudCredentialQuerySet(RestrictedQuerySet):
    def visible_to(self, principal):
        if principal.is_operator:
            return self
        return self.filter(Q(for_all_orgs=True) | Q(orgs=principal.org_id)).distinct()

    def writable_by(self, principal):
        return self if principal.is_operator else self.none()


class CloudCredential(models.Model):
    """Operator-managed credentials (by reference) and state backend a cloud target may use.

    Tenants pick one of the credentials an operator made available to them; nothing a tenant types is
    ever read from the worker's environment or disk, and no tenant chooses where state is written.
    """

    name = models.SlugField(max_length=63, unique=True)
    provider = models.CharField(max_length=8, choices=[("gcp", "gcp"), ("aws", "aws")])
    # The name of an environment variable of the worker or an absolute file path on it: never the secret.
    credentials_ref = models.CharField(max_length=256)
    state_backend = models.JSONField(default=dict, blank=True)
    orgs = models.ManyToManyField("accounts.Organization", blank=True, related_name="cloud_credentials")
    for_all_orgs = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    # What the audit log keeps (apps.audit.services.audit_snapshot): never the reference itself.
    audit_fields = ("name", "provider", "for_all_orgs", "state_backend")

    objects = CloudCredentialQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def audit_extra(self) -> dict:
        return {"orgs": sorted(self.orgs.values_list("slug", flat=True)) if self.pk else []}


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
    # Spillway region slug -> provider region ({"us-east": "us-east1"}); complete for `regions` (apps.cloud.regions).
    region_map = models.JSONField(default=dict, blank=True)
    # Operator-managed credentials and state backend (tenants choose among those offered to them).
    credential = models.ForeignKey(CloudCredential, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="targets")
    # Set by operators only (the API refuses them from anyone else): a reference (env var name or file
    # path) to credentials, never the secret itself, and a state backend. `credential` wins over both.
    credentials_ref = models.CharField(max_length=256, blank=True)
    state_backend = models.JSONField(default=dict, blank=True)
    # Per region: {"network": vpc, "zone": gcp zone, "subnet_ids": [...], "security_group_ids": [...]}; the
    # balancer model has no such thing, the target does.
    networks = models.JSONField(default=dict, blank=True)
    # Per listener name: GCP ssl certificate self link or AWS ACM ARN for https listeners.
    certificate_refs = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # The audit log keeps everything but the credentials reference (apps.audit.services.audit_snapshot).
    audit_exclude = ("credentials_ref",)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def audit_extra(self) -> dict:
        return {"has_credentials": bool(self.effective_credentials_ref)}

    @property
    def effective_credentials_ref(self) -> str:
        return self.credential.credentials_ref if self.credential_id else self.credentials_ref

    @property
    def effective_state_backend(self) -> dict:
        return self.credential.state_backend if self.credential_id else self.state_backend


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
