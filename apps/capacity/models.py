"""Capacity tests, their runs (split into shards), per-step results and the target allowlist."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.tenancy import TenantQuerySet


class CapacityTest(models.Model):
    """What to load, how, and what counts as healthy. Runs are its executions."""

    class Mode(models.TextChoices):
        OPEN = "open"  # planned arrival rate (req/s), latency from intended send time
        CLOSED = "closed"  # N concurrent users, like siege

    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="capacity_tests")
    name = models.SlugField(max_length=63)
    # Target: one of the org's listeners (optionally through a route / Host header + path) or,
    # when an operator allowlisted it, an external address.
    listener = models.ForeignKey("balancers.Listener", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="capacity_tests")
    route = models.ForeignKey("balancers.Route", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="capacity_tests")
    hostname = models.CharField(max_length=253, blank=True, default="")
    path = models.CharField(max_length=1024, default="/")
    address = models.CharField(max_length=253, blank=True, default="")
    port = models.PositiveIntegerField(null=True, blank=True)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.OPEN)
    # [[rate_or_users, duration_s], ...] in the order they run.
    steps = models.JSONField(default=list)
    step_duration_s = models.FloatField(default=10.0)
    think_time_s = models.FloatField(default=0.0)
    # Open loop: connections the engine may hold (requests queue, and count as late, beyond it).
    max_connections = models.PositiveIntegerField(default=100)
    slo_p99_ms = models.FloatField(default=200.0)
    slo_error_rate = models.FloatField(default=0.01)
    shards = models.PositiveSmallIntegerField(default=1)
    safety_factor = models.FloatField(default=0.8)
    # Where the recommendation goes: the pool's capacity in this region.
    pool = models.ForeignKey("balancers.Pool", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="capacity_tests")
    region = models.ForeignKey("balancers.Region", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    timeout_s = models.FloatField(default=5.0)
    created_by = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="capacity_test_unique_name"),
            models.CheckConstraint(condition=Q(shards__gte=1), name="capacity_test_shards_min"),
        ]
        ordering = ["org_id", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def schedule_s(self) -> float:
        return float(sum(duration for _, duration in self.steps))

    @property
    def peak_load(self) -> float:
        """Highest step value: req/s in open loop, users in closed loop."""
        return float(max((value for value, _ in self.steps), default=0))


class CapacityRun(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE = (Status.PENDING, Status.RUNNING)
    TENANT_PATH = "test__org"

    test = models.ForeignKey(CapacityTest, on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    requested_by = models.CharField(max_length=64, blank=True, default="")
    # Frozen at start: the whole plan (engine LoadPlan.to_dict()), the address it resolved to
    # (shards connect to this IP; DNS is never asked again), and the budget it took from the org.
    plan = models.JSONField(null=True, blank=True)
    target_address = models.CharField(max_length=64, blank=True, default="")
    target_host_header = models.CharField(max_length=260, blank=True, default="")
    peak_rate = models.FloatField(default=0.0)  # req/s an open-loop plan offers at most (0: closed loop)
    concurrency = models.PositiveIntegerField(default=0)  # connections/users the plan may hold at once
    shards_total = models.PositiveSmallIntegerField(default=1)
    shards_done = models.PositiveSmallIntegerField(default=0)
    # Shards sleep until this instant so they offer their load side by side.
    start_at = models.DateTimeField(null=True, blank=True)
    # Live progress (aggregated over shards, written at most ~2/s).
    progress_percent = models.FloatField(default=0.0)
    current_step = models.PositiveIntegerField(default=0)
    step_count = models.PositiveIntegerField(default=0)
    achieved_rate = models.FloatField(default=0.0)
    sent = models.PositiveBigIntegerField(default=0)
    ok = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    progress_at = models.DateTimeField(null=True, blank=True)
    stopped_reason = models.CharField(max_length=32, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # Outcome.
    knee_capacity_rps = models.FloatField(null=True, blank=True)
    knee_step_index = models.IntegerField(null=True, blank=True)
    knee_code = models.CharField(max_length=32, blank=True, default="")
    knee_reason = models.TextField(blank=True, default="")
    pool_region = models.ForeignKey("balancers.PoolRegion", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    healthy_members = models.PositiveIntegerField(null=True, blank=True)
    recommended_max_rate_per_member = models.FloatField(null=True, blank=True)
    recommendation_note = models.TextField(blank=True, default="")
    # The tested pool-region's backend counters on the serving nodes at the start ({node: {backend: total}}), and
    # the requests its members served during the run: only those count towards the recommendation (a canary
    # split or overflow sends some of the test's requests to other pools or regions).
    pool_counters_start = models.JSONField(null=True, blank=True)
    pool_served = models.PositiveBigIntegerField(null=True, blank=True)
    # Started by a failover drill: the load is the drill's, so the tested region is not held (overflow is what
    # the drill measures) and nothing is recommended from it.
    for_drill = models.BooleanField(default=False)
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.test.name}#{self.pk}"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class CapacityShard(models.Model):
    """One worker's share of a run: its own progress row, so shards never fight over one row."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        LOST = "lost"  # the worker died mid-run; its load is not offered twice

    FINISHED = (Status.DONE, Status.FAILED, Status.LOST)
    TENANT_PATH = "run__test__org"

    run = models.ForeignKey(CapacityRun, on_delete=models.CASCADE, related_name="shard_rows")
    index = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    worker = models.CharField(max_length=200, blank=True, default="")
    percent = models.FloatField(default=0.0)
    current_step = models.PositiveIntegerField(default=0)
    achieved_rate = models.FloatField(default=0.0)
    sent = models.PositiveBigIntegerField(default=0)
    ok = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    stopped_reason = models.CharField(max_length=32, blank=True, default="")
    start_skew_s = models.FloatField(null=True, blank=True)  # how late it started versus run.start_at
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="capacity_shard_unique")]
        ordering = ["run_id", "index"]

    def __str__(self) -> str:
        return f"run {self.run_id} shard {self.index}"


class StepResult(models.Model):
    """One step as one shard measured it (`shard` set) or all shards merged (`shard` null)."""

    TENANT_PATH = "run__test__org"

    run = models.ForeignKey(CapacityRun, on_delete=models.CASCADE, related_name="step_results")
    index = models.PositiveIntegerField()
    shard = models.PositiveSmallIntegerField(null=True, blank=True)
    offered_rate = models.FloatField()
    achieved_rate = models.FloatField()
    duration_s = models.FloatField()
    users = models.PositiveIntegerField(default=0)
    sent = models.PositiveBigIntegerField(default=0)
    ok = models.PositiveBigIntegerField()
    errors = models.JSONField(default=dict)  # by kind: refused, reset, timeout, non_2xx, bad_response, other
    error_count = models.PositiveBigIntegerField(default=0)
    pool_exhausted = models.PositiveBigIntegerField(default=0)
    p50_ms = models.FloatField()
    p90_ms = models.FloatField()
    p99_ms = models.FloatField()
    p999_ms = models.FloatField()
    max_ms = models.FloatField()
    histogram = models.TextField()  # encoded HdrHistogram (us); merges exactly

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "index", "shard"], condition=Q(shard__isnull=False),
                                    name="capacity_step_unique_shard"),
            models.UniqueConstraint(fields=["run", "index"], condition=Q(shard__isnull=True),
                                    name="capacity_step_unique_merged"),
        ]
        ordering = ["run_id", "index", "shard"]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.index} " + ("merged" if self.shard is None else f"shard {self.shard}")

    @property
    def requests(self) -> int:
        return self.ok + self.error_count

    @property
    def error_rate(self) -> float:
        total = self.requests
        return self.error_count / total if total else 0.0


class Drill(models.Model):
    """A failover drill: drain a share of one region of a pool for a while (optionally under a capacity test's
    load), check that the other regions absorb it within their capacities and the drill's SLO, restore, and
    keep what happened each second (`samples`) and what it came to (`summary`). apps/capacity/drills.py."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        PASSED = "passed"
        FAILED = "failed"  # an SLO or capacity check broke: restored at once
        CANCELLED = "cancelled"

    ACTIVE = (Status.PENDING, Status.RUNNING)
    TENANT_PATH = "pool__org"

    pool = models.ForeignKey("balancers.Pool", on_delete=models.CASCADE, related_name="drills")
    region = models.ForeignKey("balancers.Region", on_delete=models.PROTECT, related_name="+")
    share = models.FloatField(default=1.0)  # of the region drained: 1.0 = all of it
    duration_s = models.FloatField(default=60.0)
    test = models.ForeignKey(CapacityTest, null=True, blank=True, on_delete=models.SET_NULL, related_name="drills")
    capacity_run = models.ForeignKey(CapacityRun, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    slo_p99_ms = models.FloatField(null=True, blank=True)  # needs a capacity test (clients measure latency)
    slo_error_rate = models.FloatField(default=0.01)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    phase = models.CharField(max_length=16, blank=True, default="")  # baseline, drained, restored
    requested_by = models.CharField(max_length=64, blank=True, default="")
    reason = models.TextField(blank=True, default="")  # why it failed or was cancelled
    failed_check = models.CharField(max_length=32, blank=True, default="")  # error_rate, p99, over_capacity, ...
    # One entry per second: {"t", "phase", "served": {region: req/s}, "capacity": {region: req/s or None},
    # "arrived", "errors" (req/s), "error_rate", "p99_ms"}.
    samples = models.JSONField(default=list, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    drained_at = models.DateTimeField(null=True, blank=True)
    restored_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(share__gt=0, share__lte=1), name="drill_share_range"),
        ]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.pool.name}#{self.pk}"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class TargetAllowlistQuerySet(TenantQuerySet):
    def visible_to(self, principal) -> TargetAllowlistQuerySet:
        if principal.is_operator:
            return self
        # A tenant sees the entries that apply to it: its own and the global ones.
        return self.filter(Q(org_id=principal.org_id) | Q(org__isnull=True))

    def writable_by(self, principal) -> TargetAllowlistQuerySet:
        # The allowlist lifts address refusals: only operators may widen it.
        return self if principal.is_operator else self.none()


class TargetAllowlist(models.Model):
    """Operator-managed targets tenants may additionally aim at (org null: every org).

    A CIDR also lifts the private/loopback address refusal for addresses inside it (the demo and the
    tests allowlist 127.0.0.0/8); a hostname (exact or *.suffix) allows that external name.
    """

    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", null=True, blank=True, on_delete=models.CASCADE,
                            related_name="capacity_allowlist")
    cidr = models.CharField(max_length=64, blank=True, default="")
    hostname = models.CharField(max_length=253, blank=True, default="")
    # Ports an address/hostname target may use ("80,443,8000-8099"). Empty: the entry only lifts the
    # address refusal for the org's own listeners' static IPs, and allows no address target at all.
    ports = models.CharField(max_length=200, blank=True, default="")
    note = models.CharField(max_length=200, blank=True, default="")
    created_by = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TargetAllowlistQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(cidr="") | ~Q(hostname=""),
                                   name="capacity_allowlist_not_empty"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return self.cidr or self.hostname
