"""`manage.py enforcer`: the enforcement loop (apps.fleets.enforcement) as its own process, every 250 ms.

Beat's `fleets.enforce_task` runs it at most once a second, on a worker slot a capacity test's shards may
hold, and senses demand through HAProxy's 1 s sliding rate: a node's share followed a change of ingress
after 2.1-2.4 s (make bench-overflow-fleet). This process keeps its readings between runs
(`DemandMeter`: demand from counts, following a change within ~0.25 s) and runs four times a second.

Only one enforcer works at a time (a lease in the cache, renewed every run); others wait as standbys and
take over when the lease lapses. While a lease is held, `enforce_task` does nothing; when no enforcer
runs, the task is the loop (at its 1 s period). Every run is idempotent: it sets what differs from the
nodes' live maps.
"""

from __future__ import annotations

import logging
import time

from django.core.management.base import BaseCommand
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from apps.core import gcpause
from apps.core.shutdown import stop_on_signals
from apps.fleets.enforcement import DemandMeter, Topology, enforce, lease_acquire, lease_release

log = logging.getLogger("apps.fleets.enforcer")
RENEW_EVERY_S = 0.5  # well inside the lease (LEASE_S)


class Command(BaseCommand):
    help = "Run the overflow enforcement loop (per-node shares set at run time) until SIGTERM."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--period-s", type=float, default=0.25)
        parser.add_argument("--window-s", type=float, default=1.0, help="steady demand = requests counted over this")
        parser.add_argument("--once", action="store_true", help="one run, then exit")

    def handle(self, *args, **opts) -> None:
        stopping = stop_on_signals()
        period = max(0.05, opts["period_s"])
        meter = DemandMeter(window_s=opts["window_s"])
        topology = Topology()
        token = f"{id(self)}-{time.time()}"
        holding = False
        # Its long GC pauses logged, and what it imported left out of full collections (apps.core.gcpause): each one
        # walked the whole application, a run's delay, four runs a second.
        gcpause.install()
        gcpause.freeze_startup_heap()
        self.stdout.write(f"enforcer ready (every {period} s)", ending="\n")
        self.stdout.flush()
        next_run = renew_at = time.monotonic()
        try:
            while not stopping.is_set():
                started = time.monotonic()
                try:
                    close_old_connections()
                    was = holding
                    if not holding or time.monotonic() >= renew_at:
                        # Every run would be 4 writes a second to the cache (the database's, without Redis).
                        holding = lease_acquire(token)
                        renew_at = time.monotonic() + RENEW_EVERY_S
                    if holding and not was:
                        log.info("enforcer: holding the lease")
                    if holding:
                        done = enforce(meter=meter, topology=topology)
                        if done.get("unreachable"):
                            log.debug("enforcer: %s", done)
                    else:
                        meter = DemandMeter(window_s=opts["window_s"])  # a standby's readings go stale
                except (OperationalError, InterfaceError) as exc:
                    log.warning("enforcer: database unavailable (%s); retrying", exc)
                    connection.close()
                except Exception:  # one bad run must not stop the loop; the next one starts afresh
                    log.exception("enforcer: run failed")
                if opts["once"]:
                    break
                # A run longer than the period (many pools, a slow node) is followed by as long a
                # pause: the loop takes at most half a core, and the period stretches instead.
                took = time.monotonic() - started
                next_run = max(next_run + period, time.monotonic() + (took if took > period else 0.0))
                stopping.wait(max(0.0, next_run - time.monotonic()))
        finally:
            if holding:
                lease_release(token)
