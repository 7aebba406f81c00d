"""Why a config revision exists, in words: the audited changes to the fleet's load balancers since the
previous revision ("route 12 created by acme:alice via API; member 7 state by ops:otto").

Read from the audit log, which every balancers service writes in the same transaction as its change,
so a revision's reason names exactly the writes committed before it was rendered.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from apps.accounts.selectors import actor_names
from apps.audit.models import AuditEvent
from apps.balancers.models import Pool
from apps.core.prepared import TIME_PROBES, PreparedQuery

# Balancers objects whose changes reach a fleet's config, and the verb for each audited action.
_TYPES = ("route", "pool", "member", "listener", "poolregion", "loadbalancer", "certificate")
_VERBS = {"create": "created", "update": "updated", "delete": "deleted", "state": "state changed"}
MAX_NAMED = 5


def _lb_of(data: dict[str, Any], pool_lbs: dict[int, int]) -> int | None:
    if "lb" in data:
        return data["lb"]
    if "pool" in data:
        return pool_lbs.get(data["pool"])
    return data.get("id") if "shared" in data else None  # a load balancer's own row


def _changes(events: QuerySet) -> QuerySet:
    return (events.filter(object_type__in=_TYPES).order_by("at")
            .values_list("object_type", "object_id", "action", "actor", "org__slug", "after", "before")[:500])


# Read for every revision (each route change's lane step): compiled once (apps.core.prepared).
_CHANGES_SINCE = PreparedQuery(lambda since: _changes(AuditEvent.objects.filter(at__gt=since)),
                               {"since": TIME_PROBES})


def change_reason(*, lb_ids: set[int], since: datetime | None) -> str:
    """The audited changes to these LBs after `since` (all of them when None), newest last."""
    # As plain rows: this runs for every revision (a route lane step of a few milliseconds otherwise), and
    # building AuditEvent and Organization objects was most of its cost.
    events = _CHANGES_SINCE.all(since=since) if since else list(_changes(AuditEvent.objects.all()))
    pools = {(after or before or {}).get("pool") for *_, after, before in events} - {None}
    pool_lbs = dict(Pool.objects.filter(pk__in=pools).values_list("pk", "lb_id")) if pools else {}
    actors = actor_names({actor for _, _, _, actor, *_ in events})
    named = []
    for object_type, object_id, action, actor, org_slug, after, before in events:
        if _lb_of(after or before or {}, pool_lbs) not in lb_ids:
            continue
        verb = _VERBS.get(action.rsplit(".", 1)[-1], action)
        who = actors.get(actor, actor)
        org = f"{org_slug}:" if org_slug is not None and ":" not in who.split(" ")[0] else ""
        named.append(f"{object_type} {object_id} {verb} by {org}{who}")
    if not named:
        return ""
    more = len(named) - MAX_NAMED
    return "; ".join(named[-MAX_NAMED:]) + (f" (and {more} earlier change(s))" if more > 0 else "")
