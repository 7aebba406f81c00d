"""A pool's cumulative counters on every node serving it, read from the nodes at once (not the collector's
5 s copy): what a failover drill samples each second to say what each region served and what failed.

Per node: requests that arrived for the pool (the chain's demand table, `http_req_cnt`: shed answers
included) and of those the ones the node shed itself (503 with Retry-After, the table's `gpc0`), and per region
backend the requests sent to members (`stot`: in HTTP mode each request is its own backend session) and those
that failed there (5xx answers, connection and response errors). Counts are per node, so a reader can take
differences node by node and see a node's counter restart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from apps.balancers.models import Pool
from apps.fleets import queries
from apps.fleets.config.render.chain import DEMAND_TABLE, backend_name
from apps.fleets.fanout import parallel
from apps.fleets.models import Node
from apps.fleets.node.apply import NODE_ERRORS
from apps.fleets.node.showstat import int_or_none, parse_show_stat, parse_show_table_counts, parse_show_table_gpc0
from apps.fleets.node.transports import transport_for


@dataclass
class NodeCounters:
    arrived: int = 0
    shed: int | None = 0  # None: the node's config predates the shed count (gpc0), so shed must be inferred
    served: dict[str, int] = field(default_factory=dict)  # region -> requests sent to its members
    failed: dict[str, int] = field(default_factory=dict)  # region -> of those, 5xx / connection / response errors


def pool_counters(pool: Pool) -> tuple[dict[str, NodeCounters], list[str]]:
    """({"fleet/node": counters} for the nodes that answered, [nodes that did not]), the nodes read side by side
    (a drill samples every second, whatever the fleet's size)."""
    by_backend = {backend_name(pool.pk, s, "http"): s for s in pool.regions.values_list("region__slug", flat=True)}
    nodes = list(Node.objects.filter(fleet__in=queries.lb_fleets(pool.lb), enabled=True).select_related("fleet"))
    readings = parallel(lambda node: _read(node, pool.pk, by_backend), nodes) if nodes else []
    out = {str(node): reading for node, reading in zip(nodes, readings, strict=True) if reading is not None}
    return out, [str(node) for node, reading in zip(nodes, readings, strict=True) if reading is None]


def _read(node: Node, pool_id: int, by_backend: dict[str, str]) -> NodeCounters | None:
    transport = None
    try:
        transport = transport_for(queries.node_conn(node))
        # One CLI line, so both counts are read within microseconds: read apart, requests arriving in between
        # looked like requests no member answered (a drill failed its 1% SLO on 1 such request in 45).
        answer = transport.runtime(f"show table {DEMAND_TABLE} key {pool_id};show stat -1 2 -1")
        split = answer.find("# pxname")
        counts = parse_show_table_counts(answer[:split])
        shed = parse_show_table_gpc0(answer[:split])
        rows = parse_show_stat(answer[split:])
    except NODE_ERRORS:
        return None
    finally:
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()  # type: ignore[attr-defined]
    key = str(pool_id)
    # No row: nothing arrived within the table's expiry, so nothing was shed either.
    reading = NodeCounters(arrived=counts.get(key, 0), shed=shed.get(key, 0 if key not in counts else None))
    for row in rows:
        region = by_backend.get(row.pxname)
        if region is None or row.svname != "BACKEND":
            continue
        reading.served[region] = int_or_none(row.raw.get("stot")) or 0
        reading.failed[region] = sum(int_or_none(row.raw.get(c)) or 0 for c in ("hrsp_5xx", "econ", "eresp"))
    return reading
