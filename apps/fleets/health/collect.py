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


def fleet_health_collect(*, fleet: Fleet) -> int:
    """Read `show stat` from every node into NodeHealth (hot copy) and the cache; returns rows written."""
    nodes = list(queries.enabled_nodes(fleet))
    if not nodes:
        return 0
    started = time.monotonic()
    states = parallel(lambda n: read_state(queries.node_conn(n), with_stats=True), nodes,
                      in_turn=on_this_host(nodes))
    now = timezone.now()
    rows: list[NodeHealth] = []
    summary: dict[str, Any] = {"collected_at": now.isoformat(), "nodes": {}}
    for node, state in zip(nodes, states, strict=True):
        if not state.reachable:
            Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN, status_detail=state.error[:5000])
            emit.node_status_changed(node, node.status, Node.Status.DOWN, state.error)
            summary["nodes"][node.name] = {"reachable": False, "error": state.error}
            continue
        if Node.objects.filter(pk=node.pk, status__in=[Node.Status.DOWN, Node.Status.UNKNOWN]).update(
                status=Node.Status.UP, status_detail=""):
            emit.node_status_changed(node, node.status, Node.Status.UP)
        Node.objects.filter(pk=node.pk).update(last_seen=now)
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
