"""Regions, load balancers, listeners, pools, members, routes, hostname claims, IPs."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.tenancy import SharedInfraQuerySet, TenantQuerySet
from apps.core.validators import MAX_MESSAGE_LEN, NO_ROUTE_STATUSES


class Region(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)

    objects = SharedInfraQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class RegionDistance(models.Model):
    """Round-trip time between regions; overflow goes to the nearest region first."""

    src = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="distances_from")
    dst = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="distances_to")
    rtt_ms = models.FloatField()

    objects = SharedInfraQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["src", "dst"], name="region_distance_unique"),
            models.CheckConstraint(condition=~Q(src=models.F("dst")), name="region_distance_distinct"),
            models.CheckConstraint(condition=Q(rtt_ms__gte=0), name="region_distance_rtt_nonneg"),
        ]
        ordering = ["src__slug", "rtt_ms"]

    def __str__(self) -> str:
        return f"{self.src}->{self.dst} {self.rtt_ms}ms"


class LoadBalancerQuerySet(TenantQuerySet):
    def visible_to(self, principal):
        if principal.is_operator:
            return self
        # Customers see their own LBs and the shared ones they can put routes and pools on.
        return self.filter(Q(org_id=principal.org_id) | Q(shared=True))

    def writable_by(self, principal):
        # A shared LB is the operator's: a customer changes only the LBs it owns.
        return self if principal.is_operator else self.own(principal)


class LoadBalancer(models.Model):
    class Kind(models.TextChoices):
        HAPROXY = "haproxy"
        GCP = "gcp"
        AWS = "aws"

    TENANT_PATH = "org"
    QUOTA = "load_balancers"  # apps.core.quotas, checked by balancers.services.object_save on create

    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="load_balancers")
    name = models.SlugField(max_length=63, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.HAPROXY)
    shared = models.BooleanField(default=False)
    fleet = models.ForeignKey("fleets.Fleet", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="load_balancers")
    cloud_target = models.ForeignKey("cloud.CloudTarget", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="load_balancers")
    # Bumped by every change to what the LB must serve; nodes report the revision they applied.
    revision = models.PositiveBigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = LoadBalancerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        """An update never writes `revision`: only services.lb_touch moves it, in the database, and an instance read
        before a bump would set it back (a config-code apply saves the LB it read without a lock). Its readers count
        on it only growing: the fleets' route lane, and a route write keeping the routes it read before the LB's
        lock when the revision has not moved (route_rules.early_peers)."""
        if not self._state.adding and not kwargs.get("force_insert") and kwargs.get("update_fields") is None:
            deferred = self.get_deferred_fields()  # as Django leaves them out of a save, not read to be written
            kwargs["update_fields"] = [f.attname for f in self._meta.concrete_fields
                                       if not f.primary_key and f.name != "revision" and f.attname not in deferred]
        super().save(*args, **kwargs)


class IpPool(models.Model):
    name = models.SlugField(max_length=63, unique=True)
    cidr = models.CharField(max_length=64)
    region = models.ForeignKey(Region, null=True, blank=True, on_delete=models.PROTECT)
    provider = models.CharField(max_length=16, default="haproxy")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SharedInfraQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class StaticIP(models.Model):
    class State(models.TextChoices):
        FREE = "free"
        RESERVED = "reserved"
        ASSIGNED = "assigned"

    TENANT_PATH = "org"

    pool = models.ForeignKey(IpPool, on_delete=models.PROTECT, related_name="addresses")
    address = models.GenericIPAddressField(unique=True)
    org = models.ForeignKey("accounts.Organization", null=True, blank=True, on_delete=models.PROTECT,
                            related_name="static_ips")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RESERVED)
    allocated_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["pool__name", "address"]

    def __str__(self) -> str:
        return self.address


class Listener(models.Model):
    class Protocol(models.TextChoices):
        HTTP = "http"
        HTTPS = "https"
        TCP = "tcp"

    TENANT_PATH = "lb__org"

    lb = models.ForeignKey(LoadBalancer, on_delete=models.CASCADE, related_name="listeners")
    name = models.SlugField(max_length=63)
    protocol = models.CharField(max_length=8, choices=Protocol.choices, default=Protocol.HTTP)
    port = models.PositiveIntegerField()
    static_ip = models.ForeignKey(StaticIP, null=True, blank=True, on_delete=models.PROTECT, related_name="listeners")
    default_pool = models.ForeignKey("Pool", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    certificate = models.ForeignKey("fleets.Certificate", null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="listeners")
    # The answer to a request no route matches when there is no default pool (HTTP listeners).
    no_route_status = models.PositiveSmallIntegerField(
        default=404, choices=[(n, str(n)) for n in NO_ROUTE_STATUSES])
    no_route_body = models.CharField(max_length=MAX_MESSAGE_LEN, default="No route for this host and path.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lb", "name"], name="listener_unique_name"),
            models.UniqueConstraint(fields=["lb", "port"], name="listener_unique_port"),
        ]
        ordering = ["lb__name", "port"]

    def __str__(self) -> str:
        return f"{self.lb.name}/{self.name}"


class Pool(models.Model):
    class Algorithm(models.TextChoices):
        ROUNDROBIN = "roundrobin"
        LEASTCONN = "leastconn"
        SOURCE = "source"

    class OverflowPolicy(models.TextChoices):  # semantics: apps/traffic/overflow.py
        WATERFALL = "waterfall"
        ISOLATION = "isolation"
        SPRAY_TO_REGION = "spray_to_region"
        SPRAY_TO_WORLD = "spray_to_world"

    TENANT_PATH = "org"

    lb = models.ForeignKey(LoadBalancer, on_delete=models.CASCADE, related_name="pools")
    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="pools")
    name = models.SlugField(max_length=63)
    algorithm = models.CharField(max_length=16, choices=Algorithm.choices, default=Algorithm.ROUNDROBIN)
    overflow_policy = models.CharField(max_length=16, choices=OverflowPolicy.choices,
                                       default=OverflowPolicy.WATERFALL)

    class Overload(models.TextChoices):
        ABSORB = "absorb"  # every region at capacity: spread the excess over regions by capacity
        SHED = "shed"  # every region at capacity: answer 503 with Retry-After

    overload = models.CharField(max_length=8, choices=Overload.choices, default=Overload.ABSORB)

    class SessionAffinity(models.TextChoices):
        NONE = "none", "Off"
        # A cookie per pool naming the member: the session stays on its member, and in the region it landed in
        # (overflowed or not) while that region has room; never on a drained member (fleets.render.chain).
        COOKIE = "cookie", "Cookie"

    session_affinity = models.CharField(max_length=8, choices=SessionAffinity.choices,
                                        default=SessionAffinity.NONE)
    # Steering (apps/traffic/overflow.py, "Steering"; decisions with hysteresis: apps/traffic/steering.py).
    preferred_regions = models.JSONField(default=list, blank=True)  # region slugs, most preferred first
    failover_threshold = models.FloatField(null=True, blank=True)  # healthy share 0.01..0.99; None = off
    auto_drain = models.BooleanField(default=False)  # drain a region under 25% healthy (at most half of them)
    health_path = models.CharField(max_length=1024, blank=True, default="/")
    health_interval_s = models.PositiveIntegerField(default=2)
    health_rise = models.PositiveIntegerField(default=2)
    health_fall = models.PositiveIntegerField(default=3)
    health_expected_status = models.PositiveIntegerField(default=200)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        # Unique per tenant on the LB: on a shared LB one tenant's pool names neither collide with nor reveal another's
        # (nodes name backends by id).
        constraints = [models.UniqueConstraint(fields=["lb", "org", "name"], name="pool_unique_org_name")]
        ordering = ["lb__name", "name"]

    def __str__(self) -> str:
        return f"{self.lb.name}/{self.name}"


class PoolRegion(models.Model):
    """Per-region capacity: healthy members x max_rate_per_member x capacity_scaler."""

    TENANT_PATH = "pool__org"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="regions")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    max_rate_per_member = models.FloatField(null=True, blank=True)  # None = unlimited
    capacity_scaler = models.FloatField(default=1.0)
    traffic_dial = models.FloatField(default=1.0)  # share of the region's own traffic it accepts (0..1)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "region"], name="pool_region_unique"),
            models.CheckConstraint(condition=Q(traffic_dial__gte=0, traffic_dial__lte=1),
                                   name="pool_region_dial_range"),
            models.CheckConstraint(
                condition=Q(capacity_scaler=0) | Q(capacity_scaler__gte=0.1, capacity_scaler__lte=1.0),
                name="pool_region_scaler_range",
            ),
        ]
        ordering = ["pool_id", "region__slug"]

    def __str__(self) -> str:
        return f"{self.pool}@{self.region}"


class Member(models.Model):
    class AdminState(models.TextChoices):
        ACTIVE = "active"
        DRAIN = "drain"
        MAINT = "maint"

    TENANT_PATH = "pool__org"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="members")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    name = models.SlugField(max_length=63)
    address = models.GenericIPAddressField()
    port = models.PositiveIntegerField()
    weight = models.PositiveIntegerField(default=100)
    admin_state = models.CharField(max_length=8, choices=AdminState.choices, default=AdminState.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="member_unique_name"),
            models.UniqueConstraint(fields=["pool", "address", "port"], name="member_unique_endpoint"),
            models.CheckConstraint(condition=Q(weight__lte=256), name="member_weight_range"),
        ]
        ordering = ["pool_id", "region__slug", "name"]

    def __str__(self) -> str:
        return f"{self.pool}/{self.name}"


class Route(models.Model):
    class PathMatch(models.TextChoices):
        PREFIX = "prefix"
        EXACT = "exact"

    TENANT_PATH = "org"

    lb = models.ForeignKey(LoadBalancer, on_delete=models.CASCADE, related_name="routes")
    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="routes")
    hosts = models.JSONField(default=list)
    path_match = models.CharField(max_length=8, choices=PathMatch.choices, default=PathMatch.PREFIX)
    path = models.CharField(max_length=1024, default="/")
    priority = models.PositiveIntegerField()
    redirect_url = models.CharField(max_length=2048, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        # Priorities order one organization's routes only (apps.balancers.routing): unique per tenant.
        constraints = [models.UniqueConstraint(fields=["lb", "org", "priority"], name="route_unique_org_priority")]
        # What every route write checks (route_rules.check_route / _check_reachable): the routes on the same
        # path, and the any-host routes. At 100k routes each was a scan of the table (28 and 46 ms a write).
        indexes = [
            models.Index(fields=["lb", "path"], name="route_lb_path"),
            models.Index(fields=["lb"], condition=models.Q(hosts=[]), name="route_lb_any_host"),
        ]
        ordering = ["lb__name", "priority"]

    def __str__(self) -> str:
        return f"{self.lb.name}#{self.priority}"

    def audit_extra(self) -> dict:
        """The audit log keeps every editable field (apps.audit.services.audit_snapshot) and the targets."""
        return {"targets": [{"pool": t.pool_id, "weight": t.weight} for t in self.targets.all()]}


class RouteChange(models.Model):
    """Which routes an LB revision changed (written with the change, in its transaction).

    Lets a fleet's reconciler bring the routes it holds in memory up to date by reading only these
    routes, instead of all of them: at 100k routes a full read costs seconds per change. An LB revision
    with no rows here changed something else (a pool, a listener...), which the reconciler must read in full.
    Old rows are pruned (apps.balancers.services.route_changes_prune); a gap sends readers to the full read.
    """

    lb = models.ForeignKey(LoadBalancer, on_delete=models.CASCADE, related_name="+")
    lb_revision = models.PositiveBigIntegerField()
    route_id = models.BigIntegerField()  # no FK: the route may be gone (deleted)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["lb", "lb_revision"], name="route_change_lb_rev")]

    def __str__(self) -> str:
        return f"lb {self.lb_id}@{self.lb_revision}: route {self.route_id}"


class RouteTarget(models.Model):
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="targets")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="route_targets")
    weight = models.PositiveIntegerField(default=100)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["route", "pool"], name="route_target_unique")]
        ordering = ["route_id", "pool_id"]

    def __str__(self) -> str:
        return f"{self.route}->{self.pool_id}:{self.weight}"


class HostnameClaim(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"

    TENANT_PATH = "org"
    QUOTA = "hostname_claims"  # apps.core.quotas, checked by balancers.services.object_save on create

    org = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="hostname_claims")
    hostname = models.CharField(max_length=253)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        # Several orgs may ask for one name; only one may hold it (approved).
        constraints = [
            models.UniqueConstraint(fields=["org", "hostname"], name="claim_unique_per_org"),
            models.UniqueConstraint(fields=["hostname"], condition=Q(status="approved"),
                                    name="claim_unique_approved_hostname"),
        ]
        # A route write reads the claims that may cover its hosts by name (route_rules.claims_related).
        indexes = [models.Index(fields=["hostname"], name="claim_hostname")]
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname
