"""Golden signals for Prometheus: the last complete minute of each series, read from the database at scrape time.

Gauges over a fixed window rather than counters: the collector's sums live in the database, where fine
buckets are rolled up and dropped, so a counter summed from them would go backwards. Labels are ids and
names of what the pages show (LB, listener, route, pool, member, node, status class): bounded by the
objects, never by paths or clients. deploy/grafana/spillway-signals.json charts these names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily

from apps.core.metrics import register_collector

logger = logging.getLogger(__name__)

WINDOW_S = 60
CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


class SignalsCollector:
    def describe(self) -> list:
        return []  # no query at registration

    def collect(self) -> Iterator:
        from apps.signals import hist
        from apps.signals.aggregate import ALL_NODES, HIST_FIELDS, ROW_FIELDS, Sums
        from apps.signals.collector import GRACE_S
        from apps.signals.models import SignalBucket
        from apps.signals.services import FINE_STEP_S

        families = {
            "requests": GaugeMetricFamily("spillway_requests_per_second", "Requests per second over the last "
                                          "complete minute, by status class", labels=["level", "id", "node", "code"]),
            "proxy_5xx": GaugeMetricFamily("spillway_proxy_5xx_per_second", "5xx HAProxy answered itself (no "
                                           "server, refused, timeout) per second", labels=["level", "id", "node"]),
            "retries": GaugeMetricFamily("spillway_retries_per_second", "Connection retries per second",
                                         labels=["level", "id", "node"]),
            "latency": GaugeMetricFamily("spillway_latency_ms", "Latency percentile over the last complete "
                                         "minute (stage: queue, connect, upstream, total)",
                                         labels=["level", "id", "node", "stage", "quantile"]),
        }
        try:
            # Complete: the collector keeps a bucket open GRACE_S past its end for lines still in flight.
            end = int(time.time() - GRACE_S) // FINE_STEP_S * FINE_STEP_S
            # Per-node series only: the all-nodes rows are their sums, which a dashboard sums by itself.
            rows = SignalBucket.objects.filter(step_s=FINE_STEP_S,
                                               start__gte=datetime.fromtimestamp(end - WINDOW_S, UTC),
                                               start__lt=datetime.fromtimestamp(end, UTC)).exclude(node=ALL_NODES)
            sums: dict[tuple[str, str, str], Sums] = {}
            for row in rows.values_list("kind", "ref_id", "node", *ROW_FIELDS).iterator(2000):
                sums.setdefault((row[0], str(row[1]), row[2]), Sums()).add_row(row[3:])
            for (level, ref, node), n in sums.items():
                for code in CLASSES:
                    families["requests"].add_metric([level, ref, node, code], getattr(n, f"s{code}") / WINDOW_S)
                families["proxy_5xx"].add_metric([level, ref, node], n.proxy_5xx / WINDOW_S)
                families["retries"].add_metric([level, ref, node], n.retries / WINDOW_S)
                for field in HIST_FIELDS:
                    for q in (0.5, 0.95, 0.99):
                        value = hist.percentile(getattr(n, field), q)
                        if value is not None:
                            families["latency"].add_metric([level, ref, node, field[2:], str(q)], value)
        except DatabaseError as exc:  # a scrape must not fail because the database is away
            logger.warning("signal metrics unavailable: %s", exc)
        yield from families.values()


def register() -> None:
    register_collector("signals", SignalsCollector())
