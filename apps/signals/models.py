"""Golden signals: request sums per series and time bucket, from the nodes' request logs (aggregate.py)."""

from __future__ import annotations

from django.db import models

from apps.core.tenancy import TenantQuerySet


class SignalBucket(models.Model):
    """One series' requests in one bucket: counts by status class, retries, latency histograms.

    Fine buckets (FINE_STEP_S) are kept FINE_KEEP; coarse ones (COARSE_STEP_S), rolled up from them, are
    kept COARSE_KEEP (services.signals_rollup). `org` is whose traffic this is: the route's org for a
    route, the LB's for a listener, the pool's for a member, so a tenant reads its own and nothing else.
    """

    class Kind(models.TextChoices):
        LISTENER = "listener"
        ROUTE = "route"
        MEMBER = "member"

    TENANT_PATH = "org"

    kind = models.CharField(max_length=8, choices=Kind.choices)
    ref_id = models.PositiveIntegerField()  # Listener, Route or Member id
    node = models.CharField(max_length=128, blank=True, default="")  # "fleet/node"; "" for routes
    start = models.DateTimeField()
    step_s = models.PositiveIntegerField()
    org = models.ForeignKey("accounts.Organization", null=True, on_delete=models.CASCADE, related_name="+",
                            db_constraint=False)
    lb_id = models.PositiveIntegerField(null=True)
    pool_id = models.PositiveIntegerField(null=True)
    region = models.CharField(max_length=63, blank=True, default="")  # the node's (listener) or member's region
    requests = models.PositiveIntegerField(default=0)
    s1xx = models.PositiveIntegerField(default=0)
    s2xx = models.PositiveIntegerField(default=0)
    s3xx = models.PositiveIntegerField(default=0)
    s4xx = models.PositiveIntegerField(default=0)
    s5xx = models.PositiveIntegerField(default=0)
    proxy_5xx = models.PositiveIntegerField(default=0)
    aborted = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    redispatches = models.PositiveIntegerField(default=0)
    bytes = models.PositiveBigIntegerField(default=0)
    t_queue = models.JSONField(default=dict)  # sparse histogram, apps.signals.hist
    t_connect = models.JSONField(default=dict)
    t_upstream = models.JSONField(default=dict)
    t_total = models.JSONField(default=dict)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "ref_id", "node", "step_s", "start"],
                                               name="signal_bucket_unique")]
        indexes = [
            models.Index(fields=["kind", "ref_id", "step_s", "start"], name="signal_series"),
            models.Index(fields=["kind", "lb_id", "step_s", "start"], name="signal_lb"),
            models.Index(fields=["kind", "pool_id", "step_s", "start"], name="signal_pool"),
            models.Index(fields=["step_s", "start"], name="signal_time"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.ref_id}@{self.node or '*'} {self.start:%H:%M:%S}+{self.step_s}s {self.requests}"


class RequestSample(models.Model):
    """One request as a node logged it, sampled by the collector (apps.signals.sampling): the raw requests
    behind a chart's number. Bounded: at most SAMPLE_ERRORS_PER_S failed and SAMPLE_OTHERS_PER_S other requests
    per LB and second, kept SAMPLE_KEEP. `org` is whose traffic it is (the route's org, else the LB's)."""

    TENANT_PATH = "org"

    at = models.DateTimeField()
    lb_id = models.PositiveIntegerField()
    org = models.ForeignKey("accounts.Organization", null=True, on_delete=models.CASCADE, related_name="+",
                            db_constraint=False)
    route_id = models.PositiveIntegerField(null=True)
    pool_id = models.PositiveIntegerField(null=True)
    member_id = models.PositiveIntegerField(null=True)
    node = models.CharField(max_length=128)  # "fleet/node": shown to operators only
    region = models.CharField(max_length=63, blank=True, default="")  # the node's
    status = models.SmallIntegerField()  # -1: the client left before a response
    by_proxy = models.BooleanField(default=False)  # HAProxy answered itself (logline.Request.by_proxy)
    termination = models.CharField(max_length=4)
    t_queue = models.IntegerField()
    t_connect = models.IntegerField()
    t_upstream = models.IntegerField()
    t_total = models.IntegerField()
    retries = models.PositiveSmallIntegerField(default=0)
    bytes = models.PositiveBigIntegerField(default=0)
    host = models.CharField(max_length=255)
    path = models.CharField(max_length=1024)

    objects = TenantQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["lb_id", "-at"], name="sample_lb"),
            models.Index(fields=["route_id", "-at"], name="sample_route"),
            models.Index(fields=["pool_id", "-at"], name="sample_pool"),
            models.Index(fields=["at"], name="sample_time"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.status} {self.host}{self.path}"
