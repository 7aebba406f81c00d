"""`manage.py dispatcher`: the scheduler loop as its own process (an alternative to beat's tick).

Ticks right after every whole second (slots are whole seconds, so that is when work
appears), dispatches everything due, and runs the reaper every few seconds. Run two of
them on two machines: they share the work through SKIP LOCKED, and either one alone
keeps every schedule.
"""

from __future__ import annotations

import logging
import math
import time

from django.core.management.base import BaseCommand
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from apps.core.shutdown import stop_on_signals
from apps.scheduling import dispatcher, runner

log = logging.getLogger("apps.scheduling.dispatcher")

# Past the second boundary, so the slot is due by the time the tick reads the clock.
TICK_OFFSET_S = 0.003
RECHECK_DELAY_S = 0.05
RECHECKS = 5


class Command(BaseCommand):
    help = "Run the job dispatcher loop (tick every second, reaper every few seconds) until SIGTERM."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tick-s", type=float, default=1.0)
        parser.add_argument("--batch", type=int, default=dispatcher.DEFAULT_BATCH)
        parser.add_argument("--reap-every-s", type=float, default=5.0)
        parser.add_argument("--stale-after-s", type=float, default=runner.STALE_AFTER_S,
                            help="a running run without heartbeat for this long is declared lost")
        parser.add_argument("--once", action="store_true", help="one tick, then exit")

    def handle(self, *args, **opts) -> None:
        stopping = stop_on_signals()
        tick_s: float = max(0.05, opts["tick_s"])
        next_reap = 0.0
        try:
            runner.warm_producer()
        except Exception as exc:  # the broker may come later; sends retry then
            log.warning("dispatcher: broker not reachable yet (%s)", exc)
        self.stdout.write(f"dispatcher ready (tick {tick_s} s, batch {opts['batch']})", ending="\n")
        self.stdout.flush()
        while not stopping.is_set():
            try:
                self._tick(opts["batch"])
                if time.monotonic() >= next_reap:
                    reaped = runner.reap(stale_after_s=opts["stale_after_s"])
                    if reaped.lost or reaped.timed_out or reaped.resent:
                        log.info("reaper: %s", reaped)
                    next_reap = time.monotonic() + opts["reap_every_s"]
            except (OperationalError, InterfaceError) as exc:
                # The database went away (restart, failover): reconnect on the next tick.
                log.warning("dispatcher: database unavailable (%s); retrying", exc)
                connection.close()
            if opts["once"]:
                break
            try:
                dispatcher.warm_upcoming(within_s=tick_s * 2)
            except (OperationalError, InterfaceError):
                connection.close()
            now = time.time()
            stopping.wait(max(0.0, math.floor(now / tick_s) * tick_s + tick_s + TICK_OFFSET_S - now))

    def _tick(self, batch: int) -> None:
        close_old_connections()
        total = dispatcher.dispatch_due(batch_size=batch)
        for _ in range(RECHECKS):
            # Due jobs we could not lock belong to a peer dispatcher or a worker's brief update;
            # look again shortly rather than a whole tick later.
            if not dispatcher.due_unclaimed():
                break
            time.sleep(RECHECK_DELAY_S)
            total.add(dispatcher.dispatch_due(batch_size=batch))
        if total.jobs:
            log.info("tick: jobs=%d runs=%d catch_up=%d skipped=%d conflicts=%d", total.jobs, total.runs,
                     total.catch_up, total.skipped, total.conflicts)
