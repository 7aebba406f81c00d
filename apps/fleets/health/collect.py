"""Health collection: every node's `show stat` into NodeHealth (the hot copy), the cache and traffic samples."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from apps.fleets import events as emit
from apps.fleets import queries
from apps.fleets.fanout import on_this_host, parallel
from apps.fleets.models import Fleet, Node, NodeHealth
from apps.fleets.node.outside_rollout import read_state
from apps.traffic.services import NodeReadings, readings_from_stats, readings_record

logger = logging.getLogger(__name__)

HEALTH_CACHE_S = 120


def health_cache_key(fleet_id: int) -> str:
    return f"fleets:health:{fleet_id}"


def _changed_at(stat, now):
    """`lastchg` (seconds since the server's last state change) as a time; None where HAProxy leaves it empty."""
    seconds = (stat.raw or {}).get("lastchg", "")
    return now - timedelta(seconds=int(seconds)) if seconds.isdigit() else None


def _mark_reachable(nodes: list[Node], now) -> None:  # type: ignore[no-untyped-def]
    """Every node that answered: seen now, and up where it was down or unknown (each such one says so), in two
    writes whatever the node count (after one locking read): two per node were 400 statements every 5 s at 201
    nodes.

    Rows another transaction holds (a rollout recording its nodes, which sets their last sight and status itself)
    are skipped, not waited for: a statement over many rows that waited could deadlock with that transaction's own
    statements over many rows; one skipped comes up at the next collection, 5 s later, if its rollout did not."""
    if not nodes:
        return
    by_id = {node.pk: node for node in nodes}
    with transaction.atomic():
        # NO KEY: as an UPDATE locks, so a transaction inserting rows that reference a node is not in the way.
        mine = dict(Node.objects.select_for_update(skip_locked=True, no_key=True).filter(pk__in=list(by_id))
                    .values_list("pk", "status"))
        came_up = {pk: old for pk, old in mine.items() if old in (Node.Status.DOWN, Node.Status.UNKNOWN)}
        if came_up:
            Node.objects.filter(pk__in=list(came_up)).update(status=Node.Status.UP, status_detail="")
        if mine:
            Node.objects.filter(pk__in=list(mine)).update(last_seen=now)
    for pk, old in came_up.items():
        emit.node_status_changed(by_id[pk], old, Node.Status.UP)


def fleet_health_collect(*, fleet: Fleet) -> int:
    """Read `show stat` from every node into NodeHealth (hot copy) and the cache; returns rows written."""
    nodes = list(queries.enabled_nodes(fleet))
    if not nodes:
        return 0
    started = time.monotonic()
    states = parallel(lambda n: read_state(queries.node_conn(n), with_stats=True, with_disk=False), nodes,
                      in_turn=on_this_host(nodes))
    now = timezone.now()
    rows: list[NodeHealth] = []
    summary: dict[str, Any] = {"collected_at": now.isoformat(), "nodes": {}}
    _mark_reachable([node for node, state in zip(nodes, states, strict=True) if state.reachable], now)
    for node, state in zip(nodes, states, strict=True):
        if not state.reachable:
            Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN, status_detail=state.error[:5000])
            emit.node_status_changed(node, node.status, Node.Status.DOWN, state.error)
            summary["nodes"][node.name] = {"reachable": False, "error": state.error}
            continue
        servers = []
        for s in state.stats:
            rows.append(NodeHealth(node=node, proxy=s.pxname[:128], server=s.svname[:128],
                                   status=s.status[:32], check_status=s.check_status[:32],
                                   weight=s.weight, sessions=s.scur, rate_per_s=s.rate,
                                   requests_total=s.req_tot, changed_at=_changed_at(s, now), updated_at=now))
            if s.is_server:
                servers.append({"backend": s.pxname, "server": s.svname, "status": s.status,
                                "check": s.check_status, "weight": s.weight, "rate": s.rate})
        summary["nodes"][node.name] = {"reachable": True, "servers": servers}
    seen = [node for node, state in zip(nodes, states, strict=True) if state.reachable]
    health_before = emit.member_health_before(seen)
    with transaction.atomic():
        NodeHealth.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["node", "proxy", "server"],
            update_fields=["status", "check_status", "weight", "sessions", "rate_per_s", "requests_total",
                           "changed_at", "updated_at"],
        )
        # Proxies and servers a node no longer has (a route or member went away).
        NodeHealth.objects.filter(node__in=seen).exclude(updated_at=now).delete()
    emit.member_health_changed(health_before, rows)
    summary["duration_ms"] = (time.monotonic() - started) * 1000.0
    cache.set(health_cache_key(fleet.pk), summary, HEALTH_CACHE_S)
    try:
        # History for the overflow charts (apps.traffic TrafficSample), from the same readings.
        readings_record(nodes=[
            NodeReadings(node_id=node.pk, node=Node.label(fleet.name, node.name), region=fleet.region.slug,
                         readings=readings_from_stats(state.stats))
            for node, state in zip(nodes, states, strict=True) if state.reachable], at=now)
    except Exception:  # charts must never break health collection
        logger.exception("fleet %s: traffic samples not recorded", fleet.name)
    return len(rows)
