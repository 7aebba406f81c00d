"""Traffic time series: raw per-node samples, per-region overflow points, last known capacities.

Nodes are referred to by id and "fleet/node" name, not by a foreign key: samples outlive the
nodes that sent them (a removed node's history still explains last week's overflow).
"""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import TenantQuerySet


class TrafficSample(models.Model):
    """What one node sent for one pool at one collection (req/s), from its `show stat` backend rows."""

    TENANT_PATH = "pool__org"

    time = models.DateTimeField()
    pool = models.ForeignKey("balancers.Pool", on_delete=models.CASCADE, related_name="+")
    node_id_ref = models.PositiveIntegerField(null=True, blank=True)  # fleets.Node id when known
    node = models.CharField(max_length=128)  # "fleet/node"
    region = models.CharField(max_length=63)  # the node's region (where this demand arrived)
    request_rate = models.FloatField(default=0.0)  # everything the node sent for the pool
    sessions = models.IntegerField(default=0)
    served_local = models.FloatField(default=0.0)  # sent to the node's own region
    sent_to = models.JSONField(default=dict)  # other region -> req/s
    totals = models.JSONField(default=dict)  # backend -> cumulative requests (for counter rates)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            # The collector and the hot-copy task may both record the same reading: once only.
            models.UniqueConstraint(fields=["pool", "node", "time"], name="traffic_sample_unique"),
        ]
        indexes = [models.Index(fields=["pool", "time"]), models.Index(fields=["time"])]
        ordering = ["pool_id", "time", "node"]

    def __str__(self) -> str:
        return f"{self.pool_id}@{self.node} {self.time:%H:%M:%S} {self.request_rate:.1f}/s"


class OverflowPoint(models.Model):
    """One pool's traffic in one region over one bucket: the overflow timeline (downsampled)."""

    TENANT_PATH = "pool__org"

    pool = models.ForeignKey("balancers.Pool", on_delete=models.CASCADE, related_name="+")
    time = models.DateTimeField()  # bucket start
    resolution_s = models.PositiveIntegerField()  # bucket length
    region = models.CharField(max_length=63)
    capacity = models.FloatField(null=True, blank=True)  # None = unlimited
    demand = models.FloatField(default=0.0)  # arriving at this region's nodes
    local = models.FloatField(default=0.0)  # of that, served here
    out = models.FloatField(default=0.0)  # of that, sent to other regions
    inflow = models.FloatField(default=0.0)  # other regions' demand served here
    out_to = models.JSONField(default=dict)
    in_from = models.JSONField(default=dict)
    utilization = models.FloatField(default=0.0)  # (local + inflow) / capacity
    nodes = models.PositiveIntegerField(default=0)  # nodes of this region that reported

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "resolution_s", "time", "region"],
                                    name="overflow_point_unique"),
        ]
        indexes = [models.Index(fields=["pool", "resolution_s", "time"]),
                   models.Index(fields=["resolution_s", "time"])]
        ordering = ["pool_id", "resolution_s", "time", "region"]

    def __str__(self) -> str:
        return f"{self.pool_id}/{self.region} {self.time:%H:%M:%S}+{self.resolution_s}s"


class CapacityState(models.Model):
    """The capacity last seen per pool and region (health included): a change re-renders the fleets."""

    TENANT_PATH = "pool__org"

    pool = models.ForeignKey("balancers.Pool", on_delete=models.CASCADE, related_name="+")
    region = models.CharField(max_length=63)
    healthy_members = models.PositiveIntegerField(default=0)
    capacity = models.FloatField(null=True, blank=True)  # None = unlimited
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "region"], name="capacity_state_unique")]
        ordering = ["pool_id", "region"]

    def __str__(self) -> str:
        return f"{self.pool_id}/{self.region}: {self.healthy_members} healthy"


class OverflowState(models.Model):
    """Whether a pool's region is overflowing, as its last event said: the state the events' hysteresis holds
    (apps.traffic.services.overflow_events_evaluate). A transition is claimed with a conditional UPDATE, so two
    processes ingesting samples at once send one event."""

    TENANT_PATH = "pool__org"

    pool = models.ForeignKey("balancers.Pool", on_delete=models.CASCADE, related_name="+")
    region = models.CharField(max_length=63)
    overflowing = models.BooleanField(default=False)
    changed_at = models.DateTimeField(null=True, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "region"], name="overflow_state_unique")]
        ordering = ["pool_id", "region"]

    def __str__(self) -> str:
        return f"{self.pool_id}/{self.region}: {'overflowing' if self.overflowing else 'within capacity'}"
