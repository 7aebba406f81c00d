"""Per-node shares of each region's capacity: the limits every HAProxy node enforces for a pool.

`be_sess_rate`-style counters are per node (HAProxy 2.6 does not aggregate them across peers), so a
region's capacity C_r must be divided among the nodes that may send to it. A static division by
every sender (the rule before this module) serves only C_r / S from any one node, which
under skewed ingress starts overflow at a fraction of the capacity and overloads the neighbour.

Two rules, both keeping sum(limits of region r over all nodes) <= C_r:

- `static_limits`, the safe default when observations are stale or missing: C_r is split evenly
  among r's *own* nodes (floor(C_r / n_r)); other regions' nodes get 0 for r (they reach r only
  through the overload pass, see `absorb`). A region without nodes of its own is split among every
  node whose chain reaches it.
- `planned_limits`, from the demand observed on each node about every second: the planner
  (`overflow.plan`, GCP's global view) decides how much of region s's demand each region r serves;
  each node of s gets a part of every such flow proportional to its own demand; what is left of C_r
  goes to r's own nodes (proportional to their demand, evenly when they have none), or to the nodes
  that reach r when r has no node of its own. So the enforced split is the planner's split,
  whatever the ingress skew.
- `reserve_idle`, applied by the enforcement loop on top of `planned_limits`: a region's own node
  with (almost) no demand keeps its static share, so ingress moving onto it is served in its region
  at once. Only idle nodes hold more than their planned share, so under sustained demand the sum
  over the nodes that carry it still stays within capacity.

Steering (`overflow.Steering`): the chains follow the pool's configured order (preferred regions
first: what the rendered maps hold), the plan follows every decision (failed-over and drained regions
too), so a failed-over region is skipped by its limits, not by reordering a node's chain at run time.
Under the spray policies the leftover capacity is not handed to anyone's first step (that would be
waterfall again): limits are the planned shares, and what arrives past them is spread by the overload
pass in proportion to `absorb_weights` (capacity under spray to world, spare capacity of the other
regions under spray to region). A `shed` pool gets REMOTE_HEADROOM over its planned shares instead,
since past its limits it answers 503.

Limits are integers (req/s per node, floored). None = unlimited (unlimited capacity).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from apps.traffic.overflow import (
    NO_STEERING,
    SPRAY_POLICIES,
    SPRAY_TO_REGION,
    SPRAY_TO_WORLD,
    Distances,
    Plan,
    Policy,
    RegionCapacity,
    Steering,
    capacity_by_region,
    plan,
)
from apps.traffic.thresholds import region_chain

Limits = dict[str, dict[str, int | None]]  # node -> target region -> req/s (None = unlimited)

REMOTE_HEADROOM = 0.1  # of a node's planned overflow to a region, granted from that region's spare
IDLE_FRACTION = 0.05  # of its static share: a node of a region seeing less demand than this is idle


def _floor(value: float) -> int:
    # 10 members x 7 req/s x scaler 0.7 is 48.99999999999999 in floats; people mean 49.
    return max(0, math.floor(value + 1e-9 * max(1.0, value)))


def _chains(raw: Mapping[str, float], node_regions: Mapping[str, str], distances: Distances, policy: Policy,
            steering: Steering) -> dict[str, list[str]]:
    """{region: the chain its nodes walk}: the configured order (what the rendered maps hold), not the
    health decisions (those act through the limits and weights)."""
    return {region: region_chain(region, raw, distances, policy, steering.static())
            for region in set(node_regions.values())}


def _spread(amount: float, weights: Mapping[str, float]) -> dict[str, float]:
    """`amount` over the keys of `weights` in proportion (evenly when every weight is 0)."""
    if not weights:
        return {}
    total = sum(weights.values())
    if total <= 0:
        return {key: amount / len(weights) for key in weights}
    return {key: amount * w / total for key, w in weights.items()}


def static_limits(
    capacities: Iterable[RegionCapacity], node_regions: Mapping[str, str], distances: Distances, policy: Policy,
    steering: Steering = NO_STEERING,
) -> Limits:
    raw = capacity_by_region(capacities)
    chains = _chains(raw, node_regions, distances, policy, steering)
    caps = steering.effective(raw)
    own: dict[str, list[str]] = {}
    for node, region in node_regions.items():
        own.setdefault(region, []).append(node)
    reaching: dict[str, int] = {}
    for region in node_regions.values():
        for target in chains[region]:
            reaching[target] = reaching.get(target, 0) + 1
    limits: Limits = {}
    for node, region in node_regions.items():
        row: dict[str, int | None] = {}
        for target in chains[region]:
            cap = caps[target]
            if math.isinf(cap):
                row[target] = None
            elif own.get(target):
                row[target] = _floor(cap / len(own[target])) if target == region else 0
            else:
                row[target] = _floor(cap / reaching[target])
        limits[node] = row
    return limits


def static_steps(
    capacities: Iterable[RegionCapacity],
    fleet_region: str,
    distances: Distances,
    policy: Policy,
    nodes_per_region: Mapping[str, int],
    steering: Steering = NO_STEERING,
) -> list[tuple[str, int | None]]:
    """The chain one node of `fleet_region` renders, with its static shares (steps at 0 are kept:
    the enforcement loop raises them at run time)."""
    node_regions = {f"{region}#{i}": region for region, count in nodes_per_region.items() for i in range(count)}
    node_regions.setdefault(f"{fleet_region}#0", fleet_region)
    row = static_limits(capacities, node_regions, distances, policy, steering)[f"{fleet_region}#0"]
    return list(row.items())


def planned_limits(
    capacities: Sequence[RegionCapacity],
    node_regions: Mapping[str, str],
    demand: Mapping[str, float],
    distances: Distances,
    policy: Policy,
    steering: Steering = NO_STEERING,
    overload: str = "absorb",
) -> tuple[Limits, Plan]:
    """Limits from observed per-node demand (req/s arriving at each node for this pool), and the plan they
    enforce (for `absorb_weights`)."""
    raw = capacity_by_region(capacities)
    chains = _chains(raw, node_regions, distances, policy, steering)
    caps = steering.effective(raw)
    region_demand: dict[str, float] = {}
    for node, region in node_regions.items():
        region_demand[region] = region_demand.get(region, 0.0) + max(0.0, demand.get(node, 0.0))
    result = plan(region_demand, capacities, distances, policy, steering)
    spray = policy in SPRAY_POLICIES

    shares: dict[str, dict[str, float]] = {node: {} for node in node_regions}
    used: dict[str, float] = {}
    for origin, served in result.served.items():
        members = {n: max(0.0, demand.get(n, 0.0)) for n, r in node_regions.items() if r == origin}
        for target, rate in served.items():
            used[target] = used.get(target, 0.0) + rate
            for node, part in _spread(rate, members).items():
                shares[node][target] = shares[node].get(target, 0.0) + part

    # A region whose own demand fills (nearly) all of it: its nodes spill at the next rise in demand.
    full = {r for r in region_demand if 0 < caps.get(r, 0.0) < math.inf
            and used.get(r, 0.0) >= (1 - REMOTE_HEADROOM) * caps[r]}
    for target, cap in caps.items():
        if math.isinf(cap) or cap <= 0:
            continue
        left = max(0.0, cap - used.get(target, 0.0))
        # Headroom first for nodes already overflowing here, so a small rise in their demand is served
        # here rather than pushed down the chain until the next run; and for the nodes of a full region
        # whose next step this is, so the jitter of a demand right at capacity is served here, not shed
        # (one node at 1x of its region: 5% answered 503 while the neighbour stood idle).
        if spray:
            # No first step gets the rest (that is waterfall): the overload pass sprays what arrives past
            # the planned shares (a shed pool gets headroom on its last step instead, `_shed_headroom`).
            # Spray to region keeps its own region first: the rest of it stays with its own nodes.
            if policy != SPRAY_TO_REGION or not _own_first(target, steering):
                continue
        else:
            remote = {n: shares[n].get(target, 0.0) for n, r in node_regions.items()
                      if r != target and shares[n].get(target, 0.0) > 0}
            remote |= {n: max(0.0, demand.get(n, 0.0)) for n, r in node_regions.items()
                       if r in full and n not in remote and demand.get(n, 0.0) > 0
                       and chains[r][1:2] == [target]}
            extra = min(left, REMOTE_HEADROOM * sum(remote.values()))
            for node, part in _spread(extra, remote).items():
                shares[node][target] = shares[node].get(target, 0.0) + part
            left -= extra
            if not _own_first(target, steering):
                continue  # failed over or dialled: its own nodes get their planned share, no more
        own = {n: max(0.0, demand.get(n, 0.0)) for n, r in node_regions.items() if r == target}
        if not own:
            own = {n: max(0.0, demand.get(n, 0.0)) for n, r in node_regions.items() if target in chains[r]}
        for node, part in _spread(left, own).items():
            shares[node][target] = shares[node].get(target, 0.0) + part

    if policy == SPRAY_TO_WORLD and overload == "absorb":
        # Every request through the overload pass, which picks a region in proportion to its capacity:
        # exact whatever the ingress, and at once when ingress moves (planned shares as limits filled
        # each node's first steps past their share until the loop caught up: 5.1 s, make bench-steering).
        return {node: dict.fromkeys(chains[region], 0) for node, region in node_regions.items()}, result
    if spray and overload == "shed":
        _shed_headroom(shares, caps, chains, node_regions, steering)
    limits: Limits = {}
    for node, region in node_regions.items():
        limits[node] = {
            target: None if math.isinf(caps[target]) else _floor(shares[node].get(target, 0.0))
            for target in chains[region]
        }
    _round_to_capacity(limits, shares, caps, node_regions)
    # Float residue must never lift a region's sum over its capacity: take any excess back.
    for target, total in region_totals(limits).items():
        excess = 0 if total is None else total - _floor(caps[target])
        for row in sorted(limits.values(), key=lambda r: -(r.get(target) or 0)):
            if excess <= 0:
                break
            take = min(excess, row.get(target) or 0)
            row[target] = (row.get(target) or 0) - take
            excess -= take
    return limits, result


def _shed_headroom(shares: dict[str, dict[str, float]], caps: Mapping[str, float],
                   chains: Mapping[str, list[str]], node_regions: Mapping[str, str], steering: Steering) -> None:
    """A spraying `shed` pool answers 503 past a node's limits, so a node's jitter needs room; given on
    the last step of its chain with capacity left, the earlier steps still fill to exactly their
    planned shares (headroom on every step would fill the first ones past theirs, waterfall again)."""
    left = {t: c - sum(row.get(t, 0.0) for row in shares.values()) for t, c in caps.items() if not math.isinf(c)}
    for node, region in sorted(node_regions.items()):
        want = REMOTE_HEADROOM * sum(shares[node].values())
        for target in reversed(chains[region]):
            if want > 0 and left.get(target, 0.0) > 0 and target not in steering.failed_over:
                extra = min(want, left[target])
                shares[node][target] = shares[node].get(target, 0.0) + extra
                left[target] -= extra
                break


def _own_first(region: str, steering: Steering) -> bool:
    """A region whose own nodes may take its leftover capacity first: not failed over nor dialled down
    (both must serve their own traffic only as planned)."""
    return region not in steering.failed_over and steering.dial(region) == 1.0


def absorb_weights(policy: Policy, capacities: Sequence[RegionCapacity], node_regions: Mapping[str, str],
                   distances: Distances, result: Plan | None,
                   steering: Steering = NO_STEERING) -> dict[str, dict[str, float]]:
    """{node: {region: weight}}: how the overload pass spreads what arrives past every limit of a node.

    By capacity over the best steering tier of the node's chain that has any (a failed-over region
    takes overload only when no healthy one can); under spray to region, by the spare capacity the
    plan leaves in the other regions (the node's own region is full when its traffic gets here), by
    capacity when no region has any. Unlimited regions share evenly."""
    raw = capacity_by_region(capacities)
    chains = _chains(raw, node_regions, distances, policy, steering)
    caps = steering.effective(raw)
    spare = {f.region: max(0.0, caps.get(f.region, 0.0) - f.served) for f in result.flows} if result else {}
    served_by = {f.region for f in result.flows} if result else set()
    out: dict[str, dict[str, float]] = {}
    for node, region in node_regions.items():
        chain = chains[region]
        weights: dict[str, float] = {}
        if policy == SPRAY_TO_WORLD and result is not None:
            # Every origin is split alike: the planned split itself (preferred and failed-over tiers included).
            weights = {r: result.flow(r).served for r in chain if r in served_by}
            weights = {r: w for r, w in weights.items() if w > 0}
        elif policy == SPRAY_TO_REGION:
            weights = _best_tier({r: spare.get(r, 0.0) for r in chain if r != region}, steering)
        if not weights:
            weights = _best_tier({r: caps.get(r, 0.0) for r in chain}, steering)
        unlimited = [r for r, w in weights.items() if math.isinf(w)]
        if unlimited:
            weights = dict.fromkeys(unlimited, 1.0)
        out[node] = {r: weights.get(r, 0.0) for r in chain}
    return out


def _best_tier(weights: Mapping[str, float], steering: Steering) -> dict[str, float]:
    positive = {r: w for r, w in weights.items() if w > 0}
    if not positive:
        return {}
    best = min(steering.tier(r)[0] for r in positive)  # failed over or not; preference orders the walk only
    return {r: w for r, w in positive.items() if steering.tier(r)[0] == best}


def reserve_idle(limits: Limits, capacities: Sequence[RegionCapacity], node_regions: Mapping[str, str],
                 demand: Mapping[str, float], policy: Policy | None = None,
                 steering: Steering = NO_STEERING) -> Limits:
    """`planned_limits` with every idle node of a region keeping at least its static share of that region.

    When ingress moves onto a node that had no demand (one node -> 80/20), its own region serves what
    arrives there at once instead of after the loop has seen it (measured: ~2 s of the region's
    requests overflowing, react_s 2.1-2.4 s). The sum of limits over a region's nodes with demand still
    never exceeds its capacity; an idle node adds under IDLE_FRACTION of a share until the next run
    sees its demand and gives it a planned share (the region's other nodes then get less)."""
    if policy == "spray_to_world":
        return limits  # no region is a node's own under spray to world: nothing to reserve
    caps = steering.effective(capacity_by_region(capacities))
    own: dict[str, list[str]] = {}
    for node, region in node_regions.items():
        own.setdefault(region, []).append(node)
    for region, nodes in own.items():
        cap = caps.get(region, 0.0)
        if len(nodes) < 2 or math.isinf(cap) or cap <= 0 or not _own_first(region, steering):
            continue
        share = _floor(cap / len(nodes))
        for node in nodes:
            if region in limits[node] and max(0.0, demand.get(node, 0.0)) < IDLE_FRACTION * share:
                limits[node][region] = max(limits[node][region] or 0, share)
    return limits


def _round_to_capacity(limits: Limits, shares: Mapping[str, Mapping[str, float]],
                       caps: Mapping[str, float], node_regions: Mapping[str, str]) -> None:
    """Give back what flooring every node's share lost (largest remainders first), up to floor(capacity).

    Flooring each of n shares loses up to n-1 req/s of the region: 38.7 over 3 nodes is 12+12+12 = 36,
    so a region measured at 38.7 served 93% of it (make bench-overflow-fleet, 80/20 ingress at 1.5x).
    On a tie the region's own nodes come first: overflow keeps the headroom it was planned with."""
    for target, cap in caps.items():
        if math.isinf(cap) or cap <= 0:
            continue
        rows = [(node, row) for node, row in limits.items() if row.get(target) is not None]
        deficit = _floor(cap) - sum(row[target] or 0 for _, row in rows)
        remainders = sorted(((shares[node].get(target, 0.0) - (row[target] or 0), node, row) for node, row in rows
                             if shares[node].get(target, 0.0) > (row[target] or 0)),
                            key=lambda t: (-round(t[0], 6), node_regions[t[1]] != target, t[1]))
        for _, _, row in remainders[:max(0, deficit)]:
            row[target] = (row[target] or 0) + 1


def region_totals(limits: Limits) -> dict[str, int | None]:
    """Sum of every node's limit per target region (None when any node is unlimited)."""
    totals: dict[str, int | None] = {}
    for row in limits.values():
        for target, limit in row.items():
            if target in totals and totals[target] is None:
                continue
            totals[target] = None if limit is None else (totals.get(target) or 0) + limit
    return totals
