"""Steering decisions that follow health, with hysteresis: which regions fail over, which are drained.

Pure. The enforcement loop calls `decide` about four times a second with each region's healthy share
of members (usable active servers / configured members, from the nodes' `show stat`) and the previous
decision; the planner (`overflow.Steering`) takes the result as given.

- Failover threshold t (GCP: 1..99%, 70% default): a region whose healthy share falls below t fails
  over (its traffic goes to the nearest healthy region; it serves only as a last resort). It comes
  back when its share reaches t + FAILBACK_MARGIN and has stayed there HOLD_S: a region flapping
  around t does not move its traffic every second.
- Auto capacity drain (GCP's, at 25%): a region under DRAIN_BELOW is drained (serves nothing); it is
  undrained at UNDRAIN_AT after HOLD_S. Never more than half of the pool's regions are drained at
  once: when more qualify, the least healthy are drained (those drained already first, so a draining
  does not hop between regions of equal health).
Every change is returned as an event line, so the caller records exactly the transitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

FAILBACK_MARGIN: Final = 0.10
DRAIN_BELOW: Final = 0.25
UNDRAIN_AT: Final = 0.35
HOLD_S: Final = 5.0


@dataclass(frozen=True)
class Decision:
    failed_over: frozenset[str] = frozenset()
    drained: frozenset[str] = frozenset()
    recovering_since: Mapping[str, float] = field(default_factory=dict)  # region -> when it first looked well

    def to_json(self) -> dict:
        return {"failed_over": sorted(self.failed_over), "drained": sorted(self.drained),
                "recovering_since": dict(self.recovering_since)}

    @classmethod
    def from_json(cls, data: Mapping | None) -> Decision:
        if not data:
            return cls()
        return cls(frozenset(data.get("failed_over", ())), frozenset(data.get("drained", ())),
                   {str(k): float(v) for k, v in (data.get("recovering_since") or {}).items()})


@dataclass(frozen=True)
class Change:
    region: str
    action: str  # "failed_over" | "failed_back" | "drained" | "undrained"
    healthy_share: float


def decide(shares: Mapping[str, float], threshold: float | None, auto_drain: bool, previous: Decision,
           now: float) -> tuple[Decision, list[Change]]:
    """The next decision from each region's healthy share (0..1), and the transitions it makes."""
    recovering = dict(previous.recovering_since)
    changes: list[Change] = []

    def comes_back(region: str, back_at: float) -> bool:
        if shares[region] < back_at:
            recovering.pop(region, None)
            return False
        since = recovering.setdefault(region, now)
        return now - since >= HOLD_S

    failed: set[str] = set()
    if threshold is not None:
        for region in sorted(shares):
            if region in previous.failed_over:
                if comes_back(region, threshold + FAILBACK_MARGIN):
                    changes.append(Change(region, "failed_back", shares[region]))
                    recovering.pop(region, None)
                else:
                    failed.add(region)
            elif shares[region] < threshold:
                failed.add(region)
                changes.append(Change(region, "failed_over", shares[region]))

    drained: set[str] = set()
    if auto_drain:
        candidates = []
        for region in sorted(shares):
            if region in previous.drained:
                if not comes_back(region, UNDRAIN_AT):
                    candidates.append(region)
            elif shares[region] < DRAIN_BELOW:
                candidates.append(region)
        candidates.sort(key=lambda r: (r not in previous.drained, shares[r], r))
        drained = set(candidates[:len(shares) // 2])
    for region in sorted(previous.drained - drained):
        changes.append(Change(region, "undrained", shares.get(region, 0.0)))
        recovering.pop(region, None)
    for region in sorted(drained - previous.drained):
        changes.append(Change(region, "drained", shares[region]))
    keep = failed | drained
    recovering = {r: t for r, t in recovering.items() if r in keep}
    return Decision(frozenset(failed), frozenset(drained), recovering), changes
