"""Events the fleet machinery emits (apps.events): rollouts, change applied, drift, node health.

Called from the engine at the points where the state is recorded; everything here only reads and
calls `event_emit`, which never raises, so a rollout cannot fail because of an event.
"""

from __future__ import annotations

from apps.balancers.models import LoadBalancer
from apps.events.models import Event
from apps.events.services import event_emit
from apps.fleets import selectors
from apps.fleets.models import ConfigRevision, Node, Rollout


def _changed_lbs(revision: ConfigRevision) -> dict[int, int]:
    """{lb id: LB revision} of the LBs this fleet revision changed against the one before it."""
    before = (ConfigRevision.objects.filter(fleet_id=revision.fleet_id, number__lt=revision.number)
              .order_by("-number").values_list("lb_revisions", flat=True).first()) or {}
    return {int(k): int(v) for k, v in (revision.lb_revisions or {}).items() if before.get(k) != v}


def rollout_finished(rollout: Rollout, status: str, error: str = "") -> None:
    revision = ConfigRevision.objects.select_related("fleet").filter(pk=rollout.revision_id).first()
    if revision is None:
        return
    fleet = revision.fleet
    changed = _changed_lbs(revision)
    lbs = list(LoadBalancer.objects.filter(pk__in=changed).select_related("org")) if changed else []
    if status == Rollout.Status.FAILED:
        data = {"rollout": rollout.pk, "revision": revision.number, "error": error[:300], "fleet": fleet.name}
        event_emit("rollout.failed", obj=fleet, data=data)
        for lb in lbs:
            event_emit("rollout.failed", org=lb.org, obj=lb, data={**data, "revision": changed[lb.pk]})
    elif status == Rollout.Status.SUCCEEDED:
        if rollout.rollback_of_id:
            event_emit("rollout.rolled_back", obj=fleet, data={"rollout": rollout.rollback_of_id,
                                                               "revision": revision.number, "fleet": fleet.name})
        for lb in lbs:
            lb_revision = changed[lb.pk]
            done, _ = selectors.lb_applied_state(lb, lb_revision)
            seen = Event.objects.filter(type="change.applied", object_type="loadbalancer", object_id=str(lb.pk),
                                        data__revision=lb_revision).exists()
            if done and not seen:
                event_emit("change.applied", org=lb.org, obj=lb, data={"revision": lb_revision, "fleet": fleet.name})


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
