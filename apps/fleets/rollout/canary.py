"""A watched canary: after the first node takes a revision, it serves alone while what its clients get is
compared with what the other nodes' clients get; a rise in 5xx share or p99 latency past the fleet's guards
stops the rollout before any other node sees the revision (execute.py restores the canary).

The figures come from the request log (apps.signals), which sits above fleets: it registers a judge here when
its app loads, so fleets reads no signal itself. With no judge, or no traffic on the canary, the watch passes
when its time is up: a canary no client used proves nothing, and says so in the rollout's record.

Semantics, written down because an operator reads the reason:
- compared: the canary's requests since it applied with the other nodes' over the same seconds (same clients,
  same moment, the old revision); when the others saw too few, with the canary's own minute before the change;
- 5xx share rise = canary share - baseline share, in percentage points, judged once each side has MIN_REQUESTS;
  p99 rise = canary p99 - baseline p99 in ms, judged once each side has MIN_P99_REQUESTS (the p99 of 20
  requests is their slowest one: one slow first request after a reload would roll back a good revision);
  guard 0: not judged;
- the first judgement past a guard ends the watch; otherwise it ends after `canary_watch_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

MIN_REQUESTS = 20
MIN_P99_REQUESTS = 200
POLL_S = 1.0


@dataclass(frozen=True)
class Watch:
    fleet_id: int
    canary: str  # the canary node's label, "fleet/node" (Node.label)
    others: tuple[str, ...]
    since: datetime  # when the canary started serving the revision
    max_5xx_rise_pct: float
    max_p99_rise_ms: int
    lb_ids: tuple[int, ...] = ()  # the LBs the revision changed (judged on their traffic alone); (): all


@dataclass(frozen=True)
class Verdict:
    failed: bool
    reason: str  # what an operator reads on the rollout and in the event
    figures: dict[str, float]


Judge = Callable[[Watch], Verdict | None]  # None: nothing to judge yet (too few requests, or no signals)
_JUDGES: list[Judge] = []


def register(judge: Judge) -> None:
    if judge not in _JUDGES:
        _JUDGES.append(judge)


def judge(watch: Watch) -> Verdict | None:
    for each in _JUDGES:
        verdict = each(watch)
        if verdict is not None:
            return verdict
    return None


def watch_canary(watch: Watch, seconds: float, keep_going: Callable[[], bool]) -> Verdict:
    """Judge every POLL_S until a guard trips or `seconds` pass; `keep_going` (the lease) may end it early."""
    deadline = time.monotonic() + seconds
    last: Verdict | None = None
    while True:
        verdict = judge(watch)
        if verdict is not None:
            if verdict.failed:
                return verdict
            last = verdict
        if time.monotonic() >= deadline or not keep_going():
            break
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    if last is None:
        return Verdict(False, f"the canary served no judged traffic in {seconds:g} s: passed unjudged", {})
    return last
