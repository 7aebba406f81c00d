"""Events the fleet machinery emits (apps.events): rollouts, change applied, drift, node and member health.

Called from the engine at the points where the state is recorded; everything here only reads and
calls `event_emit`, which never raises, so a rollout cannot fail because of an event.
"""

from __future__ import annotations

from apps.balancers.models import LoadBalancer, Member
from apps.core.prepared import ID_LIST_PROBES, PreparedQuery
from apps.events.models import Event
from apps.events.services import event_emit
from apps.fleets import queries
from apps.fleets.models import REVISION_BULK_FIELDS, ConfigRevision, Node, NodeHealth, Rollout
from apps.traffic.observe import parse_backend

# What a customer's LB event says of a failed rollout (the words of its rollout page): the error itself names
# the operator's nodes and addresses and may quote other tenants' config lines.
CUSTOMER_ROLLOUT_ERROR = "The rollout failed; an operator can see the details."
CUSTOMER_CANARY_REASON = ("errors or latency rose on the first node that took it; the other nodes never saw it and "
                          "that node serves the earlier config again")
CUSTOMER_CANARY_KEPT = ("errors or latency rose on the first node that took it; the other nodes never saw it, and an "
                        "operator puts that node back")
_IS_CACHED = {name: Rollout._meta.get_field(name).is_cached for name in ("revision", "fleet")}


# Read when every rollout finishes (a route change's path): compiled once (apps.core.prepared).
_LB_REVISIONS_BEFORE = PreparedQuery(
    lambda fleet_id, number: ConfigRevision.objects.filter(fleet_id=fleet_id, number__lt=number)
    .order_by("-number").values_list("lb_revisions", flat=True)[:1], {"fleet_id": (1, 2), "number": (3, 4)})
_LBS_WITH_ORG = PreparedQuery(lambda lb_ids: LoadBalancer.objects.filter(pk__any=lb_ids).select_related("org"),
                              {"lb_ids": ID_LIST_PROBES})
_APPLIED_EVENT = PreparedQuery(  # said once per LB revision
    lambda lb_id, revision: Event.objects.filter(type="change.applied", object_type="loadbalancer", object_id=lb_id,
                                                 data__revision=revision).values_list("pk", flat=True)[:1],
    {"lb_id": ("1", "2"), "revision": (3, 4)})


def changed_lbs(revision: ConfigRevision) -> dict[int, int]:
    """{lb id: LB revision} of the LBs this fleet revision changed against the one before it."""
    before = _LB_REVISIONS_BEFORE.first(fleet_id=revision.fleet_id, number=revision.number) or {}
    return {int(k): int(v) for k, v in (revision.lb_revisions or {}).items() if before.get(k) != v}


def rollout_finished(rollout: Rollout, status: str, error: str = "") -> None:
    if _IS_CACHED["revision"](rollout) and _IS_CACHED["fleet"](rollout):  # the engine's rollout has both loaded
        revision, fleet = rollout.revision, rollout.fleet
    else:
        # Its number and coverage only: the text and snapshot are megabytes at 100k routes.
        revision = (ConfigRevision.objects.select_related("fleet").defer(*REVISION_BULK_FIELDS)
                    .filter(pk=rollout.revision_id).first())
        if revision is None:
            return
        fleet = revision.fleet
    changed = changed_lbs(revision)
    lbs = _LBS_WITH_ORG.all(lb_ids=list(changed)) if changed else []
    if status == Rollout.Status.FAILED:
        data = {"rollout": rollout.pk, "revision": revision.number, "error": error[:300], "fleet": fleet.name}
        event_emit("rollout.failed", obj=fleet, data=data)
        for lb in lbs:
            error_for_owner = data["error"] if lb.org.is_operator else CUSTOMER_ROLLOUT_ERROR
            event_emit("rollout.failed", org=lb.org, obj=lb,
                       data={**data, "revision": changed[lb.pk], "error": error_for_owner})
    elif status == Rollout.Status.SUCCEEDED:
        if rollout.kind == Rollout.Kind.ROLLBACK:  # undoing one rollout, or back to any earlier revision
            event_emit("rollout.rolled_back", obj=fleet, data={
                "rollout": rollout.rollback_of_id or rollout.pk, "revision": revision.number,
                "from_revision": rollout.from_revision, "fleet": fleet.name})
            for lb in lbs:  # each LB the rollback changed hears it too, in its owner's words
                event_emit("rollout.rolled_back", org=lb.org, obj=lb, data={
                    "rollout": rollout.rollback_of_id or rollout.pk, "revision": changed[lb.pk],
                    "fleet": fleet.name})
        for lb in lbs:
            lb_revision = changed[lb.pk]
            done, _ = queries.lb_applied_state(lb, lb_revision, known=(revision,))
            if done and not _APPLIED_EVENT.first(lb_id=str(lb.pk), revision=lb_revision):
                event_emit("change.applied", org=lb.org, obj=lb, data={"revision": lb_revision, "fleet": fleet.name})


def canary_failed(rollout: Rollout, node: Node, reason: str, *, restored: bool = True) -> None:
    """A watched canary tripped a guard: the operator hears the figures; each changed LB's owner hears that its
    change was stopped before it reached the other nodes (the node is the operator's, the reason may name it)."""
    revision = ConfigRevision.objects.defer(*REVISION_BULK_FIELDS).select_related("fleet").get(pk=rollout.revision_id)
    fleet = revision.fleet
    data = {"rollout": rollout.pk, "revision": revision.number, "node": node.name, "reason": reason[:300],
            "fleet": fleet.name}
    event_emit("rollout.canary_failed", obj=fleet, data=data)
    changed = changed_lbs(revision)
    for lb in _LBS_WITH_ORG.all(lb_ids=list(changed)) if changed else []:
        customer = CUSTOMER_CANARY_REASON if restored else CUSTOMER_CANARY_KEPT
        reason_for_owner = data["reason"] if lb.org.is_operator else customer
        event_emit("rollout.canary_failed", org=lb.org, obj=lb,
                   data={**data, "revision": changed[lb.pk], "node": "", "reason": reason_for_owner})


def node_status_changed(node: Node, old: str, new: str, detail: str = "") -> None:
    """Drift found/repaired and up/down transitions; the operator's (nodes are its machinery)."""
    if old == new:
        return
    data = {"status": new, "previous": old, "detail": detail[:300], "fleet_id": node.fleet_id}
    if new == Node.Status.DRIFTED:
        event_emit("drift.found", obj=node, data=data)
    elif old == Node.Status.DRIFTED and new == Node.Status.UP:
        event_emit("drift.repaired", obj=node, data=data)
    if Node.Status.DOWN in (old, new) and old != Node.Status.UNKNOWN:
        event_emit("node.health_changed", obj=node, data=data)


def drift_repaired_live(node: Node, lines: list[str]) -> None:
    """A drift put back through the runtime API within one check: found and repaired, both said."""
    detail = "; ".join(lines)[:300]
    event_emit("drift.found", obj=node, data={"status": "drifted", "detail": detail, "fleet_id": node.fleet_id,
                                             "repair": "runtime API (no reload)"})
    event_emit("drift.repaired", obj=node, data={"status": node.status, "detail": detail,
                                                 "fleet_id": node.fleet_id, "repair": "runtime API (no reload)"})


def _health_class(status: str | None) -> str | None:
    if not status:
        return None
    if status.startswith("UP") or status == "no check":
        return "up"
    return "down" if status.startswith("DOWN") else None  # MAINT, DRAIN, NOLB: an admin's choice, not health


def member_health_before(nodes: list[Node]) -> dict[tuple[int, str, str], str]:
    """The stored per-node server statuses, read before a health collection overwrites them (columns: every server
    row of every node was built as a model, a tenth of a collection's CPU)."""
    return {(node_id, proxy, server): status for node_id, proxy, server, status in NodeHealth.objects.filter(
        node__in=nodes, proxy__startswith="p").exclude(server__in=queries.SUMMARY_ROWS)
        .values_list("node_id", "proxy", "server", "status")}


def member_health_changed(before: dict[tuple[int, str, str], str], rows: list[NodeHealth]) -> None:
    """member.health_changed once per member whose up/down state any node saw change (the pool's org)."""
    changed: dict[tuple[int, str], str] = {}
    for row in rows:
        ref = parse_backend(row.proxy)  # a pool's backend per region (apps.fleets.config.render.chain)
        if ref is None or row.server in queries.SUMMARY_ROWS:
            continue
        old, new = _health_class(before.get((row.node_id, row.proxy, row.server))), _health_class(row.status)
        if old and new and old != new:
            changed[(ref.pool_id, row.server)] = new
    for (pool_id, name), status in sorted(changed.items()):
        member = Member.objects.select_related("pool__org").filter(pool_id=pool_id, name=name).first()
        if member is not None:
            event_emit("member.health_changed", org=member.pool.org, obj=member,
                       object_repr=f"{member.pool.name}/{member.name}", data={"status": status})

