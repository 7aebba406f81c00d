"""Which requests the collector keeps whole (models.RequestSample): a bounded share per LB and second. Pure.

Failed requests (5xx, HAProxy's own refusals, clients gone before a response) are what someone opens the log
for, so they get the larger share: the first ERRORS_PER_S of each second, then the first OTHERS_PER_S of the
rest. A flood costs at most (ERRORS_PER_S + OTHERS_PER_S) rows per LB and second, whatever its rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from apps.signals.aggregate import Resolved
from apps.signals.logline import Request

ERRORS_PER_S = 10
OTHERS_PER_S = 2
MAX_PATH = 1024
MAX_HOST = 255


def failed(request: Request) -> bool:
    """A 5xx, no response at all, or HAProxy refusing (a deny's 403): not its redirects (`LR--` 3xx)."""
    return request.status >= 500 or request.status < 0 or (request.by_proxy and request.status >= 400)


@dataclass(slots=True)
class Sample:
    at: float
    lb_id: int
    org_id: int | None
    route_id: int | None
    pool_id: int | None
    member_id: int | None
    request: Request
    region: str


class Sampler:
    def __init__(self, errors_per_s: int = ERRORS_PER_S, others_per_s: int = OTHERS_PER_S) -> None:
        self.limits = (others_per_s, errors_per_s)
        self.second = -1
        self.taken: dict[tuple[int, bool], int] = {}  # (lb id, failed) -> kept this second
        self.pending: list[Sample] = []
        self.dropped = 0

    def offer(self, request: Request, resolved: Resolved, now: float) -> bool:
        """Keep the request when its LB's share for this second is not used up; True when kept."""
        if resolved.listener is None or resolved.listener[1].lb_id is None:
            return False
        second = int(now)
        if second != self.second:
            self.second, self.taken = second, {}
        lb_id = resolved.listener[1].lb_id
        key = (lb_id, failed(request))
        if self.taken.get(key, 0) >= self.limits[key[1]]:
            self.dropped += 1
            return False
        self.taken[key] = self.taken.get(key, 0) + 1
        route = resolved.route
        member = resolved.member
        self.pending.append(Sample(
            at=now, lb_id=lb_id, org_id=route[1].org_id if route else resolved.listener[1].org_id,
            route_id=route[0] if route else None, pool_id=member[1].pool_id if member else None,
            member_id=member[0] if member else None, request=request, region=resolved.listener[1].region))
        return True

    def take(self) -> list[Sample]:
        taken, self.pending = self.pending, []
        return taken


def row_values(sample: Sample) -> dict:
    r = sample.request
    return {
        "at": datetime.fromtimestamp(sample.at, UTC), "lb_id": sample.lb_id, "org_id": sample.org_id,
        "route_id": sample.route_id, "pool_id": sample.pool_id, "member_id": sample.member_id, "node": r.node[:128],
        "region": sample.region[:63], "status": max(-1, min(r.status, 999)), "by_proxy": r.by_proxy,
        "termination": r.termination[:4], "t_queue": r.t_queue, "t_connect": r.t_connect,
        "t_upstream": r.t_upstream, "t_total": r.t_total, "retries": min(r.retries, 32767),
        "bytes": r.bytes, "host": r.host[:MAX_HOST], "path": r.path[:MAX_PATH],
    }
