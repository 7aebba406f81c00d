"""Per-region overflow planner: where each region's traffic is served, the way GCP does it.

Pure: plain dataclasses in, plain data out, no Django. Used by the what-if preview and
the dashboard; `thresholds.py` turns the same model into per-node HAProxy limits.

Semantics (``waterfall``, the default, after GCP's "waterfall by region"):

1. Every origin region serves its own demand locally first, up to its capacity.
2. The excess spills to the nearest other region with spare capacity, then the next
   nearest, until it is served or every region is full; what is left is ``unserved``.

Several origins can overflow into the same region at once. They share its spare capacity
in *distance rounds*: all pending claims are processed in increasing RTT from the claiming
origin, so a region's spare capacity goes first to the origins nearest to it (that keeps
the served traffic's latency lowest, which is what overflow to "the nearest region" is
for). Claims at the same RTT are made simultaneously; when they ask for more than the
region has left, each gets a share proportional to its claim and the region is full.
Each origin walks its own `region_order` one region at a time, so it never skips a
nearer region that still has room.

``isolation`` serves every region's demand only locally; the rest is unserved.

``spray_to_world`` (GCP's SPRAY_TO_WORLD) spreads every origin's demand over every region in
proportion to its capacity, nearest or not: with total demand D under total capacity C, region r
serves D * C_r / C, whatever the ingress. Past C each region serves its capacity and the rest is
unserved, shared by the origins in proportion to their demand.

``spray_to_region`` serves an origin's demand in its own region first, like waterfall, and spreads
the excess over every other region in proportion to its *spare* capacity rather than filling the
nearest one first (GCP's SPRAY_TO_REGION spreads a region's traffic over its zones; Spillway has
no zones below a region, a region's members are one backend balanced by weight, so the spreading
happens one level up: over the regions that take the overflow). Several origins' excess competing
for the same spare capacity get shares in proportion to their claims.

Steering (`Steering`, every policy): regions are used tier by tier. A region below its failover
threshold (`failed_over`) is a last resort: every origin, its own included, uses it only when the
healthy regions are full. Preferred regions (`preferred`, in priority order) come before the rest:
an origin uses a non-preferred region, even its own, only when the preferred ones are full. Inside
a tier, waterfall walks by distance. A region under auto capacity drain (`drained`) serves nothing.
A traffic dial d (0..1, AWS Global Accelerator's) lets a region accept d of its own arriving
traffic and run at no more than d of its capacity (under spray to world, where no region is an
origin's own, only the latter); the rest is served elsewhere as if the region were full.
The decisions that change with health (which regions are failed over or drained, with hysteresis)
are `traffic.steering`'s; the planner takes them as given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

Policy = Literal["waterfall", "isolation", "spray_to_region", "spray_to_world"]
WATERFALL: Final = "waterfall"
ISOLATION: Final = "isolation"
SPRAY_TO_REGION: Final = "spray_to_region"
SPRAY_TO_WORLD: Final = "spray_to_world"
POLICIES: Final = (WATERFALL, ISOLATION, SPRAY_TO_REGION, SPRAY_TO_WORLD)
SPRAY_POLICIES: Final = (SPRAY_TO_REGION, SPRAY_TO_WORLD)

# GCP accepts capacity_scaler 0 (drain) or 0.1..1.0; anything else is a typo we should refuse.
MIN_CAPACITY_SCALER: Final = 0.1
# A claim exceeding spare capacity by less than this relative amount is served in full:
# splitting it would leave residues like 1e-14 req/s spilling on to farther regions.
_REL_EPS: Final = 1e-12

Distances = Mapping[tuple[str, str], float]


class PlanInputError(ValueError):
    """Invalid planner input; `code` is stable for API errors."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class RegionCapacity:
    """One pool's capacity in one region (req/s)."""

    region: str
    healthy_members: int
    max_rate_per_member: float | None  # None = unlimited
    capacity_scaler: float = 1.0

    def __post_init__(self) -> None:
        if not self.region:
            raise PlanInputError("invalid_capacity", "region must be a non-empty name")
        if isinstance(self.healthy_members, bool) or self.healthy_members < 0:
            raise PlanInputError(
                "invalid_capacity", f"{self.region}: healthy_members must be an integer >= 0"
            )
        rate = self.max_rate_per_member
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            raise PlanInputError(
                "invalid_capacity",
                f"{self.region}: max_rate_per_member must be a finite number >= 0, or None for unlimited",
            )
        scaler = self.capacity_scaler
        if not (scaler == 0 or MIN_CAPACITY_SCALER <= scaler <= 1.0):
            raise PlanInputError(
                "invalid_capacity",
                f"{self.region}: capacity_scaler must be 0 (drain) or between 0.1 and 1.0, got {scaler}",
            )

    @property
    def capacity(self) -> float:
        """healthy * max_rate * scaler req/s; inf when unlimited, 0 when drained or no healthy member."""
        if self.healthy_members == 0 or self.capacity_scaler == 0:
            return 0.0
        if self.max_rate_per_member is None:
            return math.inf
        return self.healthy_members * self.max_rate_per_member * self.capacity_scaler


@dataclass(frozen=True)
class Steering:
    """How a pool steers beyond its policy (module docstring, "Steering"). The default steers nothing."""

    preferred: tuple[str, ...] = ()  # priority regions, most preferred first
    failed_over: frozenset[str] = frozenset()  # below the failover threshold: last resort
    drained: frozenset[str] = frozenset()  # auto capacity drain: serves nothing
    dials: Mapping[str, float] = field(default_factory=dict)  # region -> share of its traffic it accepts

    def __post_init__(self) -> None:
        if len(set(self.preferred)) != len(self.preferred):
            raise PlanInputError("invalid_preferred", "preferred regions must not repeat")
        for region, dial in self.dials.items():
            if isinstance(dial, bool) or not (isinstance(dial, int | float) and 0.0 <= dial <= 1.0):
                raise PlanInputError("invalid_dial", f"{region}: traffic dial must be between 0 and 1, got {dial!r}")

    def tier(self, region: str) -> tuple[int, int]:
        """Lower is used first: healthy before failed over, then preferred ones in their order."""
        rank = self.preferred.index(region) if region in self.preferred else len(self.preferred)
        return (1 if region in self.failed_over else 0, rank)

    def dial(self, region: str) -> float:
        return float(self.dials.get(region, 1.0))

    def adding(self, *, failed_over: Iterable[str] = (), drained: Iterable[str] = ()) -> Steering:
        """This steering with more regions failed over or drained (the loop's decision, a drill's drain)."""
        return replace(self, failed_over=self.failed_over | frozenset(failed_over),
                       drained=self.drained | frozenset(drained))

    def static(self) -> Steering:
        """What a rendered config knows: the configured order and dials, not the health decisions."""
        return Steering(preferred=self.preferred, dials=self.dials)

    def effective(self, caps: Mapping[str, float]) -> dict[str, float]:
        """Capacities as the policy may use them: drained regions 0, dialled ones scaled."""
        out = {}
        for region, cap in caps.items():
            dial = 0.0 if region in self.drained else self.dial(region)
            out[region] = 0.0 if dial == 0 else cap * dial  # a test before multiplying: inf * 0 is nan
        return out


NO_STEERING: Final = Steering()


def rtt_ms(distances: Distances, from_region: str, to_region: str) -> float:
    """RTT between two regions; a region is 0 from itself, an unknown pair is infinitely far.

    RTT is symmetric on the wire, so a pair stored in one direction only serves both.
    """
    if from_region == to_region:
        return 0.0
    value = distances.get((from_region, to_region))
    if value is None:
        value = distances.get((to_region, from_region))
    if value is None:
        return math.inf
    if math.isnan(value) or value < 0:
        raise PlanInputError(
            "invalid_distance", f"rtt_ms from {from_region} to {to_region} must be >= 0, got {value}"
        )
    return float(value)


def region_order(origin: str, regions: Iterable[str], distances: Distances,
                 steering: Steering = NO_STEERING) -> list[str]:
    """`regions` in the order `origin` uses them: by steering tier, then nearest first (origin itself
    first in its tier); ties by name."""
    return sorted(set(regions), key=lambda region: (*order_key(origin, region, distances, steering), region))


def order_key(origin: str, region: str, distances: Distances,
              steering: Steering = NO_STEERING) -> tuple[int, int, float, int]:
    """Claims are served in increasing key: tier, distance, and an origin's own region before a
    neighbour at the same distance."""
    return (*steering.tier(region), rtt_ms(distances, origin, region), 0 if region == origin else 1)


@dataclass
class RegionFlow:
    """Summary of one region in a plan (all rates in req/s)."""

    region: str
    capacity: float
    demand: float  # arriving in this region
    local: float  # of that demand, served here
    out: float  # of that demand, served in other regions
    in_: float  # other regions' demand served here
    out_to: dict[str, float] = field(default_factory=dict)
    in_from: dict[str, float] = field(default_factory=dict)
    unserved: float = 0.0  # of this region's demand, served nowhere
    utilization: float = 0.0  # (local + in_) / capacity; 0 for zero or unlimited capacity

    @property
    def served(self) -> float:
        return self.local + self.in_

    @property
    def spare(self) -> float:
        return max(0.0, self.capacity - self.served)


@dataclass
class Plan:
    policy: Policy
    served: dict[str, dict[str, float]]  # origin -> region -> req/s (only positive entries)
    unserved: dict[str, float]  # origin -> req/s over capacity everywhere it may go
    flows: list[RegionFlow]  # one per region (capacity or demand), sorted by name

    def flow(self, region: str) -> RegionFlow:
        for row in self.flows:
            if row.region == region:
                return row
        raise KeyError(region)

    @property
    def total_unserved(self) -> float:
        return sum(self.unserved.values())


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise PlanInputError("invalid_policy", f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


def capacity_by_region(capacities: Iterable[RegionCapacity]) -> dict[str, float]:
    result: dict[str, float] = {}
    for entry in capacities:
        if entry.region in result:
            raise PlanInputError("duplicate_region", f"region {entry.region} is listed twice")
        result[entry.region] = entry.capacity
    return result


def plan(
    demand: Mapping[str, float],
    capacities: Iterable[RegionCapacity],
    distances: Distances,
    policy: Policy = WATERFALL,
    steering: Steering | None = None,
) -> Plan:
    """Where each origin's demand (req/s) is served. See the module docstring for the rules."""
    _check_policy(policy)
    steering = steering or NO_STEERING
    caps = capacity_by_region(capacities)
    for origin, rate in demand.items():
        if not (math.isfinite(rate) and rate >= 0):
            raise PlanInputError("invalid_demand", f"demand in {origin} must be a finite number >= 0")

    spare = steering.effective(caps)
    served: dict[str, dict[str, float]] = {origin: {} for origin in sorted(demand)}
    excess = {origin: float(demand[origin]) for origin in sorted(demand)}
    if policy == SPRAY_TO_WORLD:
        _spray(excess, spare, served, _tiers(spare, steering), exclude_origin=False)
    elif policy == WATERFALL:
        _spill(excess, spare, served, distances, steering, own_only=False, dial_of=demand)
    elif policy == ISOLATION:
        _spill(excess, spare, served, distances, steering, own_only=True, dial_of=demand)
    else:  # spray_to_region: its own region first (unless failed over: then last), the excess sprayed
        healthy = {o: r for o, r in excess.items() if o not in steering.failed_over}
        _spill(healthy, spare, served, distances, steering, own_only=True, dial_of=demand)
        excess.update(healthy)
        _spray(excess, spare, served, _tiers(spare, steering), exclude_origin=True)
        last = {o: r for o, r in excess.items() if o in steering.failed_over}
        _spill(last, spare, served, distances, steering, own_only=True, dial_of=demand)
        excess.update(last)

    unserved = {origin: max(0.0, excess[origin]) for origin in sorted(demand)}
    return Plan(policy=policy, served=served, unserved=unserved, flows=_flows(demand, caps, served, unserved))


def _tiers(spare: Mapping[str, float], steering: Steering) -> list[list[str]]:
    """Regions with capacity, grouped by steering tier, best tier first."""
    groups: dict[tuple[int, int], list[str]] = {}
    for region in sorted(spare):
        if spare[region] > 0:
            groups.setdefault(steering.tier(region), []).append(region)
    return [groups[key] for key in sorted(groups)]


def _spill(
    excess: dict[str, float],
    spare: dict[str, float],
    served: dict[str, dict[str, float]],
    distances: Distances,
    steering: Steering,
    *,
    own_only: bool,
    dial_of: Mapping[str, float] | None = None,
) -> None:
    """Distance rounds (module docstring): mutates excess, spare and served in place. An origin's claim
    on its own region stays within its dial. With `own_only`, each origin claims only its own region."""
    queues: dict[str, list[str]] = {}
    for origin, rest in excess.items():
        if rest <= 0:
            continue
        if own_only:
            queues[origin] = [origin] if spare.get(origin, 0.0) > 0 else []
        else:
            queues[origin] = [r for r in region_order(origin, spare, distances, steering) if spare[r] > 0]
    position = dict.fromkeys(queues, 0)
    # An origin's claim on its own region stays within its dial of its whole demand (`dial_of`).
    base = dial_of if dial_of is not None else excess
    local_allow = {o: max(0.0, base[o] * steering.dial(o) - served[o].get(o, 0.0)) for o in queues}
    while True:
        pending: list[tuple[tuple[int, int, float, int], str, str]] = []
        for origin, queue in queues.items():
            # Regions already full cannot take anything; step past them now.
            while position[origin] < len(queue) and spare[queue[position[origin]]] <= 0:
                position[origin] += 1
            if excess[origin] > 0 and position[origin] < len(queue):
                region = queue[position[origin]]
                pending.append((order_key(origin, region, distances, steering), origin, region))
        if not pending:
            return
        nearest = min(key for key, _, _ in pending)
        claims: dict[str, list[str]] = {}
        for key, origin, region in pending:
            if key == nearest:
                claims.setdefault(region, []).append(origin)
        for region, origins in sorted(claims.items()):
            asks = {o: min(excess[o], local_allow[o]) if o == region else excess[o] for o in origins}
            _grant(region, asks, excess, spare, served)
            for origin in origins:
                position[origin] += 1


def _grant(region: str, asks: Mapping[str, float], excess: dict[str, float], spare: dict[str, float],
           served: dict[str, dict[str, float]]) -> None:
    """Serve the asks on `region`: in full when they fit, else each in proportion and the region is full."""
    room = spare[region]
    asked = sum(asks.values())
    if asked <= 0:
        return
    ratio = 1.0 if asked <= room * (1 + _REL_EPS) else room / asked
    for origin, ask in asks.items():
        amount = ask if ratio == 1.0 else room * (ask / asked)  # a lone claim on a full region gets it all, exactly
        if amount > 0:
            served[origin][region] = served[origin].get(region, 0.0) + amount
        whole = ratio == 1.0 and ask == excess[origin]
        excess[origin] = 0.0 if whole else max(0.0, excess[origin] - amount)
    spare[region] = max(0.0, room - asked) if ratio == 1.0 else 0.0


def _spray(
    excess: dict[str, float],
    spare: dict[str, float],
    served: dict[str, dict[str, float]],
    tiers: list[list[str]],
    *,
    exclude_origin: bool,
) -> None:
    """Spread each origin's excess over a tier's regions in proportion to their spare capacity, tier by tier.

    Each pass either serves every ask or fills at least one region, so a tier takes at most one pass
    per region (plus one)."""
    for tier in tiers:
        for _ in range(len(tier) + 1):
            asks: dict[str, dict[str, float]] = {}
            for origin, rest in excess.items():
                if rest <= 0:
                    continue
                room = {r: spare[r] for r in tier if spare[r] > 0 and not (exclude_origin and r == origin)}
                if not room:
                    continue
                unlimited = [r for r, v in room.items() if math.isinf(v)]
                weights = dict.fromkeys(unlimited, 1.0) if unlimited else room
                total = sum(weights.values())
                for region, weight in weights.items():
                    asks.setdefault(region, {})[origin] = rest * weight / total
            if not asks:
                break
            for region, by_origin in sorted(asks.items()):
                _grant(region, by_origin, excess, spare, served)
            for origin, rest in excess.items():  # float residue of a fully served origin
                if 0 < rest < 1e-9:
                    excess[origin] = 0.0


def _flows(
    demand: Mapping[str, float],
    caps: Mapping[str, float],
    served: Mapping[str, Mapping[str, float]],
    unserved: Mapping[str, float],
) -> list[RegionFlow]:
    rows: dict[str, RegionFlow] = {}
    for region in sorted(set(caps) | set(demand)):
        rows[region] = RegionFlow(
            region=region,
            capacity=caps.get(region, 0.0),
            demand=demand.get(region, 0.0),
            local=0.0,
            out=0.0,
            in_=0.0,
            unserved=unserved.get(region, 0.0),
        )
    for origin, by_region in served.items():
        for region, amount in by_region.items():
            if region == origin:
                rows[region].local += amount
                continue
            rows[origin].out += amount
            rows[origin].out_to[region] = amount
            rows[region].in_ += amount
            rows[region].in_from[origin] = amount
    for row in rows.values():
        if 0 < row.capacity < math.inf:
            row.utilization = row.served / row.capacity
    return list(rows.values())
