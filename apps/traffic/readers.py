"""What traffic reads from fleets, handed in by fleets so that traffic never imports it.

Fleets sits above traffic (its renderer needs the overflow planner), yet two of traffic's reads are
about nodes: which members the nodes see up (the capacity model counts only healthy members) and
which nodes serve a pool (the what-if splits demand over them). Fleets provides both readers from
`FleetsConfig.ready`, the way balancers' signals let fleets react without balancers importing it.
Until it has (or in a project without fleets) no node reports and none serves: capacity falls back to
members' admin state, and the what-if shows no per-node plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from apps.balancers.models import Pool

# (backend name, server name, status) from each enabled node's `show stat`, reported at or after `since`.
HealthRows = Callable[[datetime], Iterable[tuple[str, str, str]]]
# {region slug: ["fleet/node", ...]}: the enabled nodes of every fleet serving the pool's LB.
PoolNodes = Callable[[Pool], dict[str, list[str]]]


def _no_reports(since: datetime) -> Iterable[tuple[str, str, str]]:
    return ()


def _no_nodes(pool: Pool) -> dict[str, list[str]]:
    return {}


_health_rows: HealthRows = _no_reports
_pool_nodes: PoolNodes = _no_nodes


def provide(*, health_rows: HealthRows, pool_nodes: PoolNodes) -> None:
    global _health_rows, _pool_nodes
    _health_rows, _pool_nodes = health_rows, pool_nodes


def health_rows(since: datetime) -> Iterable[tuple[str, str, str]]:
    return _health_rows(since)


def pool_nodes(pool: Pool) -> dict[str, list[str]]:
    return _pool_nodes(pool)
