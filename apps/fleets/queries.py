"""Reads for fleets: the FleetSnapshot a fleet must serve, node specs, what each node applied."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from django.conf import settings
from django.db.models import Case, Count, F, Max, OuterRef, Q, QuerySet, Subquery, Value, When
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.balancers.models import (
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    RegionDistance,
    Route,
    RouteTarget,
)
from apps.core import crypto
from apps.core.snapshots import one_snapshot
from apps.fleets import caches
from apps.fleets.config.render.keepalived import node_priority
from apps.fleets.config.spec import (
    ANY_ADDRESS,
    CertSpec,
    FleetSnapshot,
    HealthCheckSpec,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    RouteSpec,
    RouteTargetSpec,
    VrrpSpec,
)
from apps.fleets.config.stored import apply_lane_delta, snapshot_from_json
from apps.fleets.models import (
    REVISION_BULK_FIELDS,
    ChallengeAnswer,
    ConfigRevision,
    Fleet,
    Node,
    NodeHealth,
    NodeResult,
    Rollout,
    fleets_visible_to,
)
from apps.fleets.node.transports import NodeConn
from apps.traffic.observe import parse_backend
from apps.traffic.overflow import PlanInputError
from apps.traffic.selectors import pool_capacities_many
from apps.traffic.shares import static_steps


def fleet_lbs(fleet: Fleet) -> QuerySet[LoadBalancer]:
    """HAProxy LBs the fleet serves: its FK LBs and those listed in `serves`."""
    return (
        LoadBalancer.objects.filter(Q(fleet=fleet) | Q(serving_fleets=fleet), kind=LoadBalancer.Kind.HAPROXY)
        .distinct()
        .order_by("name")
    )


def fleet_binds_one_address(fleet: Fleet) -> bool:
    """Does some node bind every listener on its own bind_address (loopback demo/test fleets)?"""
    return fleet.nodes.filter(bind_address__isnull=False).exists()


def lb_fleets(lb: LoadBalancer) -> QuerySet[Fleet]:
    return Fleet.objects.filter(Q(pk=lb.fleet_id) | Q(serves=lb)).distinct().order_by("name")


def fleet_ids_for_lb(lb_id: int) -> list[int]:
    lb = LoadBalancer.objects.filter(pk=lb_id).only("fleet_id", "kind").first()
    if lb is None or lb.kind != LoadBalancer.Kind.HAPROXY:
        return []
    return list(lb_fleets(lb).values_list("pk", flat=True))


def enabled_nodes(fleet: Fleet) -> QuerySet[Node]:
    return (Node.objects.filter(fleet=fleet, enabled=True).select_related("applied_revision")
            .defer(*(f"applied_revision__{f}" for f in REVISION_BULK_FIELDS)).order_by("name"))


def health_rows(since: datetime) -> Iterator[tuple[str, str, str]]:
    """(backend, server, status) of every server line enabled nodes reported since `since` (traffic.readers)."""
    return (NodeHealth.objects.filter(updated_at__gte=since, node__enabled=True, proxy__startswith="p")
            .exclude(server__in=SUMMARY_ROWS).values_list("proxy", "server", "status").iterator())


def pool_nodes(pool: Pool) -> dict[str, list[str]]:
    """{region: ["fleet/node", ...]}: enabled nodes of every fleet serving the pool's LB (traffic.readers)."""
    nodes: dict[str, list[str]] = defaultdict(list)
    for fleet in lb_fleets(pool.lb).select_related("region"):
        for node in enabled_nodes(fleet):
            nodes[fleet.region.slug].append(Node.label(fleet.name, node.name))
    return {region: sorted(names) for region, names in sorted(nodes.items())}


def _nodes_per_region(lb_ids: list[int]) -> dict[int, dict[str, int]]:
    """{lb id: {region slug: enabled nodes of every fleet serving that LB}} (the share rule's S)."""
    counts: dict[int, dict[str, int]] = {lb_id: defaultdict(int) for lb_id in lb_ids}
    seen: set[tuple[int, int]] = set()
    # One row per (node, FK LB, M2M LB) combination; `seen` counts each node once per LB.
    for node_id, region, fk_lb, m2m_lb in Node.objects.filter(enabled=True).values_list(
        "pk", "fleet__region__slug", "fleet__load_balancers__id", "fleet__serves__id"
    ):
        for lb_id in {fk_lb, m2m_lb}:
            if lb_id in counts and (node_id, lb_id) not in seen:
                seen.add((node_id, lb_id))
                counts[lb_id][region] += 1
    return counts


def _cert_spec(listener: Listener) -> CertSpec | None:
    cert = listener.certificate
    if cert is None or listener.protocol != Listener.Protocol.HTTPS:
        return None
    pem = cert.cert_pem.strip() + "\n" + crypto.decrypt(cert.key_encrypted).strip() + "\n"
    return CertSpec(name=f"cert-{cert.pk}", pem=pem.encode())


def route_specs(routes: QuerySet[Route], targets: QuerySet[RouteTarget]) -> Iterator[tuple[int, RouteSpec]]:
    """(LB id, RouteSpec) of each route, in the queryset's order; `targets` must cover their targets.

    Plain rows, not model instances and a prefetch: at 100k routes building 200k model objects (and an
    IN list of 100k ids for the targets) was most of a snapshot's time.
    """
    by_route: dict[int, list[RouteTargetSpec]] = defaultdict(list)
    for route_id, pool_id, weight in targets.order_by("route_id", "pool_id").values_list("route_id", "pool_id",
                                                                                         "weight"):
        by_route[route_id].append(RouteTargetSpec(pool_id=pool_id, weight=weight))
    rows = routes.values_list("pk", "lb_id", "priority", "hosts", "path_match", "path", "redirect_url")
    for pk, lb_id, priority, hosts, path_match, path, redirect_url in rows:
        yield lb_id, RouteSpec(id=pk, priority=priority, hosts=tuple(hosts), path_match=path_match, path=path,
                               targets=tuple(by_route.get(pk, ())), redirect_url=redirect_url or None)


def fleet_snapshot(fleet: Fleet, revision: int) -> tuple[FleetSnapshot, dict[str, int]]:
    """(what the fleet's nodes must serve, {lb id: LB revision it reflects}), read as of one moment: the LB
    revisions are exactly the state read, and no write is seen in part (a route without its targets)."""
    with one_snapshot():
        return _fleet_snapshot(fleet, revision)


def _fleet_snapshot(fleet: Fleet, revision: int) -> tuple[FleetSnapshot, dict[str, int]]:
    lbs = list(fleet_lbs(fleet))
    lb_revisions = {str(lb.pk): lb.revision for lb in lbs}
    lb_ids = [lb.pk for lb in lbs]
    region = fleet.region.slug
    distances = {
        (d.src.slug, d.dst.slug): d.rtt_ms for d in RegionDistance.objects.select_related("src", "dst")
    }
    nodes_per_region = _nodes_per_region(lb_ids)

    pools = list(Pool.objects.filter(lb_id__in=lb_ids).order_by("pk"))
    members: dict[int, list[Member]] = defaultdict(list)
    for m in Member.objects.filter(pool_id__in=[p.pk for p in pools]).select_related("region").order_by("pk"):
        members[m.pool_id].append(m)
    pool_caps = pool_capacities_many(pools)
    pool_regions: dict[int, list[PoolRegion]] = defaultdict(list)
    for pr in PoolRegion.objects.filter(pool_id__in=[p.pk for p in pools]).select_related("region"):
        pool_regions[pr.pool_id].append(pr)

    pool_specs = []
    for pool in pools:
        by_region: dict[str, list[MemberSpec]] = defaultdict(list)
        for m in members[pool.pk]:
            by_region[m.region.slug].append(
                MemberSpec(name=m.name, address=m.address, port=m.port, weight=m.weight,
                           admin_state=m.admin_state)  # type: ignore[arg-type]
            )
        rows = {pr.region.slug: pr for pr in pool_regions[pool.pk]}
        region_slugs = sorted(set(by_region) | set(rows))
        # One capacity model for planner, what-if and configs (traffic: health-aware, GCP semantics).
        capacities = pool_caps.get(pool.pk)
        per_region = dict(nodes_per_region.get(pool.lb_id, {}))
        per_region[region] = max(1, per_region.get(region, 0))  # a fleet without nodes yet still renders
        try:
            steps = (static_steps(capacities, region, distances, pool.overflow_policy, per_region)
                     if capacities is not None else [])
        except PlanInputError:
            steps = []  # bad capacity rows: fall back to health-only ordering (renderer default)
        health = None
        if pool.health_path:
            health = HealthCheckSpec(path=pool.health_path, interval_s=pool.health_interval_s,
                                     rise=pool.health_rise, fall=pool.health_fall,
                                     expected_status=pool.health_expected_status)
        pool_specs.append(PoolSpec(
            id=pool.pk, name=pool.name, algorithm=pool.algorithm,  # type: ignore[arg-type]
            health=health,
            regions=tuple(PoolRegionSpec(region=slug, members=tuple(by_region.get(slug, [])))
                          for slug in region_slugs),
            chain=tuple(RegionStep(region=r, rate_limit_per_node=limit) for r, limit in steps),
            overload=pool.overload,  # type: ignore[arg-type]
            capacities=tuple(sorted((c.region, None if math.isinf(c.capacity) else int(c.capacity))
                                    for c in capacities or ())),
        ))

    routes_by_lb: dict[int, list[RouteSpec]] = defaultdict(list)
    for lb_id, spec in route_specs(Route.objects.filter(lb_id__in=lb_ids).order_by("priority", "pk"),
                                   RouteTarget.objects.filter(route__lb_id__in=lb_ids)):
        routes_by_lb[lb_id].append(spec)

    listener_specs = []
    for ln in (Listener.objects.filter(lb_id__in=lb_ids)
               .select_related("lb", "static_ip", "certificate").order_by("lb__name", "name")):
        listener_routes = () if ln.protocol == Listener.Protocol.TCP else tuple(routes_by_lb[ln.lb_id])
        listener_specs.append(ListenerSpec(
            id=ln.pk, lb=ln.lb.name, name=ln.name, protocol=ln.protocol,  # type: ignore[arg-type]
            address=ln.static_ip.address if ln.static_ip else ANY_ADDRESS, port=ln.port,
            default_pool_id=ln.default_pool_id, routes=listener_routes, cert=_cert_spec(ln),
            no_route_status=ln.no_route_status, no_route_body=ln.no_route_body,
        ))
    snap = FleetSnapshot(fleet=fleet.name, region=region, revision=revision,
                         listeners=tuple(listener_specs), pools=tuple(pool_specs))
    return snap, lb_revisions


# The snapshots of the newest revisions this process rendered or decoded. A revision never changes, so
# the reconciler that just stored one rolls it out from the very object it rendered: decoding 100k
# routes again costs ~1 s, and the same object lets every node's render reuse the renderer's
# node-independent work (render/memo.py). Small: one 100k-route snapshot is tens of MB.
_SNAPSHOTS: OrderedDict[tuple[int, str], FleetSnapshot] = caches.register("revision_snapshots", OrderedDict())
_SNAPSHOTS_SIZE = 3
_SNAPSHOTS_LOCK = threading.Lock()


def remember_revision_snapshot(revision: ConfigRevision, snap: FleetSnapshot) -> None:
    """`snap` is what `revision.snapshot` stores (fleet_render stored it from this object)."""
    with _SNAPSHOTS_LOCK:
        _SNAPSHOTS[(revision.pk, revision.sha256)] = snap
        while len(_SNAPSHOTS) > _SNAPSHOTS_SIZE:
            _SNAPSHOTS.popitem(last=False)


def _remembered(revision: ConfigRevision) -> FleetSnapshot | None:
    key = (revision.pk, revision.sha256)
    with _SNAPSHOTS_LOCK:
        snap = _SNAPSHOTS.get(key)
        if snap is not None:
            _SNAPSHOTS.move_to_end(key)
        return snap


def revision_snapshot(revision: ConfigRevision) -> FleetSnapshot:
    """The snapshot a revision was rendered from; a route-lane revision's is its base's with its route
    changes applied, so the chain is walked back to a full (or remembered) one."""
    snap = _remembered(revision)
    if snap is not None:
        return snap
    lanes: list[ConfigRevision] = []
    current = revision
    while current.base_id is not None:
        lanes.append(current)
        current = ConfigRevision.objects.only("pk", "sha256", "base_id", "snapshot").get(pk=current.base_id)
        snap = _remembered(current)
        if snap is not None:
            break
    if snap is None:
        snap = snapshot_from_json(current.snapshot, crypto.decrypt)
    for lane in reversed(lanes):
        snap = apply_lane_delta(snap, lane.snapshot)
    remember_revision_snapshot(revision, snap)
    return snap


def reference_node(fleet: Fleet) -> NodeSpec:
    """The node a revision's stored text and central validation are rendered for: the fleet's own
    paths, no bind override, so the text does not change when nodes come and go."""
    return NodeSpec(name="reference", runtime_dir=f"/run/spillway/{fleet.name}", bind_address=None,
                    signals=signals_target(fleet), signals_tag=Node.label(fleet.name, "reference"))


def signals_target(fleet: Fleet) -> tuple[str, int] | None:
    """Where the fleet's nodes send their request log; None: nowhere. A bad value is refused by the render
    (guard.check_node), where the fleet's revision page says so."""
    raw = fleet.signals_target or settings.SIGNALS_TARGET
    if not raw:
        return None
    address, _, port = raw.rpartition(":")
    return address.strip("[]"), int(port) if port.isdigit() else -1


def node_spec(node: Node) -> NodeSpec:
    health = (node.bind_address or node.address, node.health_port) if node.health_port else None
    return NodeSpec(name=node.name, runtime_dir=node.runtime_dir, bind_address=node.bind_address or None,
                    vrrp=vrrp_spec(node), health=health, drained=node.drained,
                    signals=signals_target(node.fleet), signals_tag=str(node))


def vrrp_nodes(fleet_id: int) -> list[Node]:
    """The fleet's nodes that take part in VRRP, in priority order (first = highest)."""
    return list(Node.objects.filter(fleet_id=fleet_id, enabled=True).exclude(vrrp_interface="")
                .select_related("fleet").order_by("name"))


def vrrp_spec(node: Node) -> VrrpSpec | None:
    """How `node` takes part in VRRP: priority from its place in the fleet's node order, the other
    VRRP nodes as unicast peers, the fleet's advert interval and (VRRPv2) decrypted secret."""
    if not node.vrrp_interface or node.bind_address:
        return None
    peers = vrrp_nodes(node.fleet_id)
    names = [n.name for n in peers]
    index = names.index(node.name) if node.name in names else len(names)
    fleet = node.fleet
    secret = crypto.decrypt(fleet.vrrp_secret_encrypted) if fleet.vrrp_secret_encrypted else ""
    return VrrpSpec(
        interface=node.vrrp_interface, address=node.address, priority=node_priority(index),
        peers=tuple(n.address for n in peers if n.pk != node.pk), version=fleet.vrrp_version,
        advert_ms=fleet.vrrp_advert_ms, auth_pass=secret, drained=node.drained,
        haproxy_bin=node.haproxy_bin or settings.HAPROXY_BIN, process_events=node.vrrp_process_events,
    )


def node_conn(node: Node) -> NodeConn:
    return NodeConn(
        name=node.name,
        address=node.address,
        runtime_dir=node.runtime_dir,
        config_dir=node.config_dir,
        haproxy_bin=node.haproxy_bin or settings.HAPROXY_BIN,
        transport=node.transport,  # type: ignore[arg-type]
        ssh_host=node.ssh_host,
        ssh_port=node.ssh_port,
        ssh_user=node.ssh_user,
        ssh_private_key=crypto.decrypt(node.ssh_private_key_encrypted) if node.transport == "ssh" else "",
        ssh_known_hosts=node.ssh_known_hosts,
    )


def latest_revision(fleet: Fleet) -> ConfigRevision | None:
    # Snapshot and diff load only when read (most callers compare text and hashes; at 100k routes the
    # snapshot alone is ~15 MB of JSON to decode).
    return ConfigRevision.objects.filter(fleet=fleet).defer("snapshot", "diff").order_by("-number").first()


def latest_revision_pk(fleet: Fleet) -> int | None:
    return ConfigRevision.objects.filter(fleet=fleet).order_by("-number").values_list("pk", flat=True).first()


def text_revision(revision: ConfigRevision) -> ConfigRevision:
    """The revision whose stored text `revision` serves: itself, or for a route-lane revision (which
    stores only its route changes) the newest full revision it was built on."""
    if revision.base_id is None:
        return revision
    return (ConfigRevision.objects.filter(fleet_id=revision.fleet_id, number__lt=revision.number, base__isnull=True)
            .defer("snapshot", "diff").order_by("-number").first()) or revision


def fleet_pin(fleet: Fleet) -> dict[str, Any] | None:
    """{revision, actor, at} when the fleet was rolled back and nobody moved it forward since: its last
    deploy-or-rollback was a rollback and its changes are held (rollout.rollouts._pin). None otherwise."""
    if fleet.auto_rollout:
        return None
    last = (Rollout.objects.filter(fleet=fleet).exclude(kind=Rollout.Kind.CONVERGE)
            .select_related("revision").order_by("-id").first())
    if last is None or last.kind != Rollout.Kind.ROLLBACK or last.revision.number >= last.from_revision:
        return None
    return {"revision": last.revision.number, "actor": last.actor, "at": last.created_at}


def lb_applied_state(lb: LoadBalancer, revision: int) -> tuple[bool, list[dict[str, Any]]]:
    """(every enabled node of every fleet serving `lb` serves LB revision >= `revision`, per node)."""
    # Only the few columns it answers with: a revision row at 100k routes carries megabytes of text and
    # snapshot, and a long-poll asks this every few hundred milliseconds for every node.
    nodes = (Node.objects.filter(fleet__in=lb_fleets(lb), enabled=True).order_by("fleet__name", "name")
             .values_list("fleet__name", "name", "status", "applied_revision__number",
                          "applied_revision__lb_revisions"))
    states = []
    for fleet_name, name, node_status, number, lb_revisions in nodes:
        covered = int((lb_revisions or {}).get(str(lb.pk), 0)) if number is not None else 0
        states.append({
            "fleet": fleet_name, "node": name, "status": node_status,
            "applied_revision": number, "lb_revision": covered, "done": covered >= revision,
        })
    return bool(states) and all(s["done"] for s in states), states


# --- dashboard: fleets, nodes, failing checks, rollouts (constant query count, bounded lists) -------------

# `show stat` rows that summarise a proxy rather than describe one server.
SUMMARY_ROWS: Final = ("FRONTEND", "BACKEND")
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
        entries.append(FleetDeploy(
            fleet=fleet, rollout=rollout, current=current, nodes=fleet_nodes,
            waiting=pending and fleet.auto_rollout and (fleet.reconcile_queued or unrendered),
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
            "rollouts": fleet.rollouts.select_related("revision").order_by("-id")[:HISTORY_ROLLOUTS],
        }
        if is_operator:
            entry["revisions"] = (ConfigRevision.objects.filter(fleet=fleet).order_by("-number")
                                  .only("number", "created_at", "reason", "validation_ok", "fleet_id")
                                  [:HISTORY_REVISIONS])
        out.append(entry)
    return out


def render_problems_for(principal: Principal, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The render problems (objects left out of a revision) that `principal` owns: a customer never
    learns that another tenant's object exists, let alone that it is broken."""
    if principal.is_operator or not problems:
        return list(problems)
    ids: dict[str, set[int]] = defaultdict(set)
    for p in problems:
        ids[p["kind"]].add(p["id"])
    own = {
        "route": set(Route.objects.filter(pk__in=ids["route"], org_id=principal.org_id).values_list("pk", flat=True)),
        "pool": set(Pool.objects.filter(pk__in=ids["pool"], org_id=principal.org_id).values_list("pk", flat=True)),
        "listener": set(Listener.objects.filter(pk__in=ids["listener"], lb__org_id=principal.org_id)
                        .values_list("pk", flat=True)),
    }
    return [p for p in problems if p["id"] in own.get(p["kind"], set())]


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


def challenge_answers() -> tuple[tuple[str, str], ...]:
    """The HTTP-01 answers every node must serve now: (token, key authorization) of open orders."""
    return tuple(ChallengeAnswer.objects.filter(expires_at__gt=timezone.now())
                 .values_list("token", "key_authorization"))


def node_regions() -> dict[str, str]:
    """{"fleet/node": region slug} of every node: the name a node gives itself in its request log."""
    return {Node.label(fleet, node): region for fleet, node, region in
            Node.objects.values_list("fleet__name", "name", "fleet__region__slug")}
