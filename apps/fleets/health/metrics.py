"""Prometheus metrics for fleets, read from the database at scrape time.

Rollouts run in Celery workers and /metrics is served by the web processes, so in-process
histograms would never see a rollout. The database is the one place both share: durations are
stored on Rollout / NodeResult rows and the histograms below are cumulative counts over them
(monotonic as long as rows are kept).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from django.db.models import Count, Q, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from apps.core.metrics import register_collector

logger = logging.getLogger(__name__)

ROLLOUT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PUSH_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _histogram(name: str, doc: str, queryset, field: str, label: str,
               buckets: tuple[float, ...]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["fleet"])
    aggregates = {f"le_{i}": Count("pk", filter=Q(**{f"{field}__lte": b * 1000.0}))
                  for i, b in enumerate(buckets)}
    rows = queryset.exclude(**{f"{field}__isnull": True}).values(label).annotate(
        total=Count("pk"), total_ms=Sum(field), **aggregates)
    for row in rows:
        points = [(str(b), row[f"le_{i}"]) for i, b in enumerate(buckets)] + [("+Inf", row["total"])]
        family.add_metric([row[label]], points, (row["total_ms"] or 0.0) / 1000.0)
    return family


class FleetCollector:
    def describe(self) -> list:
        # Without describe() the registry calls collect() at registration: a query at import time.
        return []

    def collect(self) -> Iterator:
        from apps.fleets.models import Fleet, Node, NodeHealth, NodeResult, Rollout

        try:
            desired = GaugeMetricFamily("spillway_fleet_desired_revision",
                                        "Config revision every node of the fleet should serve", labels=["fleet"])
            for name, number in Fleet.objects.values_list("name", "desired_revision"):
                desired.add_metric([name], number)
            applied = GaugeMetricFamily("spillway_node_applied_revision",
                                        "Config revision the node verifiably serves (0 = none)",
                                        labels=["fleet", "node"])
            up = GaugeMetricFamily("spillway_node_up", "1 when the node's HAProxy master answered last time",
                                   labels=["fleet", "node"])
            status = GaugeMetricFamily("spillway_node_status", "Node status (1 for the current one)",
                                       labels=["fleet", "node", "status"])
            behind = GaugeMetricFamily("spillway_node_behind", "1 when the node is not on the desired revision",
                                       labels=["fleet", "node"])
            for fleet, node, number, state, want in Node.objects.filter(enabled=True).values_list(
                    "fleet__name", "name", "applied_revision__number", "status", "fleet__desired_revision"):
                applied.add_metric([fleet, node], number or 0)
                up.add_metric([fleet, node], 0 if state in ("down", "unknown") else 1)
                behind.add_metric([fleet, node], 0 if (number or 0) == want else 1)
                for choice in Node.Status.values:
                    status.add_metric([fleet, node, choice], 1 if state == choice else 0)
            servers = GaugeMetricFamily("spillway_node_servers", "Backend servers by status as the node reports",
                                        labels=["fleet", "node", "status"])
            for row in (NodeHealth.objects.exclude(server__in=["FRONTEND", "BACKEND"])
                        .values("node__fleet__name", "node__name", "status").annotate(n=Count("pk"))):
                servers.add_metric([row["node__fleet__name"], row["node__name"], row["status"]], row["n"])
            rollouts = CounterMetricFamily("spillway_rollouts", "Rollouts by outcome",
                                           labels=["fleet", "status"])
            for row in Rollout.objects.values("fleet__name", "status").annotate(n=Count("pk")):
                rollouts.add_metric([row["fleet__name"], row["status"]], row["n"])
            applies = CounterMetricFamily(
                "spillway_node_applies", "Verified node applies: with a reload, or without one (runtime map "
                "updates for route-only changes, or a node already serving the revision)", labels=["fleet", "method"])
            for row in (NodeResult.objects.filter(status=NodeResult.Status.SUCCEEDED)
                        .values("rollout__fleet__name")
                        .annotate(reload=Count("pk", filter=Q(reload_ms__isnull=False)),
                                  no_reload=Count("pk", filter=Q(reload_ms__isnull=True)))):
                for method in ("reload", "no_reload"):
                    applies.add_metric([row["rollout__fleet__name"], method], row[method])
            yield from (desired, applied, up, status, behind, servers, rollouts, applies)
            yield _histogram("spillway_rollout_duration_seconds", "Rollout duration, first node to last",
                             Rollout.objects.all(), "duration_ms", "fleet__name", ROLLOUT_BUCKETS_S)
            yield _histogram("spillway_node_push_duration_seconds",
                             "Per-node push + reload + verify duration", NodeResult.objects.all(),
                             "duration_ms", "rollout__fleet__name", PUSH_BUCKETS_S)
        except DatabaseError as exc:  # a scrape must not fail because the database is away
            logger.warning("fleet metrics unavailable: %s", exc)


def register() -> None:
    register_collector("fleets", FleetCollector())
