"""The request-log collector: UDP datagrams from every node, summed per series and bucket, written each second.

One collector per deployment owns the buckets it writes (a write overwrites a bucket with the collector's
whole sums for it: two collectors at once overwrite each other's). Run it with `manage.py runsignals`; a
restart loses the open buckets' counts from before it (up to GRACE_S + one bucket, ~10 s: the restarted
collector writes what it counted since), and the nodes' traffic is never affected: HAProxy sends its log
over UDP and does not wait for anyone. Lines naming no node Spillway runs are dropped (directory.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field

from django.db import close_old_connections

from apps.signals import services
from apps.signals.aggregate import Aggregator, Directory
from apps.signals.logline import parse
from apps.signals.sampling import Sampler

logger = logging.getLogger(__name__)

RECV_BUFFER = 16 * 1024 * 1024  # a second of lines at 100k req/s while a write runs
WRITE_EVERY_S = 1.0
GRACE_S = 5  # a bucket stays open this long after its end, for lines still in flight
KEEP_UNWRITTEN_S = 300  # buckets older than this are dropped when writes keep failing
STATS_EVERY_S = float(os.environ.get("SPILLWAY_SIGNALS_STATS_S", "60"))  # how often the counts below are logged


@dataclass
class Stats:
    lines: int = 0
    ignored: int = 0  # not a Spillway request line
    written: int = 0
    started: float = field(default_factory=time.monotonic)


class Collector:
    def __init__(self, address: tuple[str, int], directory: Directory, step_s: int = services.FINE_STEP_S,
                 clock=time.time) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER)
        self.sock.bind(address)
        self.address = self.sock.getsockname()[:2]
        self.directory = directory
        self.aggregator = Aggregator(step_s)
        self.sampler = Sampler()
        self.clock = clock
        self.stats = Stats()

    def receive(self, until: float) -> None:
        """Read datagrams until the monotonic time `until`."""
        agg, directory, stats, sock, sampler = self.aggregator, self.directory, self.stats, self.sock, self.sampler
        closed_before = agg.bucket(self.clock() - GRACE_S) - agg.step_s
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            try:
                data = sock.recv(65535)
            except TimeoutError:
                return
            stats.lines += 1
            request = parse(data)
            if request is None:
                stats.ignored += 1
                continue
            resolved, now = directory.resolve(request), self.clock()
            agg.add(request, resolved, now, closed_before)
            sampler.offer(request, resolved, now)

    def write(self) -> None:
        now = self.clock()
        due = list(self.aggregator.due())
        samples = self.sampler.take()
        try:
            self.stats.written += services.buckets_write(due, self.aggregator.step_s)
        except Exception:
            for _, entry in due:
                entry.dirty = True
            # Kept for the next write while the database is away, but not forever: memory stays bounded.
            self.aggregator.close(self.aggregator.bucket(now - KEEP_UNWRITTEN_S))
            raise
        # Samples are the least of it: lost with a failed write rather than held (they are a sample already).
        services.samples_write(samples)
        self.aggregator.close(self.aggregator.bucket(now - GRACE_S) - self.aggregator.step_s)

    def report(self) -> str:
        s, a = self.stats, self.aggregator
        return (f"signals: {s.lines} lines, {s.ignored} not ours, {a.unknown} unknown frontends, {a.late} late, "
                f"{s.written} bucket writes, {len(a.open)} open, {self.sampler.dropped} not sampled")

    def run(self, *, duration_s: float | None = None) -> None:
        stop = None if duration_s is None else time.monotonic() + duration_s
        reported = time.monotonic()
        while stop is None or time.monotonic() < stop:
            self.receive(time.monotonic() + WRITE_EVERY_S)
            if time.monotonic() - reported >= STATS_EVERY_S:
                logger.info(self.report())
                reported = time.monotonic()
            try:
                close_old_connections()
                self.directory.maybe_reload()  # routes changed since: counted under themselves from now
                self.write()
            except Exception:  # the database away: keep summing, write when it is back
                logger.exception("signals: buckets not written; keeping them for the next write")
        self.write()
