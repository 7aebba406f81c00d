"""Balancers API serializers: validate input at the edge, never write (services do)."""

from __future__ import annotations

import ipaddress

from rest_framework import serializers

from apps.accounts.models import Organization
from apps.balancers import services
from apps.balancers.models import (
    HostnameClaim,
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    RegionDistance,
    Route,
    StaticIP,
)
from apps.core import validators as v
from apps.core.api.fields import (
    HostnameField,
    PathField,
    RedirectUrlField,
    ScopedRelatedField,
    ScopedSlugRelatedField,
    SlugNameField,
    TenantModelSerializer,
    allowlisted,
)
from apps.core.api.serializers import StrictSerializer


class OrgOwnedSerializer(TenantModelSerializer):
    """`org` defaults to the caller's org; only operators may name another."""

    org = ScopedSlugRelatedField(Organization, required=False)

    def validate_org(self, org):
        principal = self.context["request"].principal
        if not principal.is_operator and org.pk != principal.org_id:
            raise serializers.ValidationError("You can only create objects for your own organization.")
        return org

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None and "org" not in attrs:
            attrs["org"] = self.context["request"].principal.org
        return attrs


class RegionSerializer(TenantModelSerializer):
    slug = SlugNameField()
    name = serializers.CharField(max_length=200)

    class Meta:
        model = Region
        fields = ["id", "slug", "name"]


class RegionDistanceSerializer(TenantModelSerializer):
    src = ScopedSlugRelatedField(Region)
    dst = ScopedSlugRelatedField(Region)
    rtt_ms = serializers.FloatField(min_value=0, max_value=10_000)

    class Meta:
        model = RegionDistance
        fields = ["id", "src", "dst", "rtt_ms"]

    def validate(self, attrs):
        src = attrs.get("src", getattr(self.instance, "src", None))
        dst = attrs.get("dst", getattr(self.instance, "dst", None))
        if src == dst:
            raise serializers.ValidationError({"dst": ["A region has no distance to itself."]}, code="same_region")
        return attrs


class LoadBalancerSerializer(OrgOwnedSerializer):
    name = SlugNameField()

    class Meta:
        model = LoadBalancer
        fields = ["id", "org", "name", "kind", "shared", "fleet", "cloud_target", "revision", "created_at",
                  "updated_at"]
        read_only_fields = ["revision", "created_at", "updated_at"]
        operator_only_fields = ("fleet", "shared")


class LbChildSerializer(TenantModelSerializer):
    """Objects hung on an LB: customers may hang them only on LBs they may use."""

    lb = ScopedRelatedField(LoadBalancer)


class ListenerSerializer(LbChildSerializer):
    name = SlugNameField()
    port = serializers.IntegerField(min_value=1, max_value=65535)
    static_ip = ScopedRelatedField(StaticIP, required=False, allow_null=True)
    default_pool = ScopedRelatedField(Pool, required=False, allow_null=True)
    no_route_status = serializers.ChoiceField(choices=v.NO_ROUTE_STATUSES, required=False)
    no_route_body = serializers.CharField(max_length=v.MAX_MESSAGE_LEN, trim_whitespace=False, required=False,
                                          validators=[allowlisted(v.validate_plain_message)])

    class Meta:
        model = Listener
        fields = ["id", "lb", "name", "protocol", "port", "static_ip", "default_pool", "certificate",
                  "no_route_status", "no_route_body", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        create_only_fields = ("lb",)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        principal = self.context["request"].principal
        lb = attrs.get("lb", getattr(self.instance, "lb", None))
        if not principal.is_operator and lb.org_id != principal.org_id:
            raise serializers.ValidationError({"lb": ["Only the load balancer's owner can change its listeners."]},
                                              code="not_lb_owner")
        pool = attrs.get("default_pool")
        if pool is not None and pool.lb_id != lb.pk:
            raise serializers.ValidationError({"default_pool": ["That pool belongs to another load balancer."]},
                                              code="pool_not_on_lb")
        protocol = attrs.get("protocol", getattr(self.instance, "protocol", Listener.Protocol.HTTP))
        cert = attrs["certificate"] if "certificate" in attrs else getattr(self.instance, "certificate", None)
        if protocol == Listener.Protocol.HTTPS and cert is None:
            raise serializers.ValidationError({"certificate": ["An https listener needs a certificate."]},
                                              code="certificate_required")
        if cert is not None and cert.org_id != lb.org_id:
            # The key would be served under the LB owner's name: only the owner's certificates qualify.
            raise serializers.ValidationError(
                {"certificate": [f'Invalid pk "{cert.pk}" - object does not exist.']}, code="does_not_exist")
        return attrs


class PoolRegionInlineSerializer(TenantModelSerializer):
    """A pool's capacity in one region, as nested in a pool (the pool is the one it is nested in)."""

    region = ScopedSlugRelatedField(Region)
    max_rate_per_member = serializers.FloatField(min_value=0.001, max_value=1_000_000, allow_null=True,
                                                 required=False)
    capacity_scaler = serializers.FloatField(min_value=0, max_value=1, required=False)
    traffic_dial = serializers.FloatField(
        min_value=0, max_value=1, required=False,
        help_text="Share of the traffic arriving in this region that it accepts (0..1; 1 = all). The rest is "
                  "served elsewhere as if the region were full, and the region runs at no more than this share "
                  "of its capacity.")

    class Meta:
        model = PoolRegion
        fields = ["id", "pool", "region", "max_rate_per_member", "capacity_scaler", "traffic_dial"]
        read_only_fields = ["pool"]

    def validate_capacity_scaler(self, value: float) -> float:
        # GCP semantics: 0 drains the region; otherwise 0.1..1.0.
        if value != 0 and not 0.1 <= value <= 1.0:
            raise serializers.ValidationError("capacity_scaler must be 0 or between 0.1 and 1.0.",
                                              code="invalid_capacity_scaler")
        return value


class PoolRegionSerializer(PoolRegionInlineSerializer):
    pool = ScopedRelatedField(Pool)

    class Meta(PoolRegionInlineSerializer.Meta):
        read_only_fields: list[str] = []
        create_only_fields = ("pool",)


class PoolSerializer(OrgOwnedSerializer):
    lb = ScopedRelatedField(LoadBalancer)
    name = SlugNameField()
    # Empty: no health check (the members count as up), for backends without an HTTP endpoint to probe.
    health_path = PathField(required=False, allow_blank=True)
    health_interval_s = serializers.IntegerField(min_value=1, max_value=3600, required=False)
    health_rise = serializers.IntegerField(min_value=1, max_value=100, required=False)
    health_fall = serializers.IntegerField(min_value=1, max_value=100, required=False)
    health_expected_status = serializers.IntegerField(min_value=100, max_value=599, required=False)
    # Capacity per region, created with the pool (services.pool_create); changed later through /pool-regions/.
    regions = PoolRegionInlineSerializer(many=True, required=False, max_length=100)
    preferred_regions = serializers.ListField(
        child=serializers.SlugField(max_length=63), max_length=20, required=False,
        help_text="Regions used first, most preferred first: another region (even the traffic's own) takes "
                  "traffic only when these are full or failed over.")
    failover_threshold = serializers.FloatField(
        min_value=0.01, max_value=0.99, allow_null=True, required=False,
        help_text="Healthy share of a region's members below which its traffic fails over to the nearest "
                  "healthy region (GCP: 0.7); null = off.")

    class Meta:
        model = Pool
        fields = ["id", "lb", "org", "name", "algorithm", "overflow_policy", "overload",
                  "preferred_regions", "failover_threshold", "auto_drain", "session_affinity",
                  "health_path", "health_interval_s",
                  "health_rise", "health_fall", "health_expected_status", "regions", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        create_only_fields = ("lb", "org")
        # Name uniqueness per tenant on the LB: the database's, answered 409 conflict (apps.core.api.errors).
        validators: list = []

    def to_internal_value(self, data):
        if self.instance is not None and isinstance(data, dict) and "regions" in data:
            current = PoolRegionInlineSerializer(self.instance.regions.all(), many=True, context=self.context).data
            if data["regions"] != current:
                raise serializers.ValidationError({"regions": [serializers.ErrorDetail(
                    "A pool's regions change through /pool-regions/ (create, update or delete one there).",
                    code="regions_via_pool_regions")]})
            data = {k: v for k, v in data.items() if k != "regions"}  # sent back as read: nothing to change
        return super().to_internal_value(data)

    def validate_preferred_regions(self, slugs: list[str]) -> list[str]:
        if len(set(slugs)) != len(slugs):
            raise serializers.ValidationError("Each region at most once.", code="duplicate_region")
        known = set(Region.objects.filter(slug__in=slugs).values_list("slug", flat=True))
        for slug in slugs:
            if slug not in known:
                raise serializers.ValidationError(f"Region {slug} does not exist.", code="unknown_region")
        return slugs

    def validate_regions(self, regions: list[dict]) -> list[dict]:
        slugs = [r["region"].slug for r in regions]
        duplicated = sorted({slug for slug in slugs if slugs.count(slug) > 1})
        if duplicated:
            raise serializers.ValidationError(f"Each region at most once; repeated: {', '.join(duplicated)}.",
                                              code="duplicate_region")
        return regions


class MemberSerializer(TenantModelSerializer):
    pool = ScopedRelatedField(Pool)
    region = ScopedSlugRelatedField(Region)
    name = SlugNameField()
    address = serializers.IPAddressField()
    port = serializers.IntegerField(min_value=1, max_value=65535)
    weight = serializers.IntegerField(min_value=0, max_value=256, required=False)

    class Meta:
        model = Member
        fields = ["id", "pool", "region", "name", "address", "port", "weight", "admin_state", "created_at",
                  "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        create_only_fields = ("pool",)

    def validate_address(self, value: str) -> str:
        return str(ipaddress.ip_address(value))

    def validate(self, attrs):
        attrs = super().validate(attrs)
        pool = attrs.get("pool", getattr(self.instance, "pool", None))
        address = attrs.get("address", getattr(self.instance, "address", None))
        if pool is not None and address is not None:
            services.member_address_check(principal=self.context["request"].principal, pool=pool, address=address)
        return attrs


class RevertRequestSerializer(StrictSerializer):
    change = serializers.IntegerField(help_text="The audit event id of the change to revert (from `changes`).")


class RevertedSerializer(serializers.Serializer):
    reverted = serializers.CharField(help_text="What was undone and what was kept, in words.")
    done = serializers.ListField(child=serializers.CharField())
    kept = serializers.ListField(child=serializers.CharField(), help_text="Drains and weights set since, left as "
                                 "they are.")


class LbChangeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    who = serializers.CharField()
    action = serializers.CharField()
    object = serializers.CharField(source="object_label")
    summary = serializers.CharField()
    revertible = serializers.BooleanField()


class MemberStateSerializer(StrictSerializer):
    admin_state = serializers.ChoiceField(choices=Member.AdminState.choices, required=False)
    weight = serializers.IntegerField(min_value=0, max_value=256, required=False)

    def validate(self, attrs):
        if not attrs:
            raise serializers.ValidationError("Give admin_state, weight or both.", code="empty")
        return attrs


class RouteTargetSerializer(StrictSerializer):
    pool = ScopedRelatedField(Pool)
    weight = serializers.IntegerField(min_value=0, max_value=256, default=100)


class RouteSerializer(OrgOwnedSerializer):
    lb = ScopedRelatedField(LoadBalancer)
    hosts = serializers.ListField(child=HostnameField(), max_length=50, required=False)
    path = PathField(required=False)
    # Omitted: a free one of this org's priorities, longer paths first (apps.balancers.routing).
    priority = serializers.IntegerField(min_value=1, max_value=50_000, required=False)
    redirect_url = RedirectUrlField(required=False, allow_blank=True)
    targets = RouteTargetSerializer(many=True, required=False)

    class Meta:
        model = Route
        fields = ["id", "lb", "org", "hosts", "path_match", "path", "priority", "redirect_url", "targets",
                  "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        create_only_fields = ("lb", "org")
        # Priority uniqueness (per org) is checked by the service under the LB lock (409 priority_taken).
        validators: list = []

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["targets"] = [{"pool": t.pool_id, "weight": t.weight} for t in instance.targets.all()]
        return data


class HostnameClaimSerializer(OrgOwnedSerializer):
    hostname = HostnameField()
    review_warnings = serializers.SerializerMethodField(
        help_text="Operators only (empty for anyone else): what to know before approving, e.g. the name sits inside "
                  "one another org holds.")

    class Meta:
        model = HostnameClaim
        fields = ["id", "org", "hostname", "status", "decided_at", "created_at", "review_warnings"]
        read_only_fields = ["status", "decided_at", "created_at"]
        # Uniqueness (per org, and one approved holder) is the service's call under its lock: 409 claim_overlap.
        validators: list = []

    def get_review_warnings(self, claim: HostnameClaim) -> list[str]:
        request = self.context.get("request")
        principal = getattr(request, "principal", None)
        if principal is None or not principal.is_operator:
            return []
        return services.hostname_claim_warnings(claim)


class IpPoolSerializer(TenantModelSerializer):
    name = SlugNameField()
    region = ScopedSlugRelatedField(Region, required=False, allow_null=True)
    free = serializers.SerializerMethodField()

    class Meta:
        model = IpPool
        fields = ["id", "name", "cidr", "region", "provider", "free", "created_at"]
        read_only_fields = ["created_at"]

    def validate_cidr(self, value: str) -> str:
        try:
            network = ipaddress.ip_network(value, strict=True)
        except ValueError as exc:
            raise serializers.ValidationError(f"Not a network in CIDR form: {exc}", code="invalid_cidr") from exc
        if network.num_addresses > 65536:
            raise serializers.ValidationError("IP pools are limited to 65,536 addresses.", code="invalid_cidr")
        return str(network)

    def get_free(self, pool: IpPool) -> int:
        network = ipaddress.ip_network(pool.cidr)
        usable = max(network.num_addresses - (2 if network.version == 4 and network.prefixlen < 31 else 0), 0)
        used = getattr(pool, "used_count", None)
        if used is None:
            used = pool.addresses.exclude(state=StaticIP.State.FREE).count()
        return usable - used


class StaticIPSerializer(TenantModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = StaticIP
        fields = ["id", "pool", "address", "org", "state", "allocated_at"]
        read_only_fields = fields


class StaticIPAllocateSerializer(StrictSerializer):
    pool = ScopedSlugRelatedField(IpPool, slug_field="name")
    address = serializers.IPAddressField(required=False)
    org = ScopedSlugRelatedField(Organization, required=False)
