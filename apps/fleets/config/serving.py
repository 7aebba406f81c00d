"""Which fleets (regions) serve a load balancer, and what adding or removing one would do to its traffic.

The what-if is said in words per pool, from the pools' capacity per region (traffic.selectors) and the
distances between regions: where requests entering the region would be served, and where they would go when
it is full or has no members. It predicts routing, not load: the overflow page shows what traffic does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.db.models import Count, Q

from apps.balancers.models import LoadBalancer, Pool, RegionDistance
from apps.fleets import queries
from apps.fleets.models import Fleet, Node
from apps.traffic.selectors import pool_capacities_many


@dataclass(frozen=True)
class ServingFleet:
    fleet: Fleet
    region: str
    nodes: int
    nodes_up: int
    primary: bool  # the LB's own `fleet`


def serving(lb: LoadBalancer) -> list[ServingFleet]:
    """The fleets serving `lb` with their enabled and up node counts (one query)."""
    enabled = Q(nodes__enabled=True)
    fleets = queries.lb_fleets(lb).select_related("region").annotate(
        node_count=Count("nodes", filter=enabled, distinct=True),
        node_up=Count("nodes", filter=enabled & Q(nodes__status=Node.Status.UP), distinct=True))
    return [ServingFleet(f, f.region.slug, f.node_count, f.node_up, f.pk == lb.fleet_id) for f in fleets]


def _nearest(region: str, candidates: dict[str, float]) -> list[tuple[str, float | None]]:
    """Regions with room, nearest first (unknown distance last)."""
    rtt = dict(RegionDistance.objects.filter(src__slug=region).values_list("dst__slug", "rtt_ms"))
    return sorted(((r, rtt.get(r)) for r in candidates if r != region and candidates[r] > 0),
                  key=lambda item: (item[1] is None, item[1] or 0.0))


def what_if(lb: LoadBalancer, fleet: Fleet, serve: bool) -> list[str]:
    """Sentences: what serving `lb` from `fleet` (or no longer) changes, pool by pool."""
    region = fleet.region.slug
    current = serving(lb)
    same_region = [s for s in current if s.region == region and s.fleet.pk != fleet.pk]
    addresses = ", ".join(Node.objects.filter(fleet=fleet, enabled=True).order_by("name")
                          .values_list("address", flat=True)) or "no nodes yet"
    pools = list(Pool.objects.filter(lb=lb).order_by("name"))
    capacities = pool_capacities_many(pools)
    lines: list[str] = []
    if serve:
        lines.append(f"Requests that reach {fleet.name}'s nodes in {region} ({addresses}) will be answered for "
                     f"{lb.name}.")
    else:
        others = [s for s in current if s.fleet.pk != fleet.pk]
        if not others:
            return [f"Nothing would serve {lb.name} any more: {fleet.name} is the only fleet serving it."]
        lines.append(f"{fleet.name}'s nodes in {region} ({addresses}) stop answering for {lb.name}; clients must "
                     f"reach {', '.join(s.fleet.name for s in others)} instead (a DNS or anycast change)."
                     + (" Other fleets in the region still serve it." if same_region else ""))
    for pool in pools:
        caps = {c.region: (math.inf if math.isinf(c.capacity) else c.capacity) for c in capacities.get(pool.pk, [])}
        here = caps.get(region, 0.0)
        elsewhere = _nearest(region, caps)
        spill = (f"{elsewhere[0][0]}" + (f" ({elsewhere[0][1]:.0f} ms away)" if elsewhere[0][1] is not None else "")
                 if elsewhere else "nowhere (no other region has room)")
        if serve:
            if math.isinf(here):
                lines.append(f"Pool {pool.name}: served in {region} by its own members without a limit.")
            elif here > 0:
                lines.append(f"Pool {pool.name}: served in {region} by its own members up to {here:.0f} req/s, "
                             f"then overflows to {spill}.")
            else:
                lines.append(f"Pool {pool.name}: no members in {region}; its requests entering there go to {spill}.")
        elif here > 0 and not same_region:
            lines.append(f"Pool {pool.name}: its {region} members take only overflow from other regions.")
    return lines
