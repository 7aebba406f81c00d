"""Settle a fleet now: when `fleet_settle` returns, the fleet's desired state (including the change the
caller just made) has been rolled out -- by this process, or by the reconciler that held the lease.

For a caller that must see its change served before it goes on (ACME proves each new certificate with a
TLS handshake per node), handing the fleet to a queued task is too slow, and a second rollout beside one in
flight is not allowed: the fleet's lease (rollout/lease.py) lets one reconciler at a time touch its nodes. So:

1. Record the change (unless the caller's change recorded itself once committed: balancers.lb_touch
   does, and a second record while a reconciler renders the first would make it render the same state
   twice, and this caller wait for both), then reconcile here. With the lease free, that renders and
   rolls out, done.
2. With the lease held, wait until it is free -- reading the fleet row every POLL_S, not probing nodes
   (a TLS handshake per node and certificate costs CPU the rollout in flight needs) -- then reconcile
   again. The holder loops until quiet, so it has usually rolled the change out already and this
   reconcile finds nothing left; if it rendered just before the change, this one rolls it out. Either
   way one rollout follows the other on the fleet, never two at once.

Bounded by `timeout_s` (a holder that keeps finding new work); then {"busy": True} and the holder,
which re-checks after releasing the lease, still rolls the change out.
"""

from __future__ import annotations

import time
from typing import Any

from apps.fleets.rollout import lease
from apps.fleets.rollout.reconcile import fleet_reconcile
from apps.fleets.rollout.rollouts import change_seq_bump

SETTLE_TIMEOUT_S = 30.0
POLL_S = 0.02


def fleet_settle(*, fleet_id: int, record: bool = True, timeout_s: float = SETTLE_TIMEOUT_S,
                 poll_s: float = POLL_S) -> dict[str, Any]:
    """Have the fleet's desired state, with the caller's change, rolled out before returning (see the module).

    `record=False`: the caller's change was recorded after its commit (fleet_mark_changed, as
    balancers.lb_touch's signal does), so any render that starts after it sees it. Returns fleet_reconcile's
    answer of the last reconcile run here, plus waited_s (time spent waiting for another reconciler's
    lease), or {"busy": True, ...} after timeout_s."""
    if record:
        change_seq_bump([fleet_id])
    deadline = time.monotonic() + timeout_s
    waited = 0.0
    while True:
        result = fleet_reconcile(fleet_id=fleet_id)
        if not result.get("busy"):
            return {**result, "waited_s": waited}
        started = time.monotonic()
        while not lease.is_free(fleet_id):
            if time.monotonic() >= deadline:
                return {"busy": True, "waited_s": waited + time.monotonic() - started}
            time.sleep(poll_s)
        waited += time.monotonic() - started
