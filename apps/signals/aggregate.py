"""Requests into per-series, per-bucket sums: what the collector keeps in memory between writes. Pure.

A series is what a chart line is made of, at the finest grain a page needs:
- `listener` per node: everything a node's frontend received (LB, listener, node and the node's region
  are sums of these);
- `route`, summed over nodes: the route the request matched, resolved the way the config resolves it;
- `member` per node: the server that answered (pool and the pool's regions are sums of these).
Listeners and members also have an all-nodes series (ALL_NODES). So the number of series is
listeners x (nodes + 1) + routes with traffic + members x (nodes + 1): it grows with what the pages show,
never with paths, clients or status codes (those are columns, not labels).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from apps.signals import hist
from apps.signals.logline import Request

LISTENER, ROUTE, MEMBER = "listener", "route", "member"
# The node of a listener's or member's series summed over every node: what the LB, pool and member charts read
# (a 7-day LB chart of 6 nodes read 12k rows and took ~270 ms; this is 2k). Per-node rows stay for the node
# chart, the canary's judge and /metrics.
ALL_NODES = "*"


@dataclass(frozen=True, slots=True)
class Dims:
    """Where a series belongs, stored beside its sums (for scoping and grouping without joins)."""

    org_id: int | None
    lb_id: int | None = None
    pool_id: int | None = None
    region: str = ""


@dataclass(slots=True)
class Sums:
    requests: int = 0
    s1xx: int = 0
    s2xx: int = 0
    s3xx: int = 0
    s4xx: int = 0
    s5xx: int = 0
    proxy_5xx: int = 0  # 5xx HAProxy made itself (logline.Request.by_proxy)
    aborted: int = 0  # no status: the client left before a response
    retries: int = 0
    redispatches: int = 0
    bytes: int = 0
    t_queue: list[int] = field(default_factory=hist.new)
    t_connect: list[int] = field(default_factory=hist.new)
    t_upstream: list[int] = field(default_factory=hist.new)
    t_total: list[int] = field(default_factory=hist.new)

    def add(self, r: Request) -> None:
        self.requests += 1
        status = r.status
        if status >= 500:
            self.s5xx += 1
            if r.by_proxy:
                self.proxy_5xx += 1
        elif status >= 400:
            self.s4xx += 1
        elif status >= 300:
            self.s3xx += 1
        elif status >= 200:
            self.s2xx += 1
        elif status >= 100:
            self.s1xx += 1
        else:
            self.aborted += 1
        self.retries += r.retries
        self.redispatches += r.redispatched
        self.bytes += r.bytes
        # -1: the request never reached that stage (no server, answered by HAProxy): not a latency.
        if r.t_queue >= 0:
            self.t_queue[hist.index(r.t_queue)] += 1
        if r.t_connect >= 0:
            self.t_connect[hist.index(r.t_connect)] += 1
        if r.t_upstream >= 0:
            self.t_upstream[hist.index(r.t_upstream)] += 1
        if r.t_total >= 0:
            self.t_total[hist.index(r.t_total)] += 1

    def merge(self, other: Sums) -> None:
        for name in SUM_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in HIST_FIELDS:
            mine = getattr(self, name)
            for i, n in enumerate(getattr(other, name)):
                if n:
                    mine[i] += n

    def add_row(self, values: Sequence) -> None:
        """Add a stored bucket: its SUM_FIELDS, then its HIST_FIELDS (sparse), in that order (ROW_FIELDS)."""
        for name, value in zip(SUM_FIELDS, values, strict=False):
            setattr(self, name, getattr(self, name) + value)
        for name, value in zip(HIST_FIELDS, values[len(SUM_FIELDS):], strict=True):
            hist.add_sparse(getattr(self, name), value)


# The columns a stored bucket (models.SignalBucket) keeps of Sums: counts, then sparse histograms.
SUM_FIELDS = ("requests", "s1xx", "s2xx", "s3xx", "s4xx", "s5xx", "proxy_5xx", "aborted", "retries",
              "redispatches", "bytes")
HIST_FIELDS = ("t_queue", "t_connect", "t_upstream", "t_total")
ROW_FIELDS = (*SUM_FIELDS, *HIST_FIELDS)


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a request is, in ids: None where the directory does not know the name (yet)."""

    listener: tuple[int, Dims] | None
    route: tuple[int, Dims] | None
    member: tuple[int, Dims] | None


class Directory(Protocol):
    def resolve(self, request: Request) -> Resolved: ...

    def maybe_reload(self, missed: bool = False) -> None: ...


SeriesKey = tuple[str, int, str]  # (kind, id, node); node "" for routes
BucketKey = tuple[int, SeriesKey]  # (bucket start, unix seconds; series)


@dataclass
class Open:
    dims: Dims
    sums: Sums
    dirty: bool = True


class Aggregator:
    """Sums per (bucket, series) for the buckets still open; `due` hands out what changed since the last
    write, `close` what can no longer change. One collector owns a bucket (writes overwrite, see collector)."""

    def __init__(self, step_s: int) -> None:
        self.step_s = step_s
        self.open: dict[BucketKey, Open] = {}
        self.unknown = 0  # requests whose frontend the directory does not know
        self.late = 0  # requests for a bucket already closed

    def bucket(self, now: float) -> int:
        return int(now) // self.step_s * self.step_s

    def add(self, request: Request, resolved: Resolved, now: float, closed_before: int = 0) -> None:
        start = self.bucket(now)
        if start < closed_before:
            self.late += 1
            return
        if resolved.listener is None:
            self.unknown += 1
            return
        listener_id, dims = resolved.listener
        self._add((start, (LISTENER, listener_id, request.node)), dims, request)
        self._add((start, (LISTENER, listener_id, ALL_NODES)), Dims(dims.org_id, dims.lb_id), request)
        if resolved.route is not None:
            self._add((start, (ROUTE, resolved.route[0], "")), resolved.route[1], request)
        if resolved.member is not None:
            self._add((start, (MEMBER, resolved.member[0], request.node)), resolved.member[1], request)
            self._add((start, (MEMBER, resolved.member[0], ALL_NODES)), resolved.member[1], request)

    def _add(self, key: BucketKey, dims: Dims, request: Request) -> None:
        entry = self.open.get(key)
        if entry is None:
            entry = self.open[key] = Open(dims, Sums())
        entry.sums.add(request)
        entry.dirty = True

    def due(self) -> Iterator[tuple[BucketKey, Open]]:
        """Entries changed since the last call (their whole sums, to overwrite what was written)."""
        for key, entry in self.open.items():
            if entry.dirty:
                entry.dirty = False
                yield key, entry

    def close(self, before: int) -> None:
        """Forget buckets that start before `before` (written already: call due() first)."""
        for key in [k for k in self.open if k[0] < before]:
            del self.open[key]
