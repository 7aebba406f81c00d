"""A load balancer's changes, and reverting one: the LB's desired state goes back, on every fleet that serves it.

A revert is a new change, not a rollback of one fleet: it writes the inverse of the change it names through the
same services (audited as `<model>.revert`, bumping the LB's revision), so every fleet serving the LB renders
and rolls it out together and no region is left on the newer state. It touches only the fields that change
set; what an operator set on the same objects after it, a member's drain or weight above all, stays as it is,
and the answer says so, by name ("kept: member web/api/us-1 drained by alice (acme)"). A change that a later
change of the same field overwrote is refused with the later change named: revert that one first.

Inverses: a create is deleted, a delete is created again from its recorded fields, an update gets the
recorded values of the fields it changed back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from apps.audit.models import AuditEvent
from apps.audit.services import AuditAction
from apps.balancers import services
from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Route
from apps.core.errors import Conflict, DomainError
from apps.core.tenancy import Action, restricted

MODELS = {"route": Route, "pool": Pool, "member": Member, "poolregion": PoolRegion, "listener": Listener}
# A member's runtime state: what operators set after a change is theirs, never undone by reverting another.
RUNTIME_FIELDS = {"member": ("admin_state", "weight")}
REVERTIBLE = ("create", "update", "delete")


@dataclass
class Reverted:
    event: AuditEvent
    done: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        text = f"Reverted {self.event.action} of {self.event.object_label} by {self.event.who}: " + "; ".join(
            self.done or ["nothing left to change"])
        if self.kept:
            text += ". Kept, set after it: " + "; ".join(self.kept)
        return text + "."


def _lb_of_snapshot(kind: str, snapshot: dict[str, Any] | None) -> int | None:
    if not snapshot:
        return None
    if kind in ("route", "pool", "listener"):
        return snapshot.get("lb")
    pool_id = snapshot.get("pool")
    return Pool.objects.filter(pk=pool_id).values_list("lb_id", flat=True).first() if pool_id else None


def lb_changes(*, lb: LoadBalancer, principal: Any, limit: int = 30) -> list[AuditEvent]:
    """The LB's recent changes the principal may see (a customer: its own org's), newest first, revertible ones
    marked (`revertible`)."""
    pool_ids = list(Pool.objects.filter(lb=lb).values_list("pk", flat=True))
    events = (restricted(AuditEvent, principal, Action.VIEW)
              .filter(object_type__in=list(MODELS))
              .order_by("-at", "-id"))
    found: list[AuditEvent] = []
    for event in events[: limit * 20]:
        snapshot = event.after or event.before or {}
        kind = event.object_type
        on_lb = (snapshot.get("lb") == lb.pk if kind in ("route", "pool", "listener")
                 else snapshot.get("pool") in pool_ids)
        if not on_lb:
            continue
        event.revertible = event.action.split(".", 1)[1] in REVERTIBLE
        event.summary = _summary(event)
        found.append(event)
        if len(found) >= limit:
            break
    return found


def _summary(event: AuditEvent) -> str:
    """What the change did, in words: created, deleted, or each field's old and new value."""
    verb = event.action.split(".", 1)[1]
    if verb in ("create", "delete"):
        return f"{verb}d"
    before, after = event.before or {}, event.after or {}
    parts = [f"{name}: {before.get(name)} → {value}" for name, value in after.items()
             if name in before and before[name] != value and name != "targets"]
    if before.get("targets") != after.get("targets") and "targets" in after:
        parts.append("targets changed")
    return "; ".join(parts) or "no field changed"


def change_revert(*, principal: Any, lb: LoadBalancer, event_id: int) -> Reverted:
    """Write the inverse of one audited change of `lb` (module doc). 404-like when the event is not one of the
    principal's changes of this LB; 409 when a later change overwrote what it set."""
    event = restricted(AuditEvent, principal, Action.VIEW).filter(pk=event_id).first()
    kind = event.object_type if event else ""
    verb = event.action.split(".", 1)[1] if event and "." in event.action else ""
    if event is None or kind not in MODELS or verb not in REVERTIBLE or _lb_of_snapshot(
            kind, event.after or event.before) != lb.pk:
        raise DomainError("not_found", "No such change of this load balancer.", status=404)
    model = MODELS[kind]
    result = Reverted(event)
    with transaction.atomic():
        obj = restricted(model, principal, Action.CHANGE).filter(pk=int(event.object_id)).first()
        if verb == "create":
            if obj is None:
                result.done.append(f"{event.object_label} is already gone")
            else:
                services.object_delete(principal=principal, obj=obj)
                result.done.append(f"deleted {kind} {obj}")
        elif verb == "delete":
            if model.objects.filter(pk=int(event.object_id)).exists():
                raise Conflict("already_there", f"{event.object_label} exists again; nothing to restore.")
            result.done.append(_recreate(principal, kind, event.before or {}))
        else:
            if obj is None:
                raise Conflict("gone", f"{event.object_label} was deleted since; restore it first.")
            _restore(principal, kind, obj, event, result)
        result.kept += _runtime_kept(lb, event, already=result.kept)
    return result


def _runtime_kept(lb: LoadBalancer, event: AuditEvent, already: list[str]) -> list[str]:
    """The drains and weights set on the LB's members after `event`, which the revert left as they are."""
    members = {str(m.pk): m for m in Member.objects.filter(pool__lb=lb).select_related("pool__lb")}
    latest: dict[str, AuditEvent] = {}
    for later in AuditEvent.objects.filter(object_type="member", action="member.state", id__gt=event.id,
                                           object_id__in=list(members)).order_by("id"):
        latest[later.object_id] = later
    kept = []
    for member_id, state_event in latest.items():
        member = members[member_id]
        words = f"member {member.pool.lb.name}/{member.pool.name}/{member.name} " + (
            f"{member.admin_state}" + ("ed" if member.admin_state == "drain" else "")
            + (f", weight {member.weight}" if member.weight != 100 else "")) + f" by {state_event.who}"
        if not any(words.split(" by ")[0] in k for k in already):
            kept.append(words)
    return kept


def _later(event: AuditEvent, kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(object_type=kind, object_id=event.object_id, id__gt=event.id)
                .order_by("id"))


def _restore(principal: Any, kind: str, obj: Any, event: AuditEvent, result: Reverted) -> None:
    before, after = event.before or {}, event.after or {}
    changed = [name for name in after if name in before and before[name] != after[name]]
    later = _later(event, kind)
    data: dict[str, Any] = {}
    for name in changed:
        overwritten = next((e for e in later if (e.after or {}).get(name) != (e.before or {}).get(name)
                            and name in (e.after or {})), None)
        if overwritten is not None and name in RUNTIME_FIELDS.get(kind, ()):
            result.kept.append(f"{kind} {obj} {name} {(overwritten.after or {}).get(name)} set by {overwritten.who}")
            continue
        if overwritten is not None:
            raise Conflict("changed_later", f"{name} of {kind} {obj} was changed again by {overwritten.who} at "
                           f"{overwritten.at:%Y-%m-%d %H:%M:%S}; revert that change first.")
        data[name] = before[name]
    if not data:
        return
    if kind == "route":
        targets = before.get("targets") if "targets" in changed else None
        payload = _route_payload(data, targets)
        services.route_save(principal=principal, route=obj, data=payload)
    else:
        services.object_save(principal=principal, obj=obj, action="revert", data=_fields(obj, data))
    result.done.append(f"{kind} {obj}: " + ", ".join(f"{k} back to {v}" for k, v in sorted(data.items())))


def _fields(obj: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Snapshot values (a foreign key as its id) as model field values."""
    out = {}
    for name, value in data.items():
        model_field = obj._meta.get_field(name)
        out[model_field.attname if model_field.is_relation else name] = value
    return out


def _route_payload(data: dict[str, Any], targets: list[dict[str, Any]] | None) -> dict[str, Any]:
    payload = {k: v for k, v in data.items() if k != "targets"}
    if targets is not None:
        pools = {p.pk: p for p in Pool.objects.filter(pk__in=[t["pool"] for t in targets])}
        missing = [t["pool"] for t in targets if t["pool"] not in pools]
        if missing:
            raise Conflict("gone", "A pool the route sent traffic to was deleted since; restore it first.")
        payload["targets"] = [{"pool": pools[t["pool"]], "weight": t["weight"]} for t in targets]
    for key in ("lb", "org"):
        payload.pop(key, None)  # a route's LB and org are fixed
    return payload


def _recreate(principal: Any, kind: str, before: dict[str, Any]) -> str:
    model = MODELS[kind]
    fields = {k: v for k, v in before.items() if k not in ("id", "targets")}
    if kind == "route":
        route = Route(lb_id=fields.pop("lb"), org_id=fields.pop("org"))
        services.route_save(principal=principal, route=route,
                            data=_route_payload(fields, before.get("targets") or []))
        return f"restored route {route}"
    obj = model()
    services.object_save(principal=principal, obj=obj, action=AuditAction.CREATE, data=_fields(obj, fields))
    return f"restored {kind} {obj}"
