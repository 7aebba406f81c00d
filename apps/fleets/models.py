"""HAProxy fleets, nodes, config revisions, rollouts, node health and TLS certificates."""

from __future__ import annotations

from typing import TypeVar

from django.db import models
from django.db.models import Q

from apps.balancers.models import LoadBalancer
from apps.core.tenancy import OperatorQuerySet, RestrictedQuerySet, TenantQuerySet

T = TypeVar("T")


class Fleet(models.Model):
    """A group of HAProxy nodes in one region serving a set of load balancers.

    The LBs a fleet serves are those whose `LoadBalancer.fleet` points here plus `serves`: one LB
    served in several regions (the demo's `edge`) has one fleet per region, and the FK can only
    name one of them.
    """

    name = models.SlugField(max_length=63, unique=True)
    region = models.ForeignKey("balancers.Region", on_delete=models.PROTECT, related_name="fleets")
    serves = models.ManyToManyField("balancers.LoadBalancer", blank=True, related_name="serving_fleets")
    # Rollout strategy: first node alone (canary), then the rest `batch_size` at a time (0 = all).
    canary = models.BooleanField(default=True)
    batch_size = models.PositiveSmallIntegerField(default=0)
    # A watched canary (needs signals): the canary serves alone for canary_watch_s while its 5xx share and p99
    # latency are compared with the other nodes'; a rise past either guard restores it and stops the rollout
    # (rollout/canary.py). 0: not watched. The guards also flag a change's page (apps.signals.impact).
    canary_watch_s = models.PositiveSmallIntegerField(default=0)
    guard_5xx_rise_pct = models.FloatField(default=5.0)  # percentage points of requests answered 5xx
    guard_p99_rise_ms = models.PositiveIntegerField(default=500)  # 0: latency not judged
    # Off: changes wait (previewable) until someone pushes them; on: each change rolls out at once.
    auto_rollout = models.BooleanField(default=True)
    # The revision number every node should serve (0 = nothing rendered yet).
    desired_revision = models.PositiveIntegerField(default=0)
    # Coalescing: each desired-state change bumps change_seq; a reconcile renders once for all
    # changes up to the seq it read (rendered_seq). reconcile_queued dedupes queued tasks.
    change_seq = models.PositiveBigIntegerField(default=0)
    rendered_seq = models.PositiveBigIntegerField(default=0)
    # The part of change_seq that only changed routes (journaled in balancers.RouteChange). A reconciler
    # holding the fleet's state of an earlier change_seq may apply those route changes alone when
    # change_seq and route_seq moved by the same amount since (apps.fleets.config.routelane); any other change
    # (wherever it bumps change_seq) breaks that equality and sends it to a full render.
    route_seq = models.PositiveBigIntegerField(default=0)
    reconcile_queued = models.BooleanField(default=False)
    # One rollout at a time per fleet: a lease claimed with a conditional UPDATE, renewed while
    # working, so a killed worker's lease expires (or is taken over when its PID is gone).
    # Floating VIPs (keepalived, apps.fleets.config.render.keepalived): VRRPv3 allows sub-second adverts but
    # has no authentication; VRRPv2 authenticates with the secret below (Fernet) in whole seconds.
    vrrp_version = models.PositiveSmallIntegerField(choices=[(2, "VRRPv2 (authenticated, 1 s steps)"),
                                                             (3, "VRRPv3 (sub-second adverts)")], default=3)
    vrrp_advert_ms = models.PositiveIntegerField(default=200)
    vrrp_secret_encrypted = models.TextField(blank=True, default="")
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    # Where the nodes send their request log (apps.signals' collector), `address:port` as the nodes reach it;
    # blank: settings.SIGNALS_TARGET (blank there too: no request log, and no signals for this fleet).
    signals_target = models.CharField(max_length=64, blank=True, default="")
    # Set when the nodes serve revisions this database does not know (it was restored from a backup older than
    # what they serve): no rollout touches a node until an operator confirms (rollout/restore.py). What the
    # nodes serve, what the database would change on them, when it was found.
    restore_hold = models.JSONField(default=dict, blank=True)
    # Revision digests the nodes served that an operator accepted to replace with this database's state.
    restore_accepted = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # What the audit log keeps (apps.audit.services.audit_snapshot).
    audit_fields = ("name", "region", "canary", "batch_size", "auto_rollout", "vrrp_version", "vrrp_advert_ms",
                    "canary_watch_s", "guard_5xx_rise_pct", "guard_p99_rise_ms", "signals_target")

    objects = OperatorQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def audit_extra(self) -> dict:
        return {"serves": sorted(self.serves.values_list("pk", flat=True))}


class Node(models.Model):
    class Transport(models.TextChoices):
        LOCAL = "local"
        SSH = "ssh"

    class Status(models.TextChoices):
        UNKNOWN = "unknown"
        UP = "up"
        DOWN = "down"
        DRIFTED = "drifted"

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="nodes")
    name = models.SlugField(max_length=63)
    address = models.GenericIPAddressField()
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.LOCAL)
    # On the node: sockets + server state under runtime_dir, config sets under config_dir.
    runtime_dir = models.CharField(max_length=95)
    config_dir = models.CharField(max_length=255)
    # When set, every listener binds here instead of its static IP (loopback demo/test fleets).
    bind_address = models.GenericIPAddressField(null=True, blank=True)
    haproxy_bin = models.CharField(max_length=255, blank=True, default="")  # "" = settings.HAPROXY_BIN
    ssh_host = models.CharField(max_length=253, blank=True, default="")
    ssh_port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=64, blank=True, default="root")
    ssh_private_key_encrypted = models.TextField(blank=True, default="")  # Fernet, apps.core.crypto
    ssh_known_hosts = models.TextField(blank=True, default="")  # pinned host key line(s)
    enabled = models.BooleanField(default=True)  # disabled nodes take no rollouts and block no waits
    # Set: the node runs keepalived on this interface and holds the fleet's VIPs in turn; blank: no VRRP.
    vrrp_interface = models.CharField(max_length=15, blank=True, default="")
    # Drained: the node gives its VIPs up first (they move to a peer), then its traffic drains away; its health
    # endpoint (below) answers 503, so upstream load balancers, DNS or anycast stop choosing it.
    drained = models.BooleanField(default=False)
    # Where upstream load balancers, DNS or anycast check this node: GET http://<address>:<health_port>/spillway/
    # healthz answers 200 in service, 503 drained (HAProxy monitor-uri; the drain flips a map, no reload).
    # Empty: no health endpoint.
    health_port = models.PositiveIntegerField(null=True, blank=True)
    # On: keepalived runs in the host's initial network namespace (a host service, or a container on the
    # host network) and sees the local HAProxy die through kernel process events, at once. Off: only the
    # 1 s poll; needed where keepalived has a network namespace of its own, which gets no process events
    # (keepalived would then hold every instance in FAULT, and this node would never hold a VIP).
    vrrp_process_events = models.BooleanField(default=True)
    applied_revision = models.ForeignKey(
        "ConfigRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    applied_sha256 = models.CharField(max_length=64, blank=True, default="")
    # The worker PID that took the applied revision: a different one means someone reloaded.
    worker_pid = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.UNKNOWN)
    status_detail = models.TextField(blank=True, default="")
    last_seen = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # What the audit log keeps (apps.audit.services.audit_snapshot): never the SSH key.
    audit_fields = ("name", "address", "transport", "runtime_dir", "config_dir", "bind_address", "haproxy_bin",
                    "ssh_host", "ssh_port", "ssh_user", "enabled", "vrrp_interface", "drained", "vrrp_process_events",
                    "health_port")

    objects = OperatorQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["fleet", "name"], name="node_unique_name")]
        ordering = ["fleet__name", "name"]

    def __str__(self) -> str:
        return self.label(self.fleet.name, self.name)

    @staticmethod
    def label(fleet: str, node: str) -> str:
        """`fleet/node`: how pages, traffic samples and the node's own request log name a node."""
        return f"{fleet}/{node}"


# A revision's columns that grow with the routes (megabytes at 100k): left out wherever a node or rollout
# row only needs the revision's number, hash or coverage; Django loads a deferred field when it is read.
REVISION_BULK_FIELDS = ("text", "diff", "snapshot", "validation_output")


def revision_deferred(path: str = "") -> tuple[str, ...]:
    """What a revision leaves unread where it is listed, alone or joined to each node or rollout (`path`, as given to
    select_related): the bulk fields (megabytes of text and snapshot at 100k routes), its problems and its
    lb_revisions (an entry per LB the fleet serves). Each row carried them: 0.9 s a node at 100k routes, so a fleet
    page and its nodes panel (polled every 3 s) took ~1 min at 67 nodes after a full render."""
    prefix = f"{path}__" if path else ""
    return tuple(f"{prefix}{field}" for field in (*REVISION_BULK_FIELDS, "problems", "lb_revisions"))


class ConfigRevision(models.Model):
    class Validation(models.TextChoices):
        """How the revision was judged valid; the rollout reads this, never the human-readable output."""

        HAPROXY = "haproxy", "haproxy -c -dW"
        CERTIFICATES_ONLY = "certificates_only", "only certificate contents changed"
        MAPS_ONLY = "maps_only", "only map contents changed"
        ROUTE_LANE = "route_lane", "route lane: only moved map entries"
        REFUSED = "refused", "refused by the renderer"

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    # haproxy.cfg as rendered for the fleet's reference node (queries.reference_node).
    text = models.TextField()
    # Content hash of the reference bundle without its header (which names the revision), so the
    # same desired state always hashes the same and makes no new revision.
    sha256 = models.CharField(max_length=64)
    diff = models.TextField(blank=True, default="")  # unified diff against the previous revision
    # The FleetSnapshot it was rendered from (cert keys encrypted), so any node can be rendered
    # for this revision later: rollback to any revision, drift checks, nodes added afterwards.
    snapshot = models.JSONField(default=dict)
    validation_ok = models.BooleanField(default=False)
    validation_output = models.TextField(blank=True, default="")
    validation_kind = models.CharField(max_length=24, choices=Validation.choices, default=Validation.HAPROXY)
    validation_ms = models.FloatField(default=0.0)
    lb_revisions = models.JSONField(default=dict)  # {"<lb id>": <LoadBalancer.revision covered>}
    reason = models.CharField(max_length=200, blank=True, default="")
    # Objects left out of this revision because they could not render ({kind, id, code, detail});
    # shown to each object's owner only (apps.fleets.queries.render_problems_for).
    problems = models.JSONField(default=list, blank=True)
    # A route-lane revision (apps.fleets.config.routelane): only route changes on `base`, stored as those
    # changes (`snapshot` = {"lane": ...}) with no text; its snapshot is the base's with them applied.
    base = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OperatorQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["fleet", "number"], name="revision_unique_number")]
        ordering = ["fleet__name", "-number"]

    def __str__(self) -> str:
        return f"{self.fleet.name}@{self.number}"


def fleets_visible_to(principal) -> models.QuerySet[Fleet]:
    """Operators: every fleet. Customers: the fleets serving a load balancer they can see (their pages
    and rollouts; the fleet API itself is the operator's, OperatorQuerySet)."""
    if principal.is_operator:
        return Fleet.objects.all()
    lbs = LoadBalancer.objects.visible_to(principal).values("pk")
    # pk__in rather than a join with distinct(), so callers may annotate counts safely.
    return Fleet.objects.filter(pk__in=Fleet.objects.filter(Q(load_balancers__in=lbs) | Q(serves__in=lbs))
                                .values("pk"))


class RolloutQuerySet(RestrictedQuerySet):
    def visible_to(self, principal) -> RolloutQuerySet:
        """Operators see all; customers the rollouts of fleets serving an LB they can see."""
        if principal.is_operator:
            return self
        return self.filter(fleet__in=fleets_visible_to(principal))

    def writable_by(self, principal) -> RolloutQuerySet:
        # Rolling a fleet back moves every tenant's config: the operator's call.
        return self if principal.is_operator else self.none()

    def with_fleet_and_revision(self) -> RolloutQuerySet:
        """As a rollout is run (rollout/execute.py): its fleet and revision with it, the revision's bulk fields left
        (megabytes at 100k routes)."""
        return self.select_related("fleet", "revision").defer(*(f"revision__{f}" for f in REVISION_BULK_FIELDS))


class Rollout(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        ROLLED_BACK = "rolled_back"
        SUPERSEDED = "superseded"  # a newer rollout of the same fleet took over before it ran

    class Kind(models.TextChoices):
        DEPLOY = "deploy"
        ROLLBACK = "rollback"
        CONVERGE = "converge"  # re-apply the desired revision to nodes that are off it

    ACTIVE = (Status.PENDING, Status.RUNNING)

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="rollouts")
    # RESTRICT: a revision with rollouts cannot be deleted alone, but goes with its fleet.
    revision = models.ForeignKey(ConfigRevision, on_delete=models.RESTRICT, related_name="rollouts")
    from_revision = models.PositiveIntegerField(default=0)  # fleet.desired_revision before this one
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.DEPLOY)
    canary = models.BooleanField(default=True)
    batch_size = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True, default="")
    # A watched canary saw errors or latency rise and put its node back (rollout/canary.py): the reconcile
    # leaves this revision alone after (an explicit push may still send it).
    stopped_by_canary = models.BooleanField(default=False)
    actor = models.CharField(max_length=100, blank=True, default="system")
    rollback_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="rollbacks"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)

    objects = RolloutQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["fleet", "status"])]

    def __str__(self) -> str:
        return f"rollout {self.pk} {self.fleet.name}@{self.revision.number} {self.status}"

    def batches(self, items: list[T]) -> list[list[T]]:
        """`items` (its nodes' results, in order) in the batches this rollout runs them: the canary alone first,
        then `batch_size` at a time (0: all the rest together)."""
        batches: list[list[T]] = []
        rest = list(items)
        if self.canary and rest:
            batches.append([rest.pop(0)])
        size = self.batch_size if self.batch_size > 0 else max(1, len(rest))
        batches += [rest[i : i + size] for i in range(0, len(rest), size)]
        return batches


class NodeResult(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        ROLLED_BACK = "rolled_back"  # failed, then put back on its last good config
        SKIPPED = "skipped"  # not attempted: the rollout stopped first, or the node was down

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="results")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="results")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True, default="")
    # The node could not be reached: nothing was verified on it, so it is retried when it returns
    # (a node that refused the config or failed verification is not retried with the same revision).
    unreachable = models.BooleanField(default=False)
    duration_ms = models.FloatField(null=True, blank=True)
    push_ms = models.FloatField(null=True, blank=True)
    reload_ms = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rollout", "node"], name="node_result_unique")]
        ordering = ["rollout_id", "node__name"]

    def __str__(self) -> str:
        return f"{self.node}: {self.status}"


class NodeHealth(models.Model):
    """Hot copy of `show stat` per node and proxy/server, overwritten by each health collection."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health")
    proxy = models.CharField(max_length=128)
    server = models.CharField(max_length=128)  # "BACKEND" / "FRONTEND" rows are kept too
    status = models.CharField(max_length=32, blank=True, default="")
    check_status = models.CharField(max_length=32, blank=True, default="")
    weight = models.IntegerField(null=True, blank=True)
    sessions = models.IntegerField(null=True, blank=True)
    rate_per_s = models.IntegerField(null=True, blank=True)
    requests_total = models.BigIntegerField(null=True, blank=True)
    # When HAProxy last changed this server's state (now - `lastchg`): "down for 5 min", "up since 10:02".
    changed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "proxy", "server"], name="node_health_unique")
        ]
        ordering = ["node_id", "proxy", "server"]

    def __str__(self) -> str:
        return f"{self.node}:{self.proxy}/{self.server} {self.status}"


class ChallengeAnswer(models.Model):
    """An ACME HTTP-01 answer (token -> key authorization) every node serves while its order is open.

    Published through the runtime API (no revision, no reload: services.acme_challenges_set) and kept
    here, so that a node reloaded or restarted meanwhile gets it back from whichever worker reloads it
    (node/apply.apply_node), not only from the process that placed the order. Key authorizations are
    public by design (the CA fetches them over plain HTTP), so no tenant owns them.
    """

    token = models.CharField(max_length=255, unique=True)
    key_authorization = models.TextField()
    expires_at = models.DateTimeField(db_index=True)  # an order left open by a killed worker ends here
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["token"]

    def __str__(self) -> str:
        return self.token


class Certificate(models.Model):
    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="certificates")
    name = models.SlugField(max_length=63)
    cert_pem = models.TextField()  # leaf first, then the chain
    key_encrypted = models.TextField()  # Fernet, see apps.core.crypto
    subject = models.CharField(max_length=500, blank=True)
    issuer = models.CharField(max_length=500, blank=True, default="")
    dns_names = models.JSONField(default=list)
    not_before = models.DateTimeField(null=True, blank=True)
    not_after = models.DateTimeField(null=True, blank=True)
    fingerprint_sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="certificate_unique_name")]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
