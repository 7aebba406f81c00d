"""The forms a person uses to manage the model, each a ServiceFormView over the API's serializer and service:
pools (with per-region capacity), capacity rows, members, listeners, and the operator's regions, distances
and IP pools."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from django.urls import reverse

from apps.balancers import services
from apps.balancers.api import serializers as s
from apps.balancers.models import (
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    RegionDistance,
    StaticIP,
)
from apps.core.service_forms import FormField, ServiceFormView
from apps.fleets.models import Certificate


def _regions(view) -> list[tuple[str, str]]:
    return [(r.slug, f"{r.slug} — {r.name}") for r in Region.objects.order_by("slug")]


def _lb_url(lb_id: int, anchor: str = "") -> str:
    return reverse("lb-detail", args=[lb_id]) + (f"#{anchor}" if anchor else "")


POOL_FIELDS = (
    FormField("name", "Name", placeholder="web", help="Lowercase letters, digits and dashes."),
    FormField("algorithm", "Balancing", "select", choices=lambda v: Pool.Algorithm.choices),
    FormField("overflow_policy", "When a region is full", "select", choices=lambda v: Pool.OverflowPolicy.choices),
    FormField("overload", "When every region is full", "select", choices=lambda v: Pool.Overload.choices),
    FormField("session_affinity", "Sticky sessions", "select", choices=lambda v: Pool.SessionAffinity.choices,
              help="cookie: a session stays on its member, and in the region it landed in while that region has room."),
    FormField("health_path", "Health check path", placeholder="/healthz"),
    FormField("health_interval_s", "Check every (s)", "number"),
    FormField("health_expected_status", "Expected status", "number", placeholder="200"),
)


class PoolCreateView(ServiceFormView):
    """A customer's (or the operator's) new pool on an LB it may use, with its capacity per region."""

    serializer_class = s.PoolSerializer
    fields = POOL_FIELDS
    submit = "Create pool"
    extra_error_fields = ("regions",)

    @property
    def lb(self) -> LoadBalancer:
        if not hasattr(self, "_lb"):
            self._lb = self.get_scoped(LoadBalancer, pk=self.kwargs["lb"])
        return self._lb

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"New pool on {self.lb.name}"

    def fixed_data(self) -> dict[str, Any]:
        return {"lb": self.lb.pk}

    def extra_data(self, post: QueryDict, errors: dict[str, list[str]]) -> dict[str, Any]:
        rows = []
        for region in Region.objects.order_by("slug"):
            if f"region_{region.slug}" not in post:
                continue
            row: dict[str, Any] = {"region": region.slug}
            rate, scaler = post.get(f"rate_{region.slug}", "").strip(), post.get(f"scaler_{region.slug}", "").strip()
            if rate:
                row["max_rate_per_member"] = rate
            if scaler:
                row["capacity_scaler"] = scaler
            rows.append(row)
        return {"regions": rows}

    def extra_context(self) -> dict[str, Any]:
        return {"extra_template": "core/_pool_regions.html", "regions": Region.objects.order_by("slug"),
                "back_url": _lb_url(self.lb.pk, "pools-card"), "back_label": self.lb.name}

    def save(self, obj, data):
        return services.pool_create(principal=self.principal, data=data)

    def success_url(self, obj) -> str:
        return _lb_url(obj.lb_id, f"pool-{obj.pk}")


class PoolEditView(ServiceFormView):
    serializer_class = s.PoolSerializer
    model = Pool
    fields = POOL_FIELDS
    title = "Edit pool"

    def save(self, obj, data):
        return services.object_save(principal=self.principal, obj=obj, action="update", data=data)

    def success_url(self, obj) -> str:
        return _lb_url(obj.lb_id, f"pool-{obj.pk}")


CAPACITY_FIELDS = (
    FormField("max_rate_per_member", "Max rate per member (req/s)", "number", step="any", nullable=True,
              help="Blank: no limit."),
    FormField("capacity_scaler", "Capacity scaler", "number", step="0.05",
              help="1 = full capacity, 0.1 to 1 scales it, 0 drains the region."),
)


class PoolRegionCreateView(ServiceFormView):
    serializer_class = s.PoolRegionSerializer
    fields = (FormField("region", "Region", "select", choices=_regions), *CAPACITY_FIELDS)
    submit = "Add region"

    @property
    def pool(self) -> Pool:
        if not hasattr(self, "_pool"):
            self._pool = self.get_changeable(Pool, pk=self.kwargs["pool"])
        return self._pool

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"Capacity of pool {self.pool.name} in a new region"

    def fixed_data(self):
        return {"pool": self.pool.pk}

    def save(self, obj, data):
        return services.object_save(principal=self.principal, obj=PoolRegion(), action="create", data=data)

    def success_url(self, obj) -> str:
        return _lb_url(obj.pool.lb_id, f"pool-{obj.pool_id}")


class PoolRegionEditView(PoolRegionCreateView):
    model = PoolRegion
    fields = CAPACITY_FIELDS
    submit = "Save capacity"

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Capacity in a region"

    def save(self, obj, data):
        return services.object_save(principal=self.principal, obj=obj, action="update", data=data)


MEMBER_FIELDS = (
    FormField("name", "Name", placeholder="web-1"),
    FormField("region", "Region", "select", choices=_regions),
    FormField("address", "Address", placeholder="10.0.0.5"),
    FormField("port", "Port", "number", placeholder="8080"),
    FormField("weight", "Weight", "number", placeholder="100", help="0 to 256; 0 takes no new traffic."),
)


class MemberCreateView(PoolRegionCreateView):
    serializer_class = s.MemberSerializer
    fields = MEMBER_FIELDS
    submit = "Add member"

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"New member of pool {self.pool.name}"

    def save(self, obj, data):
        return services.member_create(principal=self.principal, data=data)


class MemberEditView(ServiceFormView):
    serializer_class = s.MemberSerializer
    model = Member
    fields = MEMBER_FIELDS
    title = "Edit member"

    def save(self, obj, data):
        return services.object_save(principal=self.principal, obj=obj, action="update", data=data)

    def success_url(self, obj) -> str:
        return _lb_url(obj.pool.lb_id, f"pool-{obj.pool_id}")


def _listener_fields() -> tuple[FormField, ...]:
    def pools(view):
        return [(p.pk, p.name) for p in view.scoped(Pool, "use").filter(lb_id=view.lb_id()).order_by("name")]

    def certificates(view):
        lb_org = LoadBalancer.objects.filter(pk=view.lb_id()).values_list("org_id", flat=True).first()
        return [(c.pk, f"{c.name} (expires {c.not_after:%Y-%m-%d})" if c.not_after else c.name)
                for c in view.scoped(Certificate, "use").filter(org_id=lb_org).order_by("name")]

    def static_ips(view):
        lb_org = LoadBalancer.objects.filter(pk=view.lb_id()).values_list("org_id", flat=True).first()
        return [(ip.pk, ip.address) for ip in view.scoped(StaticIP, "use").filter(org_id=lb_org)
                .exclude(state=StaticIP.State.FREE).order_by("address")]

    return (
        FormField("name", "Name", placeholder="https"),
        FormField("protocol", "Protocol", "select", choices=lambda v: Listener.Protocol.choices),
        FormField("port", "Port", "number", placeholder="443"),
        FormField("default_pool", "Default pool", "select", choices=pools, blank_choice="none", nullable=True),
        FormField("certificate", "Certificate", "select", choices=certificates, blank_choice="none", nullable=True,
                  help="For https: a certificate of the LB's organization."),
        FormField("static_ip", "Static IP", "select", choices=static_ips, blank_choice="none", nullable=True,
                  help="Reserve one under Static IPs first."),
    )


class ListenerCreateView(ServiceFormView):
    serializer_class = s.ListenerSerializer
    fields = _listener_fields()
    submit = "Add listener"

    def lb_id(self) -> int:
        return self.lb.pk

    @property
    def lb(self) -> LoadBalancer:
        if not hasattr(self, "_lb"):
            self._lb = self.get_changeable(LoadBalancer, pk=self.kwargs["lb"])
        return self._lb

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"New listener on {self.lb.name}"

    def fixed_data(self):
        return {"lb": self.lb.pk}

    def save(self, obj, data):
        return services.listener_save(principal=self.principal, listener=Listener(), data=data)

    def success_url(self, obj) -> str:
        return _lb_url(obj.lb_id, "listeners")


class ListenerEditView(ServiceFormView):
    serializer_class = s.ListenerSerializer
    model = Listener
    fields = _listener_fields()
    title = "Edit listener"

    def lb_id(self) -> int:
        return self.get_object().lb_id

    def save(self, obj, data):
        return services.listener_save(principal=self.principal, listener=obj, data=data)

    def success_url(self, obj) -> str:
        return _lb_url(obj.lb_id, "listeners")


class _OperatorForm(ServiceFormView):
    operator_only = True

    def save(self, obj, data):
        target = obj if obj is not None else self.serializer_class.Meta.model()
        return services.object_save(principal=self.principal, obj=target,
                                    action="update" if obj is not None else "create", data=data)

    def success_url(self, obj) -> str:
        return reverse("infrastructure")


class RegionFormView(_OperatorForm):
    serializer_class = s.RegionSerializer
    model = Region
    fields = (FormField("slug", "Slug", placeholder="us-east"), FormField("name", "Name", placeholder="US East"))
    title = "Region"


class RegionDistanceFormView(_OperatorForm):
    serializer_class = s.RegionDistanceSerializer
    model = RegionDistance
    fields = (FormField("src", "From", "select", choices=_regions),
              FormField("dst", "To", "select", choices=_regions),
              FormField("rtt_ms", "Round trip (ms)", "number", step="any"))
    title = "Distance between regions"


class IpPoolFormView(_OperatorForm):
    serializer_class = s.IpPoolSerializer
    model = IpPool
    fields = (FormField("name", "Name", placeholder="edge-v4"), FormField("cidr", "CIDR", placeholder="192.0.2.0/28"),
              FormField("region", "Region", "select", choices=_regions, blank_choice="any", nullable=True),
              FormField("provider", "Provider", placeholder="haproxy"))
    title = "IP pool"
