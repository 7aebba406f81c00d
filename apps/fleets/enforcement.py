"""The enforcement loop: every node's share of every region's capacity, set at run time.

It runs every 250 ms in the `enforcer` process (management command; beat's `fleets.enforce_task`,
every 1 s, is its fallback while none holds the lease). Each run reads, from every enabled node
serving an HAProxy LB, the per-pool demand (`show table chain_demand`: the enforcer turns the
counts into a rate that follows a change within ~0.25 s, `DemandMeter`), the backends' status
(`show stat -1 2 -1`) and the live chain maps; computes each node's limits with `traffic.shares`
(demand-proportional when every node of the LB answered, the static floor share otherwise); and
sends the entries that differ with `set map` (no reload). A reload or a hot map swap restores the
rendered static shares; the next run corrects them, since it compares with what the node serves
(`show map`), not with what it sent last.

Safety: the shares of a region never sum above its capacity over the nodes Spillway can reach that
carry demand (an idle node of the region keeps its static share, `shares.reserve_idle`). A
node that stops answering keeps the limits it was last given until it answers again or reloads;
its region's other nodes then fall back to the static shares.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from django.core.cache import cache
from django.db.models import Count

from apps.balancers.models import LoadBalancer, Member, Pool, RegionDistance
from apps.events.services import event_emit
from apps.fleets import queries
from apps.fleets.config.render.chain import (
    ABSORB_MAP,
    DEMAND_TABLE,
    LIMITS_MAP,
    RATES_TABLE,
    ROOM_MAP,
    UNLIMITED,
    USABLE_MAP,
    absorb_thresholds,
    backend_name,
)
from apps.fleets.fanout import on_this_host, parallel
from apps.fleets.models import Node
from apps.fleets.node.apply import NODE_ERRORS
from apps.fleets.node.showstat import (
    backend_usable,
    parse_backends,
    parse_show_stat,
    parse_show_table,
    parse_show_table_counts,
)
from apps.fleets.node.transports import transport_for
from apps.fleets.node.transports.base import NodeConn
from apps.traffic import steering as decisions
from apps.traffic.overflow import SPRAY_POLICIES, PlanInputError, Steering
from apps.traffic.selectors import DECISION_KEY, pool_capacities_many, pool_steerings
from apps.traffic.shares import Limits, absorb_weights, planned_limits, reserve_idle, static_limits

logger = logging.getLogger(__name__)

_SET_BATCH = 50  # `set map` commands per CLI line (`;`-separated)
_HOLD_KEY = "spillway:overflow-hold:{}"

_LEASE_KEY = "spillway:enforcer-lease"
LEASE_S = 2  # an enforcer that has not run for this long has lost its lease to a standby (or to beat)


def overflow_hold(pool_id: int, region: str, seconds: float) -> None:
    """While a capacity test measures `region` of a pool, its nodes serve it there without overflow
    (the knee must be the region's own, not the region plus its neighbours)."""
    cache.set(_HOLD_KEY.format(pool_id), region, timeout=max(1, int(seconds)))


def overflow_release(pool_id: int) -> None:
    cache.delete(_HOLD_KEY.format(pool_id))


def lease_acquire(token: str) -> bool:
    """Take or renew the enforcer's lease; False while another enforcer holds it. Two holders at once
    (a race at takeover) only set the same limits twice: every run is idempotent."""
    if cache.add(_LEASE_KEY, token, timeout=LEASE_S):
        return True
    if cache.get(_LEASE_KEY) == token:
        cache.set(_LEASE_KEY, token, timeout=LEASE_S)
        return True
    return False


def lease_release(token: str) -> None:
    if cache.get(_LEASE_KEY) == token:
        cache.delete(_LEASE_KEY)


def enforcer_running() -> bool:
    """An enforcer process holds the lease (beat's task then leaves the loop to it)."""
    return cache.get(_LEASE_KEY) is not None


def _hold(limits: Limits, node_regions: dict[str, str], region: str | None) -> Limits:
    if region is None:
        return limits
    for node, row in limits.items():
        if region in row:
            row[region] = None if node_regions[node] == region else 0
            if node_regions[node] == region:  # nothing past the held region is reachable by the chain
                for other in row:
                    if other != region:
                        row[other] = 0
    return limits


@dataclass
class NodeReading:
    node_id: int
    region: str
    reachable: bool
    demand: dict[int, float] = field(default_factory=dict)  # pool id -> req/s arriving at this node
    counts: dict[int, int] = field(default_factory=dict)  # pool id -> requests arrived (cumulative)
    at: float = 0.0  # time.monotonic() of the reading
    usable: dict[str, int] = field(default_factory=dict)  # backend -> 1 when it has a usable server
    live_limits: dict[str, str] = field(default_factory=dict)
    live_usable: dict[str, str] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # step backend -> this node's sliding rate to it
    active: dict[str, int] = field(default_factory=dict)  # backend -> usable active servers
    live_absorb: dict[str, str] = field(default_factory=dict)
    live_room: dict[str, str] = field(default_factory=dict)  # sticky pools' steps: 1 while the region has room
    error: str = ""


class DemandMeter:
    """Demand per (node, pool) from the enforcer's own readings of the demand table's cumulative counts.

    HAProxy's `http_req_rate(1s)` is a sliding rate: after a step of demand it reaches the new level
    only after a second, which the enforcement loop added to its own period before a node's share
    followed its demand (react_s 2.1-2.4 s in make bench-overflow-fleet). A short window alone follows
    steps but is noisy (0.5 s of 13 req/s is 6.5 requests: shares split by it starved nodes of a full
    region, local_fraction 0.945 in uniform 2x). So: the rate over the last `window_s` (counted exactly),
    unless the count over the last `min_span_s` or more is further from what that rate predicts than
    arrivals vary by chance (`z` standard deviations of a Poisson count); then the demand changed, and
    from then on only the readings after the change count. Without two readings far enough apart (first
    run, a counter that restarted after a reload or an expired entry) HAProxy's sliding rate is used."""

    def __init__(self, window_s: float = 1.0, min_span_s: float = 0.2, z: float = 2.5) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.z = z
        self._history: dict[tuple[int, int], list[tuple[float, int]]] = {}
        self._since: dict[tuple[int, int], float] = {}  # when the demand last changed, per key

    def observe(self, reading: NodeReading) -> None:
        """Replace the reading's demand (sliding rate) with the rate from counts where it can."""
        if not reading.reachable:
            return
        now = reading.at
        for pool_id, count in reading.counts.items():
            key = (reading.node_id, pool_id)
            samples = self._history.setdefault(key, [])
            if samples and count < samples[-1][1]:
                samples.clear()  # the entry expired or HAProxy reloaded: counting starts again
                self._since.pop(key, None)
            samples.append((now, count))
            while len(samples) > 2 and samples[1][0] <= now - self.window_s:
                samples.pop(0)
            recent = [(t, c) for t, c in samples if t <= now - self.min_span_s]
            if not recent:
                continue
            t_short, c_short = recent[-1]
            short = (count - c_short) / (now - t_short)
            since = self._since.get(key, float("-inf"))
            t_long, c_long = next((t, c) for t, c in samples if t >= since or (t, c) == recent[-1])
            long = (count - c_long) / (now - t_long) if now - t_long >= self.min_span_s else short
            if t_short - t_long >= self.min_span_s:
                # What the rate before the last span predicts for it, against what arrived in it.
                expected = (c_short - c_long) / (t_short - t_long) * (now - t_short)
                if abs((count - c_short) - expected) > self.z * math.sqrt(max(expected, 1.0)):
                    self._since[key] = t_short
                    long = short
            reading.demand[pool_id] = long
        for gone in [k for k in self._history if k[0] == reading.node_id and k[1] not in reading.counts]:
            del self._history[gone]  # no entry any more: no demand (the sliding rate says 0 too)
            self._since.pop(gone, None)


def _parse_map(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


# What the enforcer reads of a node each run, in one exchange (HAProxySocket.batch): seven connections a node, four
# times a second, were most of an idle control plane's CPU per node (bench-fleet-size).
READ_COMMANDS = (f"show table {DEMAND_TABLE}", "show stat -1 2 -1", f"show map {LIMITS_MAP}", f"show map {USABLE_MAP}",
                 f"show table {RATES_TABLE}", f"show map {ABSORB_MAP}",
                 # Loaded only with sticky pools; without, HAProxy's "Unknown map" parses as empty.
                 f"show map {ROOM_MAP}")


def read_node(node: Node, region: str, batch: Callable[[list[str]], list[str]] | None = None) -> NodeReading:
    """`batch`: each command's answer (HAProxySocket.batch); by default the node's own stats socket."""
    transport = None
    try:
        if batch is None:
            transport = transport_for(queries.node_conn(node))
            batch = transport.stats().batch
        table, stat, limits, usable_map, rates, absorb, room = batch(list(READ_COMMANDS))
        at = time.monotonic()
        demand = {int(k): v for k, v in parse_show_table(table).items() if k.isdigit()}
        counts = {int(k): v for k, v in parse_show_table_counts(table).items() if k.isdigit()}
        usable_now, active = parse_backends(stat)
        usable = {be: int(ok) for be, ok in usable_now.items()}
        return NodeReading(node.pk, region, True, demand, counts, at, usable, _parse_map(limits),
                           _parse_map(usable_map), parse_show_table(rates), active,
                           _parse_map(absorb), _parse_map(room))
    except NODE_ERRORS as exc:
        return NodeReading(node.pk, region, False, error=str(exc))
    finally:
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()  # type: ignore[attr-defined]


def lb_nodes() -> dict[int, dict[int, tuple[Node, str]]]:
    """{lb id: {node id: (node, region slug)}} for HAProxy LBs and the enabled nodes serving them."""
    out: dict[int, dict[int, tuple[Node, str]]] = defaultdict(dict)
    nodes = Node.objects.filter(enabled=True).select_related("fleet__region")
    by_id = {n.pk: n for n in nodes}
    for node_id, fk_lb, m2m_lb in nodes.values_list("pk", "fleet__load_balancers__id", "fleet__serves__id"):
        for lb_id in {fk_lb, m2m_lb} - {None}:
            node = by_id[node_id]
            out[lb_id][node_id] = (node, node.fleet.region.slug)
    kinds = dict(LoadBalancer.objects.filter(pk__in=list(out)).values_list("pk", "kind"))
    return {lb: nodes for lb, nodes in out.items() if kinds.get(lb) == LoadBalancer.Kind.HAPROXY}


class Topology:
    """lb_nodes() as the enforcer process keeps it: read again once `refresh_s` has passed. Read on every run (four a
    second) it was a tenth of the loop's CPU at 201 nodes, every node, fleet and region built again each time; a
    node added, disabled or moved is taken up within `refresh_s` (reading a node a moment longer than it serves an
    LB sets nothing it does not serve)."""

    def __init__(self, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s, self._clock = refresh_s, clock
        self._read_at = -math.inf
        self._lbs: dict[int, dict[int, tuple[Node, str]]] = {}

    def lbs(self) -> dict[int, dict[int, tuple[Node, str]]]:
        if self._clock() - self._read_at >= self.refresh_s:
            self._lbs, self._read_at = lb_nodes(), self._clock()
        return self._lbs


@dataclass
class Desired:
    limits: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))  # node -> backend -> limit
    absorb: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))  # node -> backend -> threshold
    modes: dict[int, str] = field(default_factory=dict)  # pool -> "dynamic" | "static" (| "held ...")
    room: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))  # node -> backend -> 0/1


def desired_limits(readings: dict[int, NodeReading], lbs: dict[int, dict[int, tuple[Node, str]]],
                   step_down: float | None = None, now: float | None = None) -> Desired:
    """Every node's limits and overload weights for every pool of those LBs, and each pool's mode.

    With `step_down` (the enforcer's), a dynamic limit falls in steps its node's rate can follow
    (`_step_down`) rather than at once. A pool with a failover threshold or auto drain gets its
    decision from the nodes' healthy shares (`traffic.steering`, kept between runs in the cache)."""
    distances = {(d.src.slug, d.dst.slug): d.rtt_ms for d in RegionDistance.objects.select_related("src", "dst")}
    pools = list(Pool.objects.filter(lb_id__in=list(lbs)).order_by("pk"))
    caps = pool_capacities_many(pools)
    configured = pool_steerings(pools, live=True)
    members = _member_counts([p for p in pools if p.failover_threshold is not None or p.auto_drain])
    out = Desired()
    for pool in pools:
        nodes = lbs[pool.lb_id]
        node_regions = {str(nid): region for nid, (_, region) in nodes.items()}
        fresh = all(readings[nid].reachable for nid in nodes)
        policy = pool.overflow_policy
        steering = configured[pool.pk]
        if pool.pk in members and fresh:
            steering = _decide(pool, steering, members[pool.pk], readings, list(nodes), now)
        try:
            pool_caps = caps.get(pool.pk, [])
            result = None
            if fresh:
                demand = {str(nid): readings[nid].demand.get(pool.pk, 0.0) for nid in nodes}
                limits, result = planned_limits(pool_caps, node_regions, demand, distances, policy,  # type: ignore[arg-type]
                                                steering, pool.overload)
                limits = reserve_idle(limits, pool_caps, node_regions, demand, policy, steering)  # type: ignore[arg-type]
                if step_down is not None and policy not in SPRAY_POLICIES:
                    # A failed-over or drained region is left at once, not in steps (2.3 s in bench-steering).
                    _step_down(limits, pool.pk, readings, step_down, steering.failed_over | steering.drained)
            else:
                limits = static_limits(pool_caps, node_regions, distances, policy, steering)  # type: ignore[arg-type]
            weights = absorb_weights(policy, pool_caps, node_regions, distances, result, steering)  # type: ignore[arg-type]
        except PlanInputError:
            continue
        held = cache.get(_HOLD_KEY.format(pool.pk))
        limits = _hold(limits, node_regions, held)
        out.modes[pool.pk] = ("held " if held else "") + ("dynamic" if fresh else "static")
        for nid, row in limits.items():
            for region, limit in row.items():
                out.limits[int(nid)][backend_name(pool.pk, region, "http")] = UNLIMITED if limit is None else limit
        for nid, row in weights.items():
            live = readings[int(nid)].live_absorb
            steps = [(be, w) for be, w in ((backend_name(pool.pk, r, "http"), w) for r, w in row.items())
                     if be in live]
            out.absorb[int(nid)].update(absorb_thresholds(steps))
        if pool.session_affinity == "cookie" and fresh:
            key = _OVER_KEY.format(pool.pk)
            over = cache.get(key) or {}
            room, changed, still_over = _room(pool.pk, pool_caps, steering, readings, list(nodes), over,
                                              time.time() if now is None else now)
            if still_over != over:
                cache.set(key, still_over, timeout=60)
            for nid in nodes:
                out.room[nid].update(room)
            for region, has_room in changed:
                event_emit("steering.sticky_room" if has_room else "steering.sticky_full", org=pool.org, obj=pool,
                           data={"region": region})
    return out


ROOM_FULL, ROOM_AGAIN = 1.05, 0.95  # of a region's capacity: sticky sessions leave above, may stay again below
# Over ROOM_FULL for this long before a region counts as full: at capacity, a 1 s request rate read four times a
# second jitters past 5% for a moment (clients' requests bunch), and each such moment moved sessions (CI, 2 of 25).
ROOM_SUSTAIN_S = 2.0
_OVER_KEY = "spillway:sticky-over:{}"


def _room(pool_id: int, caps: list, steering: Steering, readings: dict[int, NodeReading], node_ids: list[int],
          over_since: dict[str, float], now: float) -> tuple[dict[str, int], list[tuple[str, int]], dict[str, float]]:
    """{step backend: 1 while its region has room for the sticky sessions it holds, else 0}: a region drained,
    failed over or dialled to nothing has none at once; one serving more than ROOM_FULL x its capacity (all
    nodes' rates to it) for ROOM_SUSTAIN_S has none until it is back under ROOM_AGAIN x, so sessions do not
    leave and return in turn. `over_since` {region: when it went over} is the previous run's; the new one is
    returned with [(region, 0 or 1)] for each region whose room changed from what its nodes hold (an event each)."""
    effective = steering.effective({c.region: c.capacity for c in caps})
    out: dict[str, int] = {}
    changed: list[tuple[str, int]] = []
    still_over: dict[str, float] = {}
    for region, capacity in effective.items():
        backend = backend_name(pool_id, region, "http")
        served = sum(readings[nid].rates.get(backend, 0.0) for nid in node_ids)
        live = [readings[nid].live_room.get(backend) for nid in node_ids]
        had_room = "0" not in live
        if capacity > 0 and served > capacity * ROOM_FULL:
            still_over[region] = over_since.get(region, now)
        if region in steering.drained or region in steering.failed_over or capacity <= 0 or (
                now - still_over.get(region, now) >= ROOM_SUSTAIN_S):
            out[backend] = 0
        elif served < capacity * ROOM_AGAIN:
            out[backend] = 1
        else:
            out[backend] = int(had_room)
        if any(v is not None for v in live) and out[backend] != int(had_room):
            changed.append((region, out[backend]))
    return out, changed, still_over


def _member_counts(pools: list[Pool]) -> dict[int, dict[str, int]]:
    """{pool id: {region: configured members}} for the pools whose steering follows health."""
    counts: dict[int, dict[str, int]] = {p.pk: {} for p in pools}
    if pools:
        for pool_id, region, n in Member.objects.filter(pool__in=pools).values_list("pool_id", "region__slug").annotate(
                n=Count("pk")).values_list("pool_id", "region__slug", "n"):
            counts[pool_id][region] = n
    return counts


def _decide(pool: Pool, steering: Steering, members: dict[str, int], readings: dict[int, NodeReading],
            node_ids: list[int], now: float | None) -> Steering:
    """Failover / drain for this run: each region's healthy share is the mean over the pool's nodes of
    usable active servers / configured members; transitions are recorded as events, once each."""
    shares = {}
    for region, total in members.items():
        backend = backend_name(pool.pk, region, "http")
        seen = [readings[nid].active.get(backend) for nid in node_ids]
        seen = [v for v in seen if v is not None]
        if total and seen:
            shares[region] = min(1.0, sum(seen) / len(seen) / total)
    key = DECISION_KEY.format(pool.pk)
    previous = decisions.Decision.from_json(cache.get(key))
    decision, changes = decisions.decide(shares, pool.failover_threshold, pool.auto_drain, previous,
                                         time.time() if now is None else now)
    if decision != previous:
        cache.set(key, decision.to_json(), timeout=None)
    for change in changes:
        event_emit(f"steering.{change.action}", org=pool.org, obj=pool,
                   data={"region": change.region, "healthy_share": round(change.healthy_share, 3),
                         "failover_threshold": pool.failover_threshold, "auto_drain": pool.auto_drain})
        logger.info("pool %s: region %s %s (healthy share %.2f)", pool.pk, change.region, change.action,
                    change.healthy_share)
    # On top of what `steering` already holds (a drill's drain).
    return steering.adding(failed_over=decision.failed_over, drained=decision.drained)


def _step_down(limits: Limits, pool_id: int, readings: dict[int, NodeReading], gap: float,
               leave: Collection[str] = ()) -> None:
    """Lower a limit in steps that the node's rate can follow: to no less than its sliding rate minus
    `gap` of the distance to the new limit, per run (the rest of the way in ~1 s at the enforcer's period).

    A node's rate to a step is HAProxy's 1 s sliding rate of what it sent there. Cut far below that
    rate, the node sends nothing to the step until the rate has decayed under the new limit: when
    ingress moved from one node to three (make bench-overflow-fleet, one-node -> 80/20) the first
    node's share fell from the region's capacity to a third and it served nothing for most of a
    second (react_s 1.9 s). A little under its rate, it pauses briefly and its rate follows the limit
    down. Meanwhile the region's limits may sum above its capacity (the other nodes got their shares
    at once); an unlimited value (a capacity test's hold) drops at once."""
    for nid, row in limits.items():
        reading = readings[int(nid)]
        for region, limit in row.items():
            backend = backend_name(pool_id, region, "http")
            live = reading.live_limits.get(backend, "")
            if region in leave or limit is None or not live.isdigit() or int(live) >= UNLIMITED or limit >= int(live):
                continue
            rate = reading.rates.get(backend, 0.0)
            row[region] = max(limit, min(int(live), math.floor(rate - gap * (rate - limit))))


def _apply(node: Node, reading: NodeReading, limits: dict[str, int], absorb: dict[str, int] | None = None,
           run: Callable[[str], str] | None = None, room: dict[str, int] | None = None) -> int:
    """Send the `set map` commands that make the node's live maps what they should be; returns the count."""
    commands = [f"set map {LIMITS_MAP} {be} {value}" for be, value in sorted(limits.items())
                if be in reading.live_limits and reading.live_limits[be] != str(value)]
    commands += [f"set map {ABSORB_MAP} {be} {value}" for be, value in sorted((absorb or {}).items())
                 if be in reading.live_absorb and reading.live_absorb[be] != str(value)]
    commands += [f"set map {USABLE_MAP} {be} {value}" for be, value in sorted(reading.usable.items())
                 if be in reading.live_usable and reading.live_usable[be] != str(value)]
    commands += [f"set map {ROOM_MAP} {be} {value}" for be, value in sorted((room or {}).items())
                 if be in reading.live_room and reading.live_room[be] != str(value)]
    if not commands:
        return 0
    transport = None
    try:
        if run is None:
            transport = transport_for(queries.node_conn(node))
            run = transport.runtime
        for i in range(0, len(commands), _SET_BATCH):
            answer = run(";".join(commands[i:i + _SET_BATCH]))
            if answer.strip():
                logger.warning("node %s: set map answered %r", node.name, answer[:200])
    except NODE_ERRORS as exc:
        logger.warning("node %s: limits not set: %s", node.name, exc)
        return 0
    finally:
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()  # type: ignore[attr-defined]
    return len(commands)


def sync_usable(conn: NodeConn, *, leaving: str | None = None, backends: Collection[str] = ()) -> str | None:
    """Make a node's usable map match its backends' status now (after a runtime server change, so a
    region put in maintenance is skipped at once rather than at the loop's next run).

    With `leaving`, that server of `backends` counts as out of service already: called before it goes into
    maintenance, the chain stops choosing a region whose last available server it is before HAProxy has
    none left for it (marked only after, a request arriving in between is answered 503)."""
    transport = transport_for(conn)
    try:
        # Backends' rows, and servers' only where a server's own status is needed.
        rows = parse_show_stat(transport.runtime(f"show stat -1 {6 if backends else 2} -1"))
        usable = {row.pxname: int(backend_usable(row.status, row.raw.get("act", ""), row.raw.get("bck", "")))
                  for row in rows if row.svname == "BACKEND"}
        for be in backends:
            if not any(_available(r.status) for r in rows
                       if r.pxname == be and r.svname not in ("BACKEND", "FRONTEND", leaving)):
                usable[be] = 0
        live = _parse_map(transport.runtime(f"show map {USABLE_MAP}"))
        commands = [f"set map {USABLE_MAP} {be} {v}" for be, v in sorted(usable.items())
                    if be in live and live[be] != str(v)]
        for i in range(0, len(commands), _SET_BATCH):
            transport.runtime(";".join(commands[i:i + _SET_BATCH]))
        return None
    except NODE_ERRORS as exc:
        return str(exc)
    finally:
        with contextlib.suppress(Exception):
            transport.close()  # type: ignore[attr-defined]


def _available(status: str) -> bool:
    """A server `show stat` says takes new requests (checked and up, or unchecked and not in maintenance)."""
    return status.startswith("UP") or status == "no check"


NODE_THREADS = 8  # nodes read or set at once when they are not on this host
STEP_DOWN_GAP = 0.25  # of the distance from a node's rate to its new limit, per run of the enforcer (250 ms)


def enforce(lb_ids: Collection[int] | None = None, meter: DemandMeter | None = None,
            topology: Topology | None = None) -> dict[str, object]:
    """One run over every HAProxy LB's nodes (or those of `lb_ids`); returns what it did (for the
    task result and tests). A `meter` kept across runs (the enforcer process's) senses demand from
    counts; without one, from HAProxy's 1 s sliding rate. A `topology` kept across runs says which nodes serve
    which LB; without one, it is read now."""
    started = time.monotonic()
    lbs = topology.lbs() if topology is not None else lb_nodes()
    if lb_ids is not None:
        lbs = {lb: nodes for lb, nodes in lbs.items() if lb in lb_ids}
    nodes = {nid: pair for members in lbs.values() for nid, pair in members.items()}
    if not nodes:
        return {"nodes": 0, "sets": 0, "pools": {}}
    ids = sorted(nodes)
    local = on_this_host(node for node, _ in nodes.values())
    readings = dict(zip(ids, parallel(lambda nid: read_node(*nodes[nid]), ids, in_turn=local, threads=NODE_THREADS),
                        strict=True))
    if meter is not None:
        for reading in readings.values():
            meter.observe(reading)
    desired = desired_limits(readings, lbs, STEP_DOWN_GAP if meter is not None else None)
    reachable = [nid for nid in ids if readings[nid].reachable]
    sets = sum(parallel(lambda nid: _apply(nodes[nid][0], readings[nid], desired.limits.get(nid, {}),
                                           desired.absorb.get(nid, {}), room=desired.room.get(nid)),
                        reachable, in_turn=local, threads=NODE_THREADS))
    return {"nodes": len(ids), "unreachable": [nid for nid in ids if not readings[nid].reachable],
            "sets": sets, "pools": desired.modes, "ms": round((time.monotonic() - started) * 1000.0, 1)}
