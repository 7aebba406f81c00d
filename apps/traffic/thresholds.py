"""Per-node overflow chains: the limits `fleets/render.py` writes into each HAProxy node.

A node enforces overflow with one rule per step, nearest region first::

    use_backend pool_<region> if { nbsrv(pool_<region>) gt 0 } { be_sess_rate(pool_<region>) lt N }

falling through to the next step (HAPROXY.md, "Per-region overflow in the config").

Share rule. `be_sess_rate` is the rate *this node* sends to the backend; nodes share no
counters. So N is per node, and a region's capacity must be divided among every node that
may send to it: N = floor(capacity / S), where S counts the nodes of every fleet region
whose chain contains that region (under waterfall, normally every node of every fleet;
under isolation, only the region's own nodes). Then even when every node sends its full
share, no region receives more than its capacity. The price: a node stops serving locally
at its share even if the other nodes are idle, so overflow starts earlier than the
planner's GCP-style global view would show. Enforcing "local first" exactly would need a
cluster-wide counter, which HAProxy 2.6 does not aggregate across peers. Floor, not round:
rounding up would let the sum of shares exceed the capacity.

Chain rules:
- Regions with zero capacity (drained, no healthy member, max rate 0) are skipped.
- A region with unlimited capacity gets N = None, and nothing after it is reachable, so
  the chain ends there.
- A step whose share floors to 0 can never match (`lt 0`), so it is left out.
- The last step gets None ("absorb": when every region is at its share the farthest
  reachable region takes the rest, overloaded, rather than the request failing; the
  planner reports that load as `unserved`). With ``overload="shed"`` the last step keeps
  its share and the renderer answers traffic past the chain with an error instead.
- Isolation: a single step, the fleet's own region (no fallback), or no step at all when
  that region has no capacity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final, Literal

from apps.traffic.overflow import (
    ISOLATION,
    NO_STEERING,
    POLICIES,
    Distances,
    PlanInputError,
    Policy,
    RegionCapacity,
    Steering,
    capacity_by_region,
    region_order,
)

Overload = Literal["absorb", "shed"]
OVERLOAD_MODES: Final = ("absorb", "shed")

Step = tuple[str, int | None]  # (region, rate_limit_per_node req/s; None = no limit)


def region_chain(
    fleet_region: str, capacities: Mapping[str, float], distances: Distances, policy: Policy,
    steering: Steering = NO_STEERING,
) -> list[str]:
    """Regions a node of `fleet_region` may send to, in the order it uses them (no limits yet).

    Every policy but isolation walks the same chain (steering tier, then nearest first); the spray
    policies differ in the limits and the absorb weights the enforcement loop sets on it."""
    if policy not in POLICIES:
        raise PlanInputError("invalid_policy", f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    capacities = steering.effective(capacities)
    if policy == ISOLATION:
        return [fleet_region] if capacities.get(fleet_region, 0.0) > 0 else []
    chain: list[str] = []
    for region in region_order(fleet_region, capacities, distances, steering):
        capacity = capacities[region]
        if capacity <= 0:
            continue
        chain.append(region)
        if math.isinf(capacity):
            break
    return chain


def node_chain(
    pool_capacities: Iterable[RegionCapacity],
    fleet_region: str,
    distances: Distances,
    policy: Policy,
    nodes_per_region: Mapping[str, int],
    *,
    overload: Overload = "absorb",
) -> list[Step]:
    """The overflow chain one node of `fleet_region` uses for one pool (module docstring)."""
    if overload not in OVERLOAD_MODES:
        raise PlanInputError("invalid_overload", f"overload must be absorb or shed, got {overload!r}")
    for region, count in nodes_per_region.items():
        if isinstance(count, bool) or count < 0:
            raise PlanInputError("invalid_nodes", f"{region}: node count must be an integer >= 0")
    if nodes_per_region.get(fleet_region, 0) < 1:
        raise PlanInputError(
            "unknown_fleet_region",
            f"nodes_per_region has no node in {fleet_region}, the asking node's region",
        )
    capacities = capacity_by_region(pool_capacities)

    senders: dict[str, int] = {}
    for region, count in nodes_per_region.items():
        if count == 0:
            continue
        for target in region_chain(region, capacities, distances, policy):
            senders[target] = senders.get(target, 0) + count

    steps: list[Step] = []
    for region in region_chain(fleet_region, capacities, distances, policy):
        capacity = capacities[region]
        steps.append((region, None if math.isinf(capacity) else _floor_share(capacity, senders[region])))
    if steps and overload == "absorb":
        steps[-1] = (steps[-1][0], None)
    return [(region, limit) for region, limit in steps if limit != 0]


def _floor_share(capacity: float, senders: int) -> int:
    # 10 members x 7 req/s x scaler 0.7 is 48.99999999999999 in floats; people mean 49.
    share = capacity / senders
    return math.floor(share + 1e-9 * max(1.0, share))
