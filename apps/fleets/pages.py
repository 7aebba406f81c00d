"""Reads for pages: the dashboard's fleet panels and an LB's deploy panel and history (constant query counts,
bounded lists). The render pipeline's reads stay in queries.py; selectors.py re-exports both."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from django.db.models import Case, Count, F, Max, OuterRef, Q, Subquery, Value, When

from apps.accounts.principal import Principal
from apps.balancers.models import (
    LoadBalancer,
    Pool,
)
from apps.fleets.models import (
    ConfigRevision,
    Fleet,
    Node,
    NodeHealth,
    NodeResult,
    Rollout,
    fleets_visible_to,
    revision_deferred,
)
from apps.fleets.queries import SUMMARY_ROWS, lb_applied_state, lb_fleets, render_problems_for
from apps.traffic.observe import parse_backend

# --- dashboard: fleets, nodes, failing checks, rollouts (constant query count, bounded lists) -------------

# HAProxy `check_status` values of a failed last check (a leading "* " means a check is running).
FAILED_CHECKS: Final = ("L4TOUT", "L4CON", "L6TOUT", "L6RSP", "L7TOUT", "L7RSP", "L7STS", "SOCKERR",
                        "PROCERR", "PROCTOUT")
# DOWN, "DOWN 1/2" (coming back), "UP 1/3" (failing, about to go down) or a failed last check.
FAILING_Q: Final = (Q(status__startswith="DOWN") | Q(status__startswith="UP ")
                    | Q(check_status__in=FAILED_CHECKS + tuple(f"* {c}" for c in FAILED_CHECKS)))
UP_Q: Final = Q(status__startswith="UP") | Q(status="no check")


def _health_scope(principal: Principal) -> Q:
    """NodeHealth rows the principal may count: all for operators; a customer only its own pools'
    backends (a shared LB's nodes also carry other tenants' servers)."""
    if principal.is_operator:
        return Q()
    scope = Q(pk__in=[])
    for pool_id in Pool.objects.visible_to(principal).values_list("pk", flat=True):
        scope |= Q(proxy__startswith=f"p{pool_id}_")
    return scope


def fleet_overview(principal: Principal, *, fleet_limit: int = 20, node_limit: int = 48) -> dict[str, Any]:
    """Fleets with node counts by status and on-desired count, and their nodes, problems first.

    Four queries whatever the number of fleets, nodes or health rows; lists are cut at the limits
    (`more_fleets` / `more_nodes` say so).
    """
    enabled = Q(nodes__enabled=True)
    last = Rollout.objects.filter(fleet=OuterRef("pk")).order_by("-id")
    fleets = list(
        fleets_visible_to(principal).select_related("region")
        .annotate(
            node_total=Count("nodes", filter=enabled),
            node_up=Count("nodes", filter=enabled & Q(nodes__status=Node.Status.UP)),
            node_down=Count("nodes", filter=enabled & Q(nodes__status=Node.Status.DOWN)),
            node_drifted=Count("nodes", filter=enabled & Q(nodes__status=Node.Status.DRIFTED)),
            node_drained=Count("nodes", filter=Q(nodes__drained=True)),  # maintenance nodes are drained too
            node_on_desired=Count("nodes", filter=enabled & (
                Q(nodes__applied_revision__number=F("desired_revision")) | Q(desired_revision=0))),
            last_rollout_id=Subquery(last.values("pk")[:1]),
            last_rollout_status=Subquery(last.values("status")[:1]),
        )
        .annotate(problems=F("node_down") + F("node_drifted"))
        .order_by("-problems", "name")[: fleet_limit + 1]
    )
    more_fleets = len(fleets) > fleet_limit
    fleets = fleets[:fleet_limit]
    for fleet in fleets:
        fleet.node_behind = fleet.node_total - fleet.node_on_desired
    rank = Case(When(status__in=[Node.Status.DOWN, Node.Status.DRIFTED], then=Value(0)),
                When(status=Node.Status.UNKNOWN, then=Value(1)), default=Value(2))
    # A fleet with nothing rendered yet (desired revision 0) has no node behind.
    on_desired = Case(When(Q(applied_revision__number=F("fleet__desired_revision")) | Q(fleet__desired_revision=0),
                       then=Value(1)), default=Value(0))
    nodes = list(
        Node.objects.filter(fleet__in=[f.pk for f in fleets], enabled=True)
        .annotate(rank=rank, on_desired=on_desired)
        .order_by("rank", "on_desired", "fleet__name", "name")
        .values("pk", "name", "status", "status_detail", "last_seen", "fleet_id", "fleet__name", "drained",
                "fleet__desired_revision", "applied_revision__number", "on_desired")[: node_limit + 1]
    )
    more_nodes = len(nodes) > node_limit
    nodes = nodes[:node_limit]
    servers = {
        row["node_id"]: row for row in
        NodeHealth.objects.filter(_health_scope(principal), node_id__in=[n["pk"] for n in nodes])
        .exclude(server__in=SUMMARY_ROWS).values("node_id")
        .annotate(total=Count("pk"), up=Count("pk", filter=UP_Q), failing=Count("pk", filter=FAILING_Q))
    }
    for node in nodes:
        counts = servers.get(node["pk"], {})
        node["servers_total"], node["servers_up"] = counts.get("total", 0), counts.get("up", 0)
        node["servers_failing"] = counts.get("failing", 0)
    return {"fleets": fleets, "more_fleets": more_fleets, "nodes": nodes, "more_nodes": more_nodes}


def failing_checks(principal: Principal, *, limit: int = 10) -> list[dict[str, Any]]:
    """Servers whose health check fails on some node, worst first (down on the most nodes, then
    failing on the most), with the nodes that see it fail and their check results.

    Three or four queries (a customer's pool scope is one more) whatever the number of rows.
    """
    scope = _health_scope(principal)
    live = NodeHealth.objects.filter(scope, node__enabled=True).exclude(server__in=SUMMARY_ROWS)
    worst = list(
        live.filter(FAILING_Q).values("proxy", "server")
        .annotate(failing=Count("pk"), down=Count("pk", filter=Q(status__startswith="DOWN")),
                  checked_at=Max("updated_at"))
        .order_by("-down", "-failing", "proxy", "server")[:limit]
    )
    if not worst:
        return []
    pairs = Q(pk__in=[])
    for row in worst:
        pairs |= Q(proxy=row["proxy"], server=row["server"])
    seen: dict[tuple[str, str], dict[str, Any]] = {(r["proxy"], r["server"]): r | {"nodes": 0, "where": []}
                                                   for r in worst}
    for proxy, server, fleet, node, status, check in live.filter(pairs).values_list(
            "proxy", "server", "node__fleet__name", "node__name", "status", "check_status").order_by(
            "node__fleet__name", "node__name"):
        entry = seen[(proxy, server)]
        entry["nodes"] += 1
        if status.startswith(("DOWN", "UP ")) or check.removeprefix("* ") in FAILED_CHECKS:
            entry["where"].append({"node": f"{fleet}/{node}", "status": status, "check": check})
    refs = {r["proxy"]: parse_backend(r["proxy"]) for r in worst}
    pools = Pool.objects.select_related("lb").only("pk", "name", "lb__id", "lb__name").in_bulk(
        {ref.pool_id for ref in refs.values() if ref is not None})
    for row in worst:
        ref = refs[row["proxy"]]
        pool = pools.get(ref.pool_id) if ref else None
        row.update(seen[(row["proxy"], row["server"])])
        row["pool"], row["region"] = pool, ref.region if ref else ""
    return worst


def nodes_reporting(principal: Principal) -> dict[str, int]:
    """Enabled nodes the principal's fleets have, and how many are up: "every check passes" only
    means something when the nodes that report the checks answer (one query)."""
    counts = fleets_visible_to(principal).aggregate(
        total=Count("nodes", filter=Q(nodes__enabled=True)),
        up=Count("nodes", filter=Q(nodes__enabled=True, nodes__status=Node.Status.UP)))
    return counts | {"down": counts["total"] - counts["up"]}


def recent_rollouts(principal: Principal, *, limit: int = 10) -> list[Rollout]:
    """The newest rollouts the principal may see, with per-node progress, in one query."""
    finished = ~Q(results__status__in=[NodeResult.Status.PENDING, NodeResult.Status.RUNNING])
    return list(
        Rollout.objects.filter(pk__in=Rollout.objects.visible_to(principal).values("pk"))
        .select_related("fleet")
        .annotate(revision_number=F("revision__number"), node_total=Count("results"),
                  node_done=Count("results", filter=finished))
        .order_by("-id")[:limit]
    )


# --- an LB's deploy panel and history (the LB workspace) --------------------------------------------

HISTORY_ROLLOUTS = 5
HISTORY_REVISIONS = 8


@dataclass
class FleetDeploy:
    fleet: Fleet
    rollout: Rollout | None  # the fleet's newest
    current: bool  # ...and it rolls out (a revision covering) the LB's current revision
    waiting: bool  # a change is queued for a worker to render and roll out
    held: bool  # changes wait for a push (auto_rollout off)
    refused: bool  # the newest render failed validation: it will never be pushed
    nodes: list[dict[str, Any]] = field(default_factory=list)
    # Objects the fleet's desired revision left out (they could not render), the principal's own only.
    left_out: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class DeployState:
    revision: int
    fleets: list[FleetDeploy]
    done: int
    total: int

    @property
    def all_done(self) -> bool:
        return self.total > 0 and self.done == self.total

    @property
    def live(self) -> bool:
        """Keep polling: a rollout is queued or running somewhere."""
        return any(f.waiting or (f.rollout is not None and f.rollout.status in Rollout.ACTIVE)
                   for f in self.fleets)


def deploy_state(lb: LoadBalancer, fleets: list[Fleet], principal: Principal | None = None) -> DeployState:
    """Per fleet serving `lb`: the newest rollout and, per node, its part in it and whether the node
    serves the LB's current revision (an applied revision is recorded only once verified)."""
    _, nodes = lb_applied_state(lb, lb.revision)
    newest = Rollout.objects.filter(fleet__in=fleets).values("fleet_id").annotate(newest=Max("id")).values("newest")
    latest = {r.fleet_id: r for r in Rollout.objects.filter(pk__in=newest).prefetch_related("results__node")
              .select_related("revision").defer("revision__text", "revision__snapshot", "revision__diff")}
    refused = set(ConfigRevision.objects.filter(fleet__in=fleets, validation_ok=False)
                  .filter(number__gt=F("fleet__desired_revision")).values_list("fleet_id", flat=True))
    result_of = {(r.fleet_id, res.node.name): res for r in latest.values() for res in r.results.all()}
    problems = dict(ConfigRevision.objects.filter(fleet__in=fleets, number=F("fleet__desired_revision"))
                    .exclude(problems=[]).values_list("fleet_id", "problems"))
    entries = []
    for fleet in fleets:
        fleet_nodes = [n for n in nodes if n["fleet"] == fleet.name]
        rollout = latest.get(fleet.pk)
        # Until a rollout of a revision covering the LB's current one exists, the newest is an older one.
        current = rollout is not None and int(rollout.revision.lb_revisions.get(str(lb.pk), 0)) >= lb.revision
        for n in fleet_nodes:
            res = result_of.get((fleet.pk, n["node"]))
            n["rollout_status"] = res.status if res else None
        pending = any(not n["done"] for n in fleet_nodes)
        unrendered = fleet.change_seq > fleet.rendered_seq
        # `not current`: rendered, and its rollout not made yet (a reconcile commits the render, then the rollout).
        # Without it the panel read "nothing happening" in between, stopped polling, and never said done (seen
        # in a browser test under load). A refused render is never rolled out: nothing to wait for there.
        expected = fleet.reconcile_queued or unrendered or (not current and fleet.pk not in refused)
        entries.append(FleetDeploy(
            fleet=fleet, rollout=rollout, current=current, nodes=fleet_nodes,
            waiting=pending and fleet.auto_rollout and expected,
            held=not fleet.auto_rollout and unrendered,
            refused=fleet.pk in refused,
            left_out=render_problems_for(principal, problems.get(fleet.pk, [])) if principal else []))
    return DeployState(revision=lb.revision, fleets=entries, done=sum(1 for n in nodes if n["done"]),
                       total=len(nodes))


def history(fleets: list[Fleet], is_operator: bool) -> list[dict[str, Any]]:
    """Recent rollouts per fleet (rollback is on their pages) and, for operators, revisions with diffs."""
    out = []
    for fleet in fleets:
        entry: dict[str, Any] = {
            "fleet": fleet,
            "rollouts": (fleet.rollouts.select_related("revision").defer(*revision_deferred("revision"))
                         .order_by("-id")[:HISTORY_ROLLOUTS]),
        }
        if is_operator:
            entry["revisions"] = (ConfigRevision.objects.filter(fleet=fleet).order_by("-number")
                                  .only("number", "created_at", "reason", "validation_ok", "fleet_id")
                                  [:HISTORY_REVISIONS])
        out.append(entry)
    return out


def can_push(principal: Principal, lb: LoadBalancer) -> bool:
    """May `principal` push `lb`'s held changes? A push renders and rolls out whole fleets, so it carries the
    held changes of every LB those fleets serve: operators may; a customer only for its own dedicated LB on
    fleets that serve nobody else's LB."""
    if not principal.can_deploy:
        return False
    if principal.is_operator:
        return True
    if lb.org_id != principal.org_id or lb.shared:
        return False
    fleets = lb_fleets(lb)
    return not LoadBalancer.objects.filter(Q(fleet__in=fleets) | Q(serving_fleets__in=fleets)).exclude(
        org_id=principal.org_id).exists()
