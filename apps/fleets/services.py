"""Fleets' facade for writes: what other apps, the API, the pages and the tasks call.

Fleet and node settings, serving an LB, runtime member changes and ACME answers are written here; the
render pipeline (config/), rollouts and the reconcile loop (rollout/) and health collection (health/) keep
their own modules and are re-exported here. Nothing inside fleets imports this module.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import string
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.balancers.models import LoadBalancer, Member
from apps.core import crypto
from apps.core.errors import DomainError
from apps.fleets import queries
from apps.fleets.config.certificates import certificate_save
from apps.fleets.config.render import backend_name
from apps.fleets.config.render.frontends import ACME_CHALLENGE_MAP
from apps.fleets.config.revisions import fleet_render
from apps.fleets.enforcement import enforce, overflow_hold, overflow_release, sync_usable
from apps.fleets.health.collect import fleet_health_collect
from apps.fleets.models import ChallengeAnswer, Fleet, Node, Rollout
from apps.fleets.node.outside_rollout import set_map_entries, set_server
from apps.fleets.node.transports.base import NodeConn
from apps.fleets.rollout.canary import MIN_P99_REQUESTS as CANARY_MIN_P99_REQUESTS
from apps.fleets.rollout.canary import MIN_REQUESTS as CANARY_MIN_REQUESTS
from apps.fleets.rollout.canary import Verdict as CanaryVerdict
from apps.fleets.rollout.canary import Watch as CanaryWatch
from apps.fleets.rollout.canary import register as canary_judge_register
from apps.fleets.rollout.drift import fleet_converge, fleet_drift_check, fleet_drift_report
from apps.fleets.rollout.reconcile import fleet_reconcile, fleet_reconcile_now
from apps.fleets.rollout.restore import confirm as fleet_restore_confirm
from apps.fleets.rollout.rollouts import (
    NODE_SPEC_FIELDS,
    fleet_capacity_follow,
    fleet_mark_changed,
    fleet_push,
    fleet_rollback,
    fleets_mark_changed,
    fleets_mark_changed_after_commit,
    fleets_sharing,
    lb_fleets_mark_changed,
    node_refresh,
    request_reconcile,
    rollout_create,
    rollout_rollback,
    vrrp_refresh,
)
from apps.fleets.rollout.settle import fleet_settle
from apps.fleets.rollout.shards import start_keepers as shard_keepers_start
from apps.fleets.rollout.shards import stop_keepers as shard_keepers_stop

logger = logging.getLogger(__name__)

RUNTIME_THREADS = 16



# --- runtime changes ---------------------------------------------------------------------------------


def member_runtime_apply(*, member_id: int) -> dict[str, str | None]:
    """Send a member's admin state and weight to every node serving its pool, all at once.

    The desired state is already in the database (balancers wrote it), so the next render agrees;
    the transport dumps runtime state to the server-state file before each reload, so it survives.
    Returns {"fleet/node": error or None}.
    """
    member = Member.objects.select_related("pool__lb", "region").filter(pk=member_id).first()
    if member is None:
        return {}
    backends = [backend_name(member.pool_id, member.region.slug, proto) for proto in ("http", "tcp")]
    nodes = list(Node.objects.filter(fleet__in=queries.lb_fleets(member.pool.lb), enabled=True)
                 .select_related("fleet"))
    if not nodes:
        return {}
    conns = [(f"{n.fleet.name}/{n.name}", queries.node_conn(n)) for n in nodes]

    def apply(conn: NodeConn) -> str | None:
        if member.admin_state == Member.AdminState.MAINT:
            sync_usable(conn, leaving=member.name, backends=backends)  # a failure is mended by the call after
        return set_server(conn, backends, member.name, member.admin_state, member.weight)

    with ThreadPoolExecutor(max_workers=min(RUNTIME_THREADS, len(conns))) as pool:
        futures = {key: pool.submit(apply, conn) for key, conn in conns}
        results = {key: future.result() for key, future in futures.items()}
        # A region whose last member left service is skipped by the chain at once (enforce.py).
        list(pool.map(sync_usable, [conn for key, conn in conns if not results[key]]))
    for key, error in results.items():
        if error:
            logger.warning("runtime change of member %s on %s failed: %s", member.pk, key, error)
    return results


CHALLENGE_TTL_S = 3600.0  # an answer outlives any order (ACME_TIMEOUT_S): only a killed worker's stays


def acme_challenges_set(*, add: dict[str, str], remove: list[str] = ()) -> dict[str, str | None]:  # type: ignore[assignment]
    """Publish (token -> key authorization) and withdraw HTTP-01 answers on every enabled node of
    every fleet, at once, through the runtime API (no revision, no reload).

    Every node, not only those of fleets whose LBs route the hostname: DNS may send the CA to any of
    them, and a key authorization is public by design (the CA fetches it over plain HTTP).
    Stored first (ChallengeAnswer): a node reloading after that, by whichever worker, takes them again
    (node/apply.apply_node). Returns {"fleet/node": error or None}.
    """
    if remove:
        ChallengeAnswer.objects.filter(token__in=list(remove)).delete()
    if add:
        expires = timezone.now() + dt.timedelta(seconds=CHALLENGE_TTL_S)
        ChallengeAnswer.objects.bulk_create(
            [ChallengeAnswer(token=token, key_authorization=value, expires_at=expires) for token, value in add.items()],
            update_conflicts=True, unique_fields=["token"], update_fields=["key_authorization", "expires_at"])
    nodes = list(Node.objects.filter(enabled=True).select_related("fleet"))
    if not nodes:
        return {}
    conns = [(f"{n.fleet.name}/{n.name}", queries.node_conn(n)) for n in nodes]
    with ThreadPoolExecutor(max_workers=min(RUNTIME_THREADS, len(conns))) as pool:
        futures = {key: pool.submit(set_map_entries, conn, ACME_CHALLENGE_MAP, add, list(remove))
                   for key, conn in conns}
        return {key: future.result() for key, future in futures.items()}


def challenge_answers_expire() -> int:
    """Forget answers whose order was left open (its worker killed): past their expiry no reload or
    drift repair puts them back. The nodes drop them at their next reload. Returns how many."""
    deleted, _ = ChallengeAnswer.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


# --- fleets and nodes ---------------------------------------------------------------------------------


def lb_serve(*, principal: Principal, lb: LoadBalancer, fleet: Fleet, serve: bool) -> LoadBalancer:
    """Add `fleet` to the fleets serving `lb` (its region's nodes then serve it) or remove it. The LB's own fleet
    (its `fleet`) can go too: another serving fleet takes its place. Audited; both fleets re-render."""
    if not principal.is_operator:
        raise DomainError("operator_only", "Only the operator decides which fleets serve a load balancer.",
                          status=403)
    with transaction.atomic():
        lb = LoadBalancer.objects.select_for_update().get(pk=lb.pk)
        before = sorted(queries.lb_fleets(lb).values_list("name", flat=True))
        if serve:
            if lb.fleet_id is None:
                LoadBalancer.objects.filter(pk=lb.pk).update(fleet=fleet)
            elif lb.fleet_id != fleet.pk:
                fleet.serves.add(lb)
        else:
            fleet.serves.remove(lb)
            if lb.fleet_id == fleet.pk:
                heir = Fleet.objects.filter(serves=lb).order_by("name").first()
                LoadBalancer.objects.filter(pk=lb.pk).update(fleet=heir)
                if heir is not None:
                    heir.serves.remove(lb)  # the FK names it now
        lb.refresh_from_db()
        after = sorted(queries.lb_fleets(lb).values_list("name", flat=True))
        audit_record(principal=principal, org=lb.org, action="loadbalancer.serve" if serve else "loadbalancer.unserve",
                     obj=lb, before={"fleets": before}, after={"fleets": after})
        # Every fleet that served it before or does now renders again (and the fleets sharing their LBs).
        named = Fleet.objects.filter(name__in=before + after).values_list("pk", flat=True)
        fleets_mark_changed_after_commit({fleet.pk, *named})
    return lb


def new_vrrp_secret() -> str:
    """VRRPv2 PASS authentication carries at most 8 octets; letters and digits keep it config-safe."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def fleet_save(*, principal: Principal, fleet: Fleet, data: dict[str, Any]) -> Fleet:
    data = dict(data)
    serves = data.pop("serves", None)
    with transaction.atomic():
        # Fleets that shared an LB before the change count its nodes too (the share rule).
        sharing_before = fleets_sharing({fleet.pk}) if fleet.pk else set()
        before = audit_snapshot(fleet) if fleet.pk else None
        for key, value in data.items():
            setattr(fleet, key, value)
        changed = set(data)
        if not fleet.vrrp_secret_encrypted:
            fleet.vrrp_secret_encrypted = crypto.encrypt(new_vrrp_secret())
            changed.add("vrrp_secret_encrypted")
        if fleet.pk is None:
            fleet.save()
        elif changed:
            # Only what the caller set: the engine moves this row's other columns all the time (the lease, change_seq,
            # rendered_seq, desired_revision, restore_hold, reconcile_queued), and saving every column of the fleet
            # read at the start of the request put their old values back (a lease a reconciler had just claimed
            # came back free, and a second reconciler could push beside it).
            fleet.save(update_fields=sorted(changed | {"updated_at"}))
        if before and (before["vrrp_version"], before["vrrp_advert_ms"]) != (fleet.vrrp_version, fleet.vrrp_advert_ms):
            transaction.on_commit(lambda: vrrp_refresh(fleet_id=fleet.pk))
        if serves is not None:
            fleet.serves.set(serves)
        audit_record(principal=principal, org=principal.org, action="fleet.save", obj=fleet, before=before,
                     after=audit_snapshot(fleet))
        fleets_mark_changed_after_commit({fleet.pk} | sharing_before)
    return fleet


def fleet_delete(*, principal: Principal, fleet: Fleet) -> None:
    with transaction.atomic():
        sharing = fleets_sharing({fleet.pk}) - {fleet.pk}
        audit_record(principal=principal, org=principal.org, action="fleet.delete", obj=fleet,
                     before=audit_snapshot(fleet))
        fleet.delete()
        if sharing:
            fleets_mark_changed_after_commit(sharing)


# What changes a node's keepalived.conf (its own or its peers') without changing the fleet's revision
# (haproxy_bin: keepalived follows the HAProxy processes by that file's name).
VRRP_NODE_FIELDS = ("address", "bind_address", "enabled", "vrrp_interface", "drained", "name", "haproxy_bin",
                    "vrrp_process_events")


# What decides where a node's config binds and how Spillway reaches it: a change re-verifies the node.
NODE_REACH_FIELDS = ("address", "transport", "runtime_dir", "config_dir", "bind_address", "ssh_host", "ssh_port",
                     "ssh_user")


def node_save(*, principal: Principal, node: Node, data: dict[str, Any]) -> Node:
    """Create or update a node; `ssh_private_key` (PEM) is encrypted before it is stored."""
    data = dict(data)
    key = data.pop("ssh_private_key", None)
    with transaction.atomic():
        before = audit_snapshot(node) if node.pk else None
        for field_name, value in data.items():
            setattr(node, field_name, value)
        if key is not None:
            node.ssh_private_key_encrypted = crypto.encrypt(key)
        moved = before is not None and any(before[f] != getattr(node, f) for f in NODE_REACH_FIELDS)
        if moved and node.applied_revision_id is not None:
            # Its bundle (binds) or the way to reach it changed: nothing verified there holds any more.
            # Drifted + no verified hash makes the converge below re-push, reload and re-verify it.
            node.status, node.applied_sha256 = Node.Status.DRIFTED, ""
            node.status_detail = "address, port or transport changed: re-rendering and re-verifying"
        node.save()
        after = audit_snapshot(node)
        after["ssh_key_changed"] = key is not None
        if before is None or any(before[f] != after[f] for f in VRRP_NODE_FIELDS if f in before):
            transaction.on_commit(lambda: vrrp_refresh(fleet_id=node.fleet_id))
        if before is not None and any(before.get(f) != after.get(f) for f in NODE_SPEC_FIELDS) \
                and not node.vrrp_interface:  # a VRRP node is re-pushed by vrrp_refresh above
            node_id = node.pk
            transaction.on_commit(lambda: node_refresh(node_id=node_id))
        audit_record(principal=principal, org=principal.org, action="node.save", obj=node, before=before,
                     after=after)
        fleets_mark_changed_after_commit({node.fleet_id})
        if moved:
            fleet_id = node.fleet_id
            transaction.on_commit(lambda: fleet_converge(fleet=Fleet(pk=fleet_id), check_drift=False))
    return node


def node_set_service(*, principal: Principal, node: Node, state: str) -> Node:
    """drain | maintenance | in-service (frontend NodeStateView says what each does to the node).

    Maintenance drains first and waits (up to 15 s) for the node to serve the drain before it leaves the
    rollouts: a node disabled first would never be told it is drained."""
    if state == "drain":
        return node_save(principal=principal, node=node, data={"drained": True})
    if state == "in-service":
        was_enabled = node.enabled
        node = node_save(principal=principal, node=node, data={"drained": False, "enabled": True})
        if not was_enabled:  # back from maintenance: bring it onto the desired revision (drift is mended too)
            fleet_id = node.fleet_id
            transaction.on_commit(lambda: fleet_converge(fleet=Fleet(pk=fleet_id), check_drift=True))
        return node
    if state != "maintenance":
        raise DomainError("invalid_state", "A node's service state is drain, maintenance or in-service.")
    if not node.drained:
        node = node_save(principal=principal, node=node, data={"drained": True})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the refresh rollout runs in a worker (or inline in tests)
            node.refresh_from_db()
            rollouts = Rollout.objects.filter(fleet_id=node.fleet_id, status__in=Rollout.ACTIVE)
            if not rollouts.exists():
                break
            time.sleep(0.2)
    return node_save(principal=principal, node=node, data={"enabled": False})


def node_delete(*, principal: Principal, node: Node) -> None:
    with transaction.atomic():
        audit_record(principal=principal, org=principal.org, action="node.delete", obj=node,
                     before=audit_snapshot(node))
        fleet_id = node.fleet_id
        node.delete()
        fleets_mark_changed_after_commit({fleet_id})


__all__ = [
    "CANARY_MIN_P99_REQUESTS",
    "CANARY_MIN_REQUESTS",
    "CanaryVerdict",
    "CanaryWatch",
    "acme_challenges_set",
    "canary_judge_register",
    "certificate_save",
    "challenge_answers_expire",
    "enforce",
    "fleet_capacity_follow",
    "fleet_converge",
    "fleet_delete",
    "fleet_drift_check",
    "fleet_drift_report",
    "fleet_health_collect",
    "fleet_mark_changed",
    "fleet_push",
    "fleet_reconcile",
    "fleet_reconcile_now",
    "fleet_render",
    "fleet_restore_confirm",
    "fleet_rollback",
    "fleet_save",
    "fleet_settle",
    "fleets_mark_changed",
    "fleets_sharing",
    "lb_fleets_mark_changed",
    "lb_serve",
    "member_runtime_apply",
    "node_delete",
    "node_refresh",
    "node_save",
    "node_set_service",
    "overflow_hold",
    "overflow_release",
    "request_reconcile",
    "rollout_create",
    "rollout_rollback",
    "shard_keepers_start",
    "shard_keepers_stop",
    "vrrp_refresh",
]
