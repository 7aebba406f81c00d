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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

Policy = Literal["waterfall", "isolation"]
WATERFALL: Final = "waterfall"
ISOLATION: Final = "isolation"
POLICIES: Final = (WATERFALL, ISOLATION)

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


def region_order(origin: str, regions: Iterable[str], distances: Distances) -> list[str]:
    """`regions` nearest to `origin` first (origin itself first when listed); ties by name."""
    unique = set(regions)
    return sorted(unique, key=lambda region: (rtt_ms(distances, origin, region), region))


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
) -> Plan:
    """Where each origin's demand (req/s) is served. See the module docstring for the rules."""
    _check_policy(policy)
    caps = capacity_by_region(capacities)
    for origin, rate in demand.items():
        if not (math.isfinite(rate) and rate >= 0):
            raise PlanInputError("invalid_demand", f"demand in {origin} must be a finite number >= 0")

    spare = dict(caps)
    served: dict[str, dict[str, float]] = {origin: {} for origin in sorted(demand)}
    excess: dict[str, float] = {}
    for origin in sorted(demand):
        local = min(demand[origin], spare.get(origin, 0.0))
        if local > 0:
            served[origin][origin] = local
            spare[origin] -= local
        excess[origin] = demand[origin] - local

    if policy == WATERFALL:
        _spill(excess, spare, served, caps, distances)

    unserved = {origin: max(0.0, excess[origin]) for origin in sorted(demand)}
    return Plan(policy=policy, served=served, unserved=unserved, flows=_flows(demand, caps, served, unserved))


def _spill(
    excess: dict[str, float],
    spare: dict[str, float],
    served: dict[str, dict[str, float]],
    caps: Mapping[str, float],
    distances: Distances,
) -> None:
    """Distance rounds (module docstring): mutates excess, spare and served in place."""
    queues = {
        origin: [region for region in region_order(origin, caps, distances) if region != origin]
        for origin, rest in excess.items()
        if rest > 0
    }
    position = dict.fromkeys(queues, 0)
    while True:
        pending: list[tuple[float, str, str]] = []
        for origin, queue in queues.items():
            # Regions already full cannot take anything; step past them now.
            while position[origin] < len(queue) and spare[queue[position[origin]]] <= 0:
                position[origin] += 1
            if excess[origin] > 0 and position[origin] < len(queue):
                region = queue[position[origin]]
                pending.append((rtt_ms(distances, origin, region), origin, region))
        if not pending:
            return
        nearest = min(rtt for rtt, _, _ in pending)
        claims: dict[str, list[str]] = {}
        for rtt, origin, region in pending:
            if rtt == nearest:
                claims.setdefault(region, []).append(origin)
        for region, origins in sorted(claims.items()):
            room = spare[region]
            asked = sum(excess[origin] for origin in origins)
            ratio = 1.0 if asked <= room * (1 + _REL_EPS) else room / asked
            for origin in origins:
                amount = excess[origin] * ratio
                if amount > 0:
                    served[origin][region] = served[origin].get(region, 0.0) + amount
                excess[origin] = 0.0 if ratio == 1.0 else excess[origin] - amount
            spare[region] = max(0.0, room - asked) if ratio == 1.0 else 0.0
            for origin in origins:
                position[origin] += 1


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
