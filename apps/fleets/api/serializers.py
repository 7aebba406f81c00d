"""Fleets API serializers: validate at the edge, never write (services do)."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from apps.accounts.models import Organization
from apps.balancers.models import LoadBalancer, Region
from apps.core.api.fields import (
    ScopedRelatedField,
    ScopedSlugRelatedField,
    SlugNameField,
    TenantModelSerializer,
    validate_address_port,
    validate_ip,
)
from apps.fleets.config.certificates import expiry_warnings
from apps.fleets.config.render import UnsafeValue
from apps.fleets.config.render.guard import check_node
from apps.fleets.config.spec import NodeSpec
from apps.fleets.models import Certificate, ConfigRevision, Fleet, Node, NodeResult, Rollout
from apps.fleets.node.transports import NodeConn, TransportError

_ABS_PATH_RE = re.compile(r"^(?:/[A-Za-z0-9._-]+)+$")
_SSH_HOST_RE = re.compile(r"^[A-Za-z0-9.:-]{1,253}$")
_INTERFACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
_SSH_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class FleetSerializer(TenantModelSerializer):
    name = SlugNameField()
    region = ScopedSlugRelatedField(Region)
    serves = ScopedRelatedField(LoadBalancer, many=True, required=False,
                                limit_choices={"kind": LoadBalancer.Kind.HAPROXY})
    load_balancers = serializers.SerializerMethodField()
    nodes = serializers.SerializerMethodField()
    pinned = serializers.SerializerMethodField()
    signals_target = serializers.CharField(required=False, allow_blank=True, max_length=64,
                                           validators=[validate_address_port])
    # At most 2 minutes: the watch holds the fleet's reconcile (and its shard worker) while it lasts.
    canary_watch_s = serializers.IntegerField(required=False, min_value=0, max_value=120)
    guard_5xx_rise_pct = serializers.FloatField(required=False, min_value=0.1, max_value=100.0)
    guard_p99_rise_ms = serializers.IntegerField(required=False, min_value=0, max_value=60_000)

    class Meta:
        model = Fleet
        fields = ["id", "name", "region", "serves", "load_balancers", "canary", "batch_size", "auto_rollout",
                  "canary_watch_s", "guard_5xx_rise_pct", "guard_p99_rise_ms", "signals_target",
                  "vrrp_version", "vrrp_advert_ms", "desired_revision", "pinned", "nodes", "restore_hold",
                  "created_at", "updated_at"]
        read_only_fields = ["desired_revision", "restore_hold", "created_at", "updated_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        version = attrs.get("vrrp_version", getattr(self.instance, "vrrp_version", 3))
        advert_ms = attrs.get("vrrp_advert_ms", getattr(self.instance, "vrrp_advert_ms", 200))
        low = 100 if version == 3 else 1000
        step = 10 if version == 3 else 1000
        if not low <= advert_ms <= 40950 or advert_ms % step:
            raise serializers.ValidationError({"vrrp_advert_ms": [
                f"VRRPv{version} adverts: {low}..40950 ms in steps of {step} ms."]})
        return attrs

    def get_pinned(self, fleet: Fleet) -> dict[str, Any] | None:
        """Set after a rollback until someone moves the fleet forward (push or automatic rollout)."""
        from apps.fleets.selectors import fleet_pin

        return fleet_pin(fleet)

    def get_load_balancers(self, fleet: Fleet) -> list[str]:
        from apps.fleets.selectors import fleet_lbs

        return [lb.name for lb in fleet_lbs(fleet)]

    def get_nodes(self, fleet: Fleet) -> dict[str, Any]:
        nodes = list(fleet.nodes.filter(enabled=True).values_list("status", "applied_revision__number"))
        by_status: dict[str, int] = {}
        for status, _ in nodes:
            by_status[status] = by_status.get(status, 0) + 1
        on_desired = sum(1 for _, number in nodes if number == fleet.desired_revision)
        return {"total": len(nodes), "by_status": by_status, "on_desired_revision": on_desired}


class NodeSerializer(TenantModelSerializer):
    name = SlugNameField()
    fleet = ScopedSlugRelatedField(Fleet, slug_field="name")
    address = serializers.CharField(validators=[validate_ip])
    bind_address = serializers.CharField(validators=[validate_ip], required=False, allow_null=True)
    ssh_private_key = serializers.CharField(write_only=True, required=False, allow_blank=False,
                                            trim_whitespace=False, max_length=20000)
    has_ssh_key = serializers.SerializerMethodField()
    applied_revision = serializers.SlugRelatedField(slug_field="number", read_only=True)
    desired_revision = serializers.IntegerField(source="fleet.desired_revision", read_only=True)

    class Meta:
        model = Node
        fields = ["id", "fleet", "name", "address", "transport", "runtime_dir", "config_dir", "bind_address",
                  "haproxy_bin", "ssh_host", "ssh_port", "ssh_user", "ssh_private_key", "has_ssh_key",
                  "ssh_known_hosts", "enabled", "vrrp_interface", "drained", "vrrp_process_events", "health_port",
                  "applied_revision", "desired_revision", "applied_sha256",
                  "worker_pid", "status", "status_detail", "last_seen", "created_at", "updated_at"]
        read_only_fields = ["applied_sha256", "worker_pid", "status", "status_detail", "last_seen",
                            "created_at", "updated_at"]

    health_port = serializers.IntegerField(min_value=1, max_value=65535, required=False, allow_null=True,
                                           help_text="Where upstream load balancers, DNS or anycast check the node: "
                                                     "GET /spillway/healthz on this port answers 200 in service, "
                                                     "503 drained. Null: no health endpoint.")

    def validate_vrrp_interface(self, value: str) -> str:
        if value and not _INTERFACE_RE.match(value):
            raise serializers.ValidationError("An interface name: letters, digits, '_', '.', '-'; at most 15.")
        return value

    def get_has_ssh_key(self, node: Node) -> bool:
        return bool(node.ssh_private_key_encrypted)

    def validate_config_dir(self, value: str) -> str:
        if not _ABS_PATH_RE.match(value) or "/../" in value + "/" or "/./" in value + "/":
            raise serializers.ValidationError("An absolute path of letters, digits, '.', '_', '-' and '/'.")
        return value

    def validate_haproxy_bin(self, value: str) -> str:
        if value and not _ABS_PATH_RE.match(value):
            raise serializers.ValidationError("An absolute path to the haproxy binary, or empty.")
        return value

    def validate_ssh_host(self, value: str) -> str:
        if value and not _SSH_HOST_RE.match(value):
            raise serializers.ValidationError("A hostname or IP address.")
        return value

    def validate_ssh_user(self, value: str) -> str:
        if value and not _SSH_USER_RE.match(value):
            raise serializers.ValidationError("A POSIX user name.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def get(name: str) -> Any:
            return attrs.get(name, getattr(self.instance, name, None) if self.instance else None)

        try:
            check_node(NodeSpec(name=get("name") or "", runtime_dir=get("runtime_dir") or "",
                                bind_address=get("bind_address") or None))
        except UnsafeValue as exc:
            field = "runtime_dir" if "runtime_dir" in exc.field else exc.field.removeprefix("node.")
            raise serializers.ValidationError({field: [str(exc)]}) from exc
        if get("transport") == Node.Transport.SSH:
            has_key = "ssh_private_key" in attrs or (self.instance and self.instance.ssh_private_key_encrypted)
            if not has_key:
                raise serializers.ValidationError({"ssh_private_key": ["SSH nodes need a private key."]})
            if not (get("ssh_known_hosts") or "").strip():
                raise serializers.ValidationError(
                    {"ssh_known_hosts": ["Pin the node's host key: Spillway never trusts an unknown host."]})
            self._check_ssh_material(attrs, get)
        return attrs

    def _check_ssh_material(self, attrs: dict[str, Any], get) -> None:
        import asyncssh

        from apps.fleets.node.transports.ssh import known_hosts_for

        if "ssh_private_key" in attrs:
            try:
                asyncssh.import_private_key(attrs["ssh_private_key"])
            except (ValueError, asyncssh.KeyImportError) as exc:
                raise serializers.ValidationError({"ssh_private_key": [f"Cannot read the key: {exc}"]}) from exc
        conn = NodeConn(name=get("name") or "node", address=get("address") or "127.0.0.1",
                        runtime_dir="/", config_dir="/", transport="ssh", ssh_host=get("ssh_host") or "",
                        ssh_port=get("ssh_port") or 22, ssh_known_hosts=get("ssh_known_hosts") or "")
        try:
            known_hosts_for(conn)
        except TransportError as exc:
            raise serializers.ValidationError({"ssh_known_hosts": [str(exc)]}) from exc


class ConfigRevisionSerializer(TenantModelSerializer):
    fleet = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = ConfigRevision
        fields = ["id", "fleet", "number", "sha256", "validation_ok", "validation_ms", "lb_revisions", "reason",
                  "created_at"]
        read_only_fields = fields


class ConfigRevisionDetailSerializer(ConfigRevisionSerializer):
    class Meta(ConfigRevisionSerializer.Meta):
        fields = [*ConfigRevisionSerializer.Meta.fields, "text", "diff", "validation_output"]
        read_only_fields = fields


def _redact(principal, text: str, fallback: str) -> str:
    """Customers see that something failed, not HAProxy output that may name other tenants' routes."""
    if principal is None or principal.is_operator or not text:
        return text
    return fallback


class NodeResultSerializer(TenantModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    error = serializers.SerializerMethodField()

    class Meta:
        model = NodeResult
        fields = ["node", "status", "error", "unreachable", "duration_ms", "push_ms", "reload_ms",
                  "started_at", "finished_at"]
        read_only_fields = fields

    def get_error(self, result: NodeResult) -> str:
        principal = getattr(self.context.get("request"), "principal", None)
        return _redact(principal, result.error, "This node failed; an operator can see the details.")


class RolloutSerializer(TenantModelSerializer):
    fleet = ScopedSlugRelatedField(Fleet, slug_field="name")
    revision = serializers.IntegerField(required=False, min_value=1, write_only=True,
                                        help_text="Revision number to roll out; default: render now.")
    results = NodeResultSerializer(many=True, read_only=True)
    error = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = ["id", "fleet", "revision", "from_revision", "kind", "canary", "batch_size", "status", "error",
                  "actor", "rollback_of", "progress", "results", "created_at", "started_at", "finished_at",
                  "duration_ms"]
        read_only_fields = ["from_revision", "kind", "status", "actor", "rollback_of", "created_at",
                            "started_at", "finished_at", "duration_ms"]
        extra_kwargs = {"canary": {"required": False}, "batch_size": {"required": False}}

    def to_representation(self, instance: Rollout) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["revision"] = instance.revision.number
        principal = getattr(self.context.get("request"), "principal", None)
        if principal is not None and not principal.is_operator and data.get("actor") not in ("system",
                                                                                             principal.actor):
            # A shared fleet's rollout may be another tenant's change: never name its user, token or job.
            data["actor"] = "another organization or the operator"
        return data

    def get_error(self, rollout: Rollout) -> str:
        principal = getattr(self.context.get("request"), "principal", None)
        return _redact(principal, rollout.error, "The rollout failed; an operator can see the details.")

    def get_progress(self, rollout: Rollout) -> dict[str, int]:
        counts: dict[str, int] = {}
        for result in rollout.results.all():
            counts[result.status] = counts.get(result.status, 0) + 1
        return counts


class CertificateSerializer(TenantModelSerializer):
    name = SlugNameField()
    org = ScopedSlugRelatedField(Organization, required=False)
    cert_pem = serializers.CharField(trim_whitespace=False, max_length=262144,
                                     help_text="Leaf certificate, optionally followed by the chain.")
    key_pem = serializers.CharField(write_only=True, trim_whitespace=False, max_length=262144)
    chain_pem = serializers.CharField(write_only=True, required=False, allow_blank=True,
                                      trim_whitespace=False, max_length=262144)
    warnings = serializers.SerializerMethodField()

    class Meta:
        model = Certificate
        fields = ["id", "org", "name", "cert_pem", "key_pem", "chain_pem", "subject", "issuer", "dns_names",
                  "not_before", "not_after", "fingerprint_sha256", "warnings", "created_at", "updated_at"]
        read_only_fields = ["subject", "issuer", "dns_names", "not_before", "not_after", "fingerprint_sha256",
                            "created_at", "updated_at"]
        # (org, name) uniqueness is checked by the service: DRF's validator would make `org` required.
        validators: list = []

    def get_warnings(self, cert: Certificate) -> list[str]:
        return expiry_warnings(cert.not_after)

    def validate_org(self, org: Organization) -> Organization:
        principal = self.context["request"].principal
        if not principal.is_operator and org.pk != principal.org_id:
            raise serializers.ValidationError("You can only upload certificates for your own organization.")
        return org


class AppliedQuerySerializer(serializers.Serializer):
    revision = serializers.IntegerField(min_value=0)
    timeout = serializers.FloatField(required=False, default=0.0, min_value=0.0)


class AppliedNodeSerializer(serializers.Serializer):
    fleet = serializers.CharField()
    node = serializers.CharField()
    status = serializers.CharField()
    applied_revision = serializers.IntegerField(allow_null=True, help_text="Fleet config revision the node runs.")
    lb_revision = serializers.IntegerField(help_text="The LB revision that config covers.")
    done = serializers.BooleanField()


class HealthServerSerializer(serializers.Serializer):
    backend = serializers.CharField()
    server = serializers.CharField()
    status = serializers.CharField(help_text="HAProxy's status: UP, DOWN, MAINT, 'UP 1/3'…")
    check = serializers.CharField(allow_blank=True, help_text="last check_status")
    weight = serializers.IntegerField(allow_null=True)
    rate = serializers.IntegerField(allow_null=True, help_text="sessions/s")


class NodeHealthSummarySerializer(serializers.Serializer):
    reachable = serializers.BooleanField()
    error = serializers.CharField(required=False, help_text="why the node could not be read (unreachable only)")
    servers = HealthServerSerializer(many=True, required=False)


class FleetHealthSerializer(serializers.Serializer):
    """GET /fleets/{id}/health/: the hot copy of `show stat` per node, keyed by node name."""

    collected_at = serializers.DateTimeField(allow_null=True, help_text="null: read from the database rows")
    nodes = serializers.DictField(child=NodeHealthSummarySerializer())


class AppliedSerializer(serializers.Serializer):
    """Answer of GET /load-balancers/{id}/applied/: 200 when applied everywhere, 202 with node state otherwise."""

    load_balancer = serializers.IntegerField()
    revision = serializers.IntegerField()
    current_revision = serializers.IntegerField()
    applied = serializers.BooleanField()
    nodes = AppliedNodeSerializer(many=True)


class RouteTestQuerySerializer(serializers.Serializer):
    # What a client could send: a Host header value (name, optional port) and a path (query allowed).
    host = serializers.RegexField(r"^[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?$", max_length=260)
    path = serializers.RegexField(r"^/[\x21-\x7e]*$", max_length=2048)
    method = serializers.RegexField(r"^[A-Z]{1,16}$", required=False, default="GET")


class VipHolderSerializer(serializers.Serializer):
    node = serializers.CharField()
    status = serializers.CharField(help_text="The node's status in Spillway (up, down, drifted…).")


class FleetVipSerializer(serializers.Serializer):
    fleet = serializers.CharField(source="fleet.name")
    region = serializers.CharField()
    state = serializers.CharField(help_text='"ok" (one holder), "no holder" or "split brain".')
    holders = serializers.SerializerMethodField()
    unreachable = serializers.ListField(child=serializers.CharField(),
                                        help_text="VRRP nodes that could not be asked who holds the VIP.")

    def get_holders(self, row) -> list[dict[str, str]]:
        return [{"node": name, "status": status} for name, status in row.holders]


class ListenerVipSerializer(serializers.Serializer):
    """GET /listeners/{id}/vip/: which node holds the listener's static IP now, read from the nodes."""

    listener = serializers.IntegerField()
    address = serializers.CharField(allow_null=True)
    fleets = FleetVipSerializer(many=True)
