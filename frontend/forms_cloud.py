"""Cloud forms: targets (operator) with their per-region networks and credential, and starting a run (plan)
of a cloud LB on a target — each a ServiceFormView over the API's serializer and service."""

from __future__ import annotations

import json
from typing import Any

from django.http import QueryDict
from django.urls import reverse

from apps.balancers.models import LoadBalancer
from apps.cloud import services as cloud_services
from apps.cloud.api.serializers import CloudApplySerializer, CloudTargetSerializer
from apps.cloud.models import CloudApply, CloudCredential, CloudTarget
from apps.core.service_forms import FormField, ServiceFormView
from apps.core.tenancy import Action

NETWORKS_EXAMPLE = '{"us-east": {"network": "default", "zone": "us-east1-b"}}'


def _credentials(view) -> list[tuple[str, str]]:
    return [(c.pk, f"{c.name} ({c.provider})") for c in view.scoped(CloudCredential).order_by("name")]


class CloudTargetFormView(ServiceFormView):
    """A cloud account the operator deploys LBs into (credentials by reference, never the secret itself)."""

    operator_only = True
    serializer_class = CloudTargetSerializer
    model = CloudTarget
    fields = (
        FormField("name", "Name", placeholder="gcp-prod"),
        FormField("provider", "Provider", "select", choices=lambda v: CloudTarget.Provider.choices),
        FormField("project_or_account", "Project or account", placeholder="my-project"),
        FormField("credentials_ref", "Credentials reference", placeholder="env:GOOGLE_CREDENTIALS",
                  help="Where the worker reads the credentials; the secret never enters Spillway."),
        FormField("credential", "Or a managed credential", "select", choices=_credentials, blank_choice="none",
                  nullable=True),
    )
    extra_error_fields = ("regions", "region_map", "networks")

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Edit cloud target" if self.kwargs.get("pk") else "New cloud target"

    def initial(self, obj):
        values = super().initial(obj)
        if obj is not None:
            values["regions_text"] = ", ".join(obj.regions)
            values["networks_text"] = json.dumps(obj.networks, indent=1, sort_keys=True) if obj.networks else ""
        return values

    def extra_data(self, post: QueryDict, errors) -> dict[str, Any]:
        data: dict[str, Any] = {"regions": [r.strip() for r in post.get("regions_text", "").split(",") if r.strip()]}
        text = post.get("networks_text", "").strip()
        if text:
            # A plan needs each region's network (GCP: VPC and zone; AWS: VPC, subnets, security groups);
            # the API takes the same object, so the form takes it as JSON rather than guess a provider's shape.
            try:
                data["networks"] = json.loads(text)
            except ValueError as exc:
                errors["networks"] = [f"Not JSON ({exc.msg} at line {exc.lineno}). Example: {NETWORKS_EXAMPLE}"]
        return data

    def extra_context(self) -> dict[str, Any]:
        return {"extra_template": "core/_cloud_regions.html", "networks_example": NETWORKS_EXAMPLE}

    def save(self, obj, data):
        return cloud_services.save_target(principal=self.principal, target=obj or CloudTarget(), data=data)

    def success_url(self, obj) -> str:
        return reverse("cloud")


def _targets(view) -> list[tuple[str, str]]:
    return [(t.pk, f"{t.name} ({t.provider}, {t.project_or_account})")
            for t in view.scoped(CloudTarget, Action.USE).order_by("name")]


def _cloud_lbs(view) -> list[tuple[str, str]]:
    lbs = view.scoped(LoadBalancer, Action.USE).exclude(kind=LoadBalancer.Kind.HAPROXY).order_by("name")
    return [(lb.pk, f"{lb.name} ({lb.kind})") for lb in lbs]


class CloudRunFormView(ServiceFormView):
    """Start a run: synthesize the LB for the target and plan it; a deployer approves the plan on the run's page."""

    serializer_class = CloudApplySerializer
    model = CloudApply
    title = "Plan a cloud load balancer"
    submit = "Synthesize and plan"
    intro = "The plan runs on a worker; nothing changes in the cloud until a deployer approves it on the run's page."
    fields = (
        FormField("lb", "Load balancer", "select", choices=_cloud_lbs),
        FormField("target", "Cloud target", "select", choices=_targets),
    )

    def initial(self, obj):
        return {k: self.request.GET[k] for k in ("lb", "target") if k in self.request.GET}

    def save(self, obj, data):
        return cloud_services.create_apply(principal=self.principal, target=data["target"], lb=data["lb"])

    def success_url(self, obj) -> str:
        return reverse("cloud-apply", args=[obj.pk])
