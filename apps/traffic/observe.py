"""Observed overflow: where each region's nodes actually sent a pool's traffic, from `show stat`.

Pure: plain data in, plain data out, no Django. `services.readings_record` feeds it each node's
backend rows; the API and the dashboard read what it computes.

A node's backends for pool P are named ``p<P>_<region>`` (HTTP) and ``p<P>_<region>_tcp`` (TCP),
see `apps.fleets.config.render.backend_name`. A node in region R that sends r req/s to ``p<P>_X``
adds r to R's *demand* (traffic arriving in R for P), and r to R's *local* when X == R, otherwise
to R's *out* (towards X) and X's *in* (from R). In HTTP mode a backend's rate counts requests
(each request is its own backend session); in TCP mode it counts connections.

Rates: HAProxy's `rate` column is the count over the last second only, so a sample taken every
few seconds sees one second in five. When the same node reported the same backend's cumulative
``req_tot`` a little earlier, the difference over the elapsed time is used instead: it covers the
whole interval. A counter that went backwards (the worker was reloaded) or a gap that is too long
falls back to `rate`.

`enforced_plan` predicts what the rendered HAProxy rules do with a given per-node demand (each
node fills its chain's steps in order up to each step's per-node limit); that is what the fleet
really serves, and it differs from `overflow.plan` (GCP's global view) by the per-node shares of
`shares.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apps.traffic.overflow import Plan, Policy, RegionFlow
from apps.traffic.thresholds import Step

TCP_SUFFIX: Final = "_tcp"
# Counter deltas over gaps longer than this mix a reload or an outage into the rate; use `rate`.
MAX_COUNTER_GAP_S: Final = 60.0
# Shorter gaps make the delta too coarse (a handful of requests) to beat the 1 s `rate`.
MIN_COUNTER_GAP_S: Final = 0.25


@dataclass(frozen=True)
class BackendRef:
    pool_id: int
    region: str
    protocol: str  # "http" | "tcp"


def parse_backend(name: str) -> BackendRef | None:
    """`p12_eu-west` -> (12, "eu-west", "http"); anything Spillway did not render -> None."""
    if not name.startswith("p"):
        return None
    head, sep, rest = name[1:].partition("_")
    if not sep or not head.isdigit() or not rest:
        return None
    protocol = "http"
    if rest.endswith(TCP_SUFFIX) and len(rest) > len(TCP_SUFFIX):
        rest, protocol = rest[: -len(TCP_SUFFIX)], "tcp"
    return BackendRef(pool_id=int(head), region=rest, protocol=protocol)


@dataclass(frozen=True)
class BackendReading:
    """One BACKEND row of one node's `show stat`."""

    backend: str
    rate_per_s: float | None  # `rate`: sessions (HTTP: requests) during the last second
    sessions: int | None = None  # `scur`
    requests_total: int | None = None  # `req_tot` (or `stot`): cumulative since the worker started


def counter_rate(
    prev_total: int | None, prev_at_s: float | None, total: int | None, at_s: float,
    *, max_gap_s: float = MAX_COUNTER_GAP_S,
) -> float | None:
    """Mean req/s between two readings of a cumulative counter, or None when it cannot be trusted."""
    if prev_total is None or prev_at_s is None or total is None:
        return None
    gap_s = at_s - prev_at_s
    if not (MIN_COUNTER_GAP_S <= gap_s <= max_gap_s) or total < prev_total:
        return None
    return (total - prev_total) / gap_s


@dataclass
class NodePoolSample:
    """What one node sent for one pool at one moment (req/s per destination region)."""

    pool_id: int
    node: str
    region: str  # the node's own region
    sent: dict[str, float] = field(default_factory=dict)  # destination region -> req/s (own included)
    sessions: int = 0
    totals: dict[str, int] = field(default_factory=dict)  # backend -> cumulative requests

    @property
    def demand(self) -> float:
        return sum(self.sent.values())

    @property
    def local(self) -> float:
        return self.sent.get(self.region, 0.0)

    @property
    def sent_to(self) -> dict[str, float]:
        """Other regions only."""
        return {region: rate for region, rate in sorted(self.sent.items()) if region != self.region}


def node_samples(
    *,
    node: str,
    region: str,
    readings: Iterable[BackendReading],
    at_s: float,
    previous: Mapping[int, tuple[float, Mapping[str, int]]] | None = None,
) -> list[NodePoolSample]:
    """One sample per pool the node has backends for.

    `previous` maps pool id -> (time, backend totals) of this node's last sample, for counter
    rates (module docstring). Pools are sorted by id so the output is deterministic.
    """
    previous = previous or {}
    by_pool: dict[int, NodePoolSample] = {}
    for reading in readings:
        ref = parse_backend(reading.backend)
        if ref is None:
            continue
        sample = by_pool.setdefault(ref.pool_id, NodePoolSample(pool_id=ref.pool_id, node=node, region=region))
        prev_at_s, prev_totals = previous.get(ref.pool_id, (None, {}))
        rate = counter_rate(prev_totals.get(reading.backend), prev_at_s, reading.requests_total, at_s)
        if rate is None:
            rate = float(reading.rate_per_s or 0)
        sample.sent[ref.region] = sample.sent.get(ref.region, 0.0) + rate
        sample.sessions += reading.sessions or 0
        if reading.requests_total is not None:
            sample.totals[reading.backend] = reading.requests_total
    return [by_pool[pool_id] for pool_id in sorted(by_pool)]


def mean_by_node(samples: Iterable[NodePoolSample]) -> list[NodePoolSample]:
    """Each node's samples averaged into one (a bucket of a time series). Sessions are averaged too."""
    groups: dict[tuple[int, str], list[NodePoolSample]] = {}
    for sample in samples:
        groups.setdefault((sample.pool_id, sample.node), []).append(sample)
    merged = []
    for (pool_id, node), group in sorted(groups.items()):
        count = len(group)
        sent: dict[str, float] = {}
        for sample in group:
            for region, rate in sample.sent.items():
                sent[region] = sent.get(region, 0.0) + rate / count
        merged.append(NodePoolSample(
            pool_id=pool_id, node=node, region=group[-1].region, sent=dict(sorted(sent.items())),
            sessions=round(sum(s.sessions for s in group) / count),
        ))
    return merged


def matrix_flows(
    demand: Mapping[str, float],
    capacities: Mapping[str, float],
    served: Mapping[str, Mapping[str, float]],
    unserved: Mapping[str, float] | None = None,
) -> list[RegionFlow]:
    """Per-region summary of a served matrix (origin -> region -> req/s), one row per region named
    anywhere, sorted by name: the same shape `overflow.plan` returns, so plans and observations
    are shown the same way."""
    unserved = unserved or {}
    regions = set(capacities) | set(demand) | {r for row in served.values() for r in row} | set(served)
    rows = {
        region: RegionFlow(region=region, capacity=capacities.get(region, 0.0), demand=demand.get(region, 0.0),
                           local=0.0, out=0.0, in_=0.0, unserved=unserved.get(region, 0.0))
        for region in sorted(regions)
    }
    for origin in sorted(served):
        for region, amount in sorted(served[origin].items()):
            if amount <= 0:
                continue
            if region == origin:
                rows[region].local += amount
                continue
            rows[origin].out += amount
            rows[origin].out_to[region] = rows[origin].out_to.get(region, 0.0) + amount
            rows[region].in_ += amount
            rows[region].in_from[origin] = rows[region].in_from.get(origin, 0.0) + amount
    for row in rows.values():
        if 0 < row.capacity < math.inf:
            row.utilization = row.served / row.capacity
    return list(rows.values())


def observed_flows(samples: Iterable[NodePoolSample], capacities: Mapping[str, float]) -> list[RegionFlow]:
    """Per-region flows of one pool from node samples (one per node: average first, see mean_by_node)."""
    demand: dict[str, float] = {}
    served: dict[str, dict[str, float]] = {}
    for sample in samples:
        demand[sample.region] = demand.get(sample.region, 0.0) + sample.demand
        row = served.setdefault(sample.region, {})
        for region, rate in sample.sent.items():
            row[region] = row.get(region, 0.0) + rate
    return matrix_flows(demand, capacities, served)


def enforced_plan(
    node_demand: Mapping[str, tuple[str, float]],
    chains: Mapping[str, Sequence[Step]],
    capacities: Mapping[str, float],
    policy: Policy,
    overload: str = "absorb",
    weights: Mapping[str, Mapping[str, float]] | None = None,
) -> Plan:
    """What the rendered rules serve where, for `node_demand` (node -> (its region, req/s)).

    Each node walks its chain (limits from `shares`): a limited step takes up to its per-node
    limit (the chain admits until this node's rate to the step reaches it), an unlimited step takes
    the rest. What a chain of only limited steps leaves is spread over its steps in proportion to
    their capacities or the node's `weights` (`absorb`, the overload pass; the enforcement loop sets
the weights, `shares.absorb_weights`) or answered 503 (`shed`, counted as
    `unserved`); a node with an empty chain serves nothing (`unserved`).
    """
    demand: dict[str, float] = {}
    served: dict[str, dict[str, float]] = {}
    unserved: dict[str, float] = {}
    for node in sorted(node_demand):
        region, rate = node_demand[node]
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"demand at node {node} must be a finite number >= 0")
        demand[region] = demand.get(region, 0.0) + rate
        row = served.setdefault(region, {})
        steps = list(chains.get(node, ()))
        if not steps:
            unserved[region] = unserved.get(region, 0.0) + rate
            continue
        left = rate
        for step_region, limit in steps:
            take = left if limit is None else min(left, float(limit))
            if take > 0:
                row[step_region] = row.get(step_region, 0.0) + take
                left -= take
        if left > 0 and overload == "shed":
            unserved[region] = unserved.get(region, 0.0) + left
        elif left > 0:
            given = weights.get(node) if weights is not None else None
            spread = [(given or capacities).get(r, 0.0) for r, _ in steps]
            if any(math.isinf(w) for w in spread) or sum(spread) <= 0:
                spread = [1.0] * len(steps)
            total = sum(spread)
            for (step_region, _), weight in zip(steps, spread, strict=True):
                # The share first, then the amount: `left * weight` underflows for a tiny weight (a capacity of
                # 5e-324 req/s gave 2.0 req/s served out of 1.5 arriving).
                row[step_region] = row.get(step_region, 0.0) + left * (weight / total)
    served = {origin: {r: v for r, v in sorted(row.items()) if v > 0} for origin, row in sorted(served.items())}
    unserved_all = {origin: unserved.get(origin, 0.0) for origin in sorted(demand)}
    return Plan(policy=policy, served=served, unserved=unserved_all,
                flows=matrix_flows(demand, capacities, served, unserved_all))


def split_demand(demand: Mapping[str, float], nodes: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, float]]:
    """Region demand spread evenly over that region's nodes (what-if): node -> (region, req/s).

    Regions without nodes are left out; the caller reports their demand as not routable.
    """
    result: dict[str, tuple[str, float]] = {}
    for region in sorted(demand):
        names = list(nodes.get(region, ()))
        for name in names:
            result[name] = (region, demand[region] / len(names))
    return result


# --- JSON ---------------------------------------------------------------------------------------------


def _num(value: float, digits: int = 3) -> float | None:
    """JSON has no infinity: unlimited capacity is null."""
    return None if math.isinf(value) else round(value, digits)


def flow_to_dict(flow: RegionFlow) -> dict[str, Any]:
    return {
        "region": flow.region,
        "capacity": _num(flow.capacity),
        "demand": _num(flow.demand),
        "local": _num(flow.local),
        "out": _num(flow.out),
        "in": _num(flow.in_),
        "out_to": {k: _num(v) for k, v in sorted(flow.out_to.items())},
        "in_from": {k: _num(v) for k, v in sorted(flow.in_from.items())},
        "unserved": _num(flow.unserved),
        "utilization": _num(flow.utilization, 4),
    }


def plan_to_dict(result: Plan) -> dict[str, Any]:
    return {
        "policy": result.policy,
        "regions": [flow_to_dict(f) for f in result.flows],
        "served": {o: {r: _num(v) for r, v in row.items()} for o, row in result.served.items()},
        "unserved": {o: _num(v) for o, v in result.unserved.items()},
        "total_unserved": _num(result.total_unserved),
    }
