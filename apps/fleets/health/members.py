"""Members' live health as the fleet's nodes see it: up/down/drain per member, its check result, sessions
still open (the number a drain waits on) and when its state last changed.

Read from NodeHealth (each node's `show stat`, refreshed by the health collection): a member is the server
named after it in its pool's backend for its region (`p<pool>_<region>`, see fleets.render.chain), on every
enabled node of the fleets serving the pool's LB. One query for any number of members.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from apps.balancers.models import Member
from apps.fleets.models import NodeHealth

FAILED_PREFIXES = ("L4", "L6", "L7TOUT", "L7RSP", "L7STS", "SOCKERR")


@dataclass
class MemberHealth:
    state: str  # up, down, drain, maint, unknown (no node reports it yet)
    nodes_up: int
    nodes_total: int
    nodes_in_state: int  # nodes whose own report says `state` (what "drain on 3/4 nodes" counts)
    check: str  # the worst check result seen ("L7STS/503", "L4CON"), "" when every check passes
    sessions: int  # open on all nodes together
    changed_at: datetime | None  # the most recent state change on any node

    @property
    def label(self) -> str:
        if self.state == "unknown":
            return "no report yet"
        if self.state in ("drain", "maint"):
            return f"{self.state}: {self.sessions} session{'s' if self.sessions != 1 else ''} open"
        return (f"{self.state} on {self.nodes_in_state}/{self.nodes_total} nodes" if self.nodes_total > 1
                else self.state)


def _failing(check: str) -> bool:
    return check.removeprefix("* ").startswith(FAILED_PREFIXES)


def member_health(members: Iterable[Member]) -> dict[int, MemberHealth]:
    """{member id: MemberHealth}. Members need `region` loaded (select_related) to be matched."""
    members = list(members)
    by_key = {(f"p{m.pool_id}_{m.region.slug}", m.name): m for m in members if m.region_id is not None}
    if not by_key:
        return {}
    proxies = {proxy for proxy, _ in by_key}
    query = Q(pk__in=[])
    for proxy in proxies:  # the plain backend and its tcp twin
        query |= Q(proxy=proxy) | Q(proxy=f"{proxy}_tcp")
    rows: dict[int, list[tuple[str, str, int | None, datetime | None]]] = {}
    for proxy, server, status, check, sessions, changed in (
            NodeHealth.objects.filter(query, node__enabled=True, server__in={name for _, name in by_key})
            .values_list("proxy", "server", "status", "check_status", "sessions", "changed_at")):
        member = by_key.get((proxy.removesuffix("_tcp"), server))
        if member is not None:
            rows.setdefault(member.pk, []).append((status, check, sessions, changed))
    out = {}
    for member in members:
        seen = rows.get(member.pk, [])
        up = sum(1 for status, *_ in seen if status.startswith("UP") or status == "no check")
        draining = sum(1 for status, *_ in seen if status.startswith(("DRAIN", "NOLB")))
        in_maint = sum(1 for status, *_ in seen if status.startswith("MAINT"))
        down = sum(1 for status, *_ in seen if status.startswith("DOWN"))
        drain, maint = draining > 0, in_maint > 0
        if member.admin_state == Member.AdminState.DRAIN or drain:
            state = "drain"
        elif member.admin_state == Member.AdminState.MAINT or maint:
            state = "maint"
        elif not seen:
            state = "unknown"
        else:
            state = "up" if up * 2 > len(seen) else "down"
        failing = [check for _, check, *_ in seen if _failing(check)]
        changes = [changed for *_, changed in seen if changed is not None]
        in_state = {"up": up, "down": down, "drain": draining, "maint": in_maint}.get(state, 0)
        out[member.pk] = MemberHealth(
            state=state, nodes_up=up, nodes_total=len(seen), nodes_in_state=in_state,
            check=(failing[0].removeprefix("* ") if failing else ""),
            sessions=sum(sessions or 0 for _, _, sessions, _ in seen), changed_at=max(changes) if changes else None)
    return out
