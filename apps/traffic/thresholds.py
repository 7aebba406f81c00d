"""The order a node of one region walks a pool's regions: its overflow chain.

A node enforces overflow with one rule per step, nearest region first::

    use_backend pool_<region> if { nbsrv(pool_<region>) gt 0 } { be_sess_rate(pool_<region>) lt N }

falling through to the next step (HAPROXY.md, "Per-region overflow in the config"). This module decides the
steps' order; the N of each step, per node, is apps.traffic.shares' (static shares, or the planner's split of the
observed demand), which the enforcement loop writes into the nodes' maps.

Chain rules:
- Regions with zero capacity (drained, no healthy member, max rate 0) are skipped.
- A region with unlimited capacity ends the chain: nothing after it is reachable.
- Isolation: a single step, the fleet's own region (no fallback), or no step at all when that region has no
  capacity.
- The spray policies walk the same chain as waterfall; they differ in the limits and absorb weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from apps.traffic.overflow import (
    ISOLATION,
    NO_STEERING,
    POLICIES,
    Distances,
    PlanInputError,
    Policy,
    Steering,
    region_order,
)

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
