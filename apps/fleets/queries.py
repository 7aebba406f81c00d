"""Reads for fleets: the FleetSnapshot a fleet must serve, node specs, what each node applied."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Final

from django.conf import settings
from django.db import connection
from django.db.models import Q, QuerySet
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
from apps.core.prepared import ID_LIST_PROBES, TIME_PROBES, PreparedQuery
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
    ChallengeAnswer,
    ConfigRevision,
    Fleet,
    Node,
    NodeHealth,
    Rollout,
    revision_deferred,
)
from apps.fleets.node.transports import NodeConn
from apps.traffic.overflow import NO_STEERING, PlanInputError
from apps.traffic.selectors import pool_capacities_many, pool_steerings
from apps.traffic.shares import static_steps

# `show stat` rows that summarise a proxy rather than describe one server.
SUMMARY_ROWS: Final = ("FRONTEND", "BACKEND")


def fleet_lbs(fleet: Fleet | int) -> QuerySet[LoadBalancer]:
    """HAProxy LBs the fleet (or fleet id) serves: its FK LBs and those listed in `serves`."""
    return (
        LoadBalancer.objects.filter(Q(fleet=fleet) | Q(serving_fleets=fleet), kind=LoadBalancer.Kind.HAPROXY)
        .distinct()
        .order_by("name")
    )


def fleet_binds_one_address(fleet: Fleet) -> bool:
    """Does some node bind every listener on its own bind_address (loopback demo/test fleets)?"""
    return fleet.nodes.filter(bind_address__isnull=False).exists()


def lb_fleets(lb: LoadBalancer) -> QuerySet[Fleet]:
    return _fleets_serving(lb.pk, lb.fleet_id)


def _fleets_serving(lb_id: int, fleet_id: int | None) -> QuerySet[Fleet]:
    return Fleet.objects.filter(Q(pk=fleet_id) | Q(serves=lb_id)).distinct().order_by("name")


def fleet_ids_for_lb(lb_id: int) -> list[int]:
    """lb_fleets' ids for an HAProxy LB (none for a cloud LB or a missing one), in one query: it runs after every
    route write's commit."""
    # Two subqueries, not an OR across the two relations: joined, each fleet's LBs-by-`fleet` times its `serves` were
    # built and thrown away (462 ms for a fleet of 1,500 LBs it also serves, against 2 ms). Written as SQL: the ORM
    # took ~2 ms to compile the same statement, which PostgreSQL plans and runs in ~0.15 ms, after every route write.
    with connection.cursor() as cursor:
        cursor.execute(_FLEET_IDS_FOR_LB, {"lb": lb_id, "kind": LoadBalancer.Kind.HAPROXY.value})
        return [pk for (pk,) in cursor.fetchall()]


# The fleets serving an HAProxy LB (%(lb)s, %(kind)s): also the subquery of rollouts.lb_fleets_mark_changed.
FLEET_IDS_FOR_LB_SUBQUERY = (
    f"SELECT lb.fleet_id FROM {LoadBalancer._meta.db_table} lb WHERE lb.id = %(lb)s AND lb.kind = %(kind)s"  # noqa: S608 (table names from the models)
    f" UNION SELECT s.fleet_id FROM {Fleet.serves.through._meta.db_table} s"
    f" JOIN {LoadBalancer._meta.db_table} lb ON lb.id = s.loadbalancer_id"
    " WHERE s.loadbalancer_id = %(lb)s AND lb.kind = %(kind)s"
)
_FLEET_IDS_FOR_LB = (
    f"SELECT f.id FROM {Fleet._meta.db_table} f WHERE f.id IN ({FLEET_IDS_FOR_LB_SUBQUERY}) ORDER BY f.name"  # noqa: S608
)


def enabled_nodes(fleet: Fleet | int) -> QuerySet[Node]:
    return (Node.objects.filter(fleet=fleet, enabled=True).select_related("applied_revision")
            .defer(*revision_deferred("applied_revision")).order_by("name"))


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


_ROUTE_COLUMNS = ("pk", "lb_id", "priority", "hosts", "path_match", "path", "redirect_url")
_TARGET_COLUMNS = ("route_id", "pool_id", "weight")
# A route change's few routes (the lane, on every change): compiled once (apps.core.prepared).
_ROUTES_OF = PreparedQuery(lambda ids: Route.objects.filter(pk__any=ids).values_list(*_ROUTE_COLUMNS),
                           {"ids": ID_LIST_PROBES})
_TARGETS_OF = PreparedQuery(lambda ids: RouteTarget.objects.filter(route_id__any=ids).order_by("route_id", "pool_id")
                            .values_list(*_TARGET_COLUMNS), {"ids": ID_LIST_PROBES})


def route_specs(routes: QuerySet[Route], targets: QuerySet[RouteTarget]) -> Iterator[tuple[int, RouteSpec]]:
    """(LB id, RouteSpec) of each route, in the queryset's order; `targets` must cover their targets.

    Plain rows, not model instances and a prefetch: at 100k routes building 200k model objects (and an
    IN list of 100k ids for the targets) was most of a snapshot's time.
    """
    return _specs(routes.values_list(*_ROUTE_COLUMNS),
                  targets.order_by("route_id", "pool_id").values_list(*_TARGET_COLUMNS))


def route_specs_of(ids: list[int]) -> Iterator[tuple[int, RouteSpec]]:
    """(LB id, RouteSpec) of the routes of these ids that exist."""
    return _specs(_ROUTES_OF.all(ids=ids), _TARGETS_OF.all(ids=ids))


def _specs(rows: Iterable[tuple], target_rows: Iterable[tuple[int, int, int]]) -> Iterator[tuple[int, RouteSpec]]:
    by_route: dict[int, list[RouteTargetSpec]] = defaultdict(list)
    for route_id, pool_id, weight in target_rows:
        by_route[route_id].append(RouteTargetSpec(pool_id=pool_id, weight=weight))
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
    steerings = pool_steerings(pools)
    pool_regions: dict[int, list[PoolRegion]] = defaultdict(list)
    for pr in PoolRegion.objects.filter(pool_id__in=[p.pk for p in pools]).select_related("region"):
        pool_regions[pr.pool_id].append(pr)

    pool_specs = []
    for pool in pools:
        by_region: dict[str, list[MemberSpec]] = defaultdict(list)
        for m in members[pool.pk]:
            by_region[m.region.slug].append(
                MemberSpec(name=m.name, address=m.address, port=m.port, weight=m.weight,
                           admin_state=m.admin_state, id=m.pk)  # type: ignore[arg-type]
            )
        rows = {pr.region.slug: pr for pr in pool_regions[pool.pk]}
        region_slugs = sorted(set(by_region) | set(rows))
        # One capacity model for planner, what-if and configs (traffic: health-aware, GCP semantics).
        capacities = pool_caps.get(pool.pk)
        per_region = dict(nodes_per_region.get(pool.lb_id, {}))
        per_region[region] = max(1, per_region.get(region, 0))  # a fleet without nodes yet still renders
        try:
            steps = (static_steps(capacities, region, distances, pool.overflow_policy, per_region,
                                  steerings.get(pool.pk, NO_STEERING))
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
            sticky=pool.session_affinity == "cookie",
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


_LATEST_REVISION_PK = PreparedQuery(  # read under the fleet's lock on a route change's path (routelane)
    lambda fleet_id: ConfigRevision.objects.filter(fleet_id=fleet_id).order_by("-number")
    .values_list("pk", flat=True)[:1], {"fleet_id": (1, 2)})


def latest_revision_pk(fleet: Fleet) -> int | None:
    return _LATEST_REVISION_PK.first(fleet_id=fleet.pk)


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


def _lb_nodes(lb_id: int, fleet_id: int | None) -> QuerySet:
    return (Node.objects.filter(fleet__in=_fleets_serving(lb_id, fleet_id), enabled=True)
            .order_by("fleet__name", "name")
            .values_list("fleet__name", "name", "status", "applied_revision__number", "applied_revision_id"))


# Read by every `applied` long-poll every few hundred milliseconds, and when a rollout finishes: compiled once. An LB
# without a fleet of its own (None: `IS NULL` in SQL) runs through the ORM.
_LB_NODES = PreparedQuery(_lb_nodes, {"lb_id": (1, 2), "fleet_id": (3, 4)})
_LB_REVISIONS_OF = PreparedQuery(
    lambda ids: ConfigRevision.objects.filter(pk__any=ids).order_by().values_list("pk", "lb_revisions"),
    {"ids": ID_LIST_PROBES})


def lb_applied_state(lb: LoadBalancer, revision: int,
                     known: Iterable[ConfigRevision] = ()) -> tuple[bool, list[dict[str, Any]]]:
    """(every enabled node of every fleet serving `lb` serves LB revision >= `revision`, per node). `known`: fleet
    revisions the caller holds with their lb_revisions (a finished rollout's own), not read again."""
    # Only the few columns it answers with: a revision row at 100k routes carries megabytes of text and
    # snapshot, and a long-poll asks this every few hundred milliseconds for every node. Each applied revision's LB
    # revisions are read once, not once per node: a fleet serving 10,000 LBs holds 10,000 entries in every revision,
    # and decoding them on every node's row took 157 ms a call at 67 nodes and 473 ms at 200 (bench-applied-state).
    nodes = _LB_NODES.all(lb_id=lb.pk, fleet_id=lb.fleet_id)
    key = str(lb.pk)
    covers = {held.pk: int((held.lb_revisions or {}).get(key, 0)) for held in known}
    unread = sorted({revision_id for *_, revision_id in nodes if revision_id is not None} - covers.keys())
    covers.update((pk, int((lb_revisions or {}).get(key, 0)))
                  for pk, lb_revisions in (_LB_REVISIONS_OF.all(ids=unread) if unread else ()))
    states = []
    for fleet_name, name, node_status, number, revision_id in nodes:
        covered = covers.get(revision_id, 0) if number is not None else 0
        states.append({
            "fleet": fleet_name, "node": name, "status": node_status,
            "applied_revision": number, "lb_revision": covered, "done": covered >= revision,
        })
    return bool(states) and all(s["done"] for s in states), states


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


_OPEN_CHALLENGES = PreparedQuery(  # read by every rollout: compiled once
    lambda now: ChallengeAnswer.objects.filter(expires_at__gt=now).values_list("token", "key_authorization"),
    {"now": TIME_PROBES})


def challenge_answers() -> tuple[tuple[str, str], ...]:
    """The HTTP-01 answers every node must serve now: (token, key authorization) of open orders."""
    return tuple(_OPEN_CHALLENGES.all(now=timezone.now()))


def node_regions() -> dict[str, str]:
    """{"fleet/node": region slug} of every node: the name a node gives itself in its request log."""
    return {Node.label(fleet, node): region for fleet, node, region in
            Node.objects.values_list("fleet__name", "name", "fleet__region__slug")}
