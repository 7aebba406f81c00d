"""Settle a fleet now: when `fleet_settle` returns, the fleet's desired state (including the change the
caller just made) has been rolled out -- by this process, or by the reconciler that held the lease.

For a caller that must see its change served before it goes on (ACME proves each new certificate with a
TLS handshake per node), handing the fleet to a queued task is too slow, and a second rollout beside one in
flight is not allowed: the fleet's lease (engine) lets one reconciler at a time touch its nodes. So:

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

`fleets_held` goes one step further for a caller about to make the change: it takes the leases first
(after any rollout in flight), so the reconcile that the change's own record queues finds the fleets busy
and this process -- which rendered the fleet's last revision and still has it in memory -- renders and
rolls the change out at once, with no hop through a queue to another worker rendering the same state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from django.db.models import F

from apps.fleets import engine
from apps.fleets.models import Fleet

SETTLE_TIMEOUT_S = 30.0
POLL_S = 0.02


def fleet_settle(*, fleet_id: int, record: bool = True, owner: str | None = None,
                 timeout_s: float = SETTLE_TIMEOUT_S, poll_s: float = POLL_S) -> dict[str, Any]:
    """Have the fleet's desired state, with the caller's change, rolled out before returning (see the module).

    `record=False`: the caller's change was recorded after its commit (fleet_change_record, as
    balancers.lb_touch's signal does), so any render that starts after it sees it. `owner`: the leases
    held by fleets_held around the change. Returns fleet_reconcile's
    answer of the last reconcile run here, plus waited_s (time spent waiting for another reconciler's
    lease), or {"busy": True, ...} after timeout_s."""
    if record:
        Fleet.objects.filter(pk=fleet_id).update(change_seq=F("change_seq") + 1)
    deadline = time.monotonic() + timeout_s
    waited = 0.0
    while True:
        result = engine.fleet_reconcile(fleet_id=fleet_id, owner=owner)
        if not result.get("busy"):
            return {**result, "waited_s": waited}
        started = time.monotonic()
        while not engine.lease_free(fleet_id):
            if time.monotonic() >= deadline:
                return {"busy": True, "waited_s": waited + time.monotonic() - started}
            time.sleep(poll_s)
        waited += time.monotonic() - started


@contextlib.contextmanager
def fleets_held(fleet_ids: list[int], timeout_s: float = SETTLE_TIMEOUT_S, poll_s: float = POLL_S) -> Iterator[str]:
    """Hold the leases of `fleet_ids` (each claimed once a rollout in flight there ended) around a change
    and its fleet_settle(owner=...); yields the owner (see the module). A lease not free within
    timeout_s is not held: fleet_settle then waits for it as usual. On leaving, leases still held are
    released, and a fleet left with a change not rendered (the caller failed before settling it; the
    reconcile its record queued found the fleet busy) gets a reconcile queued."""
    owner = engine.new_owner()
    deadline = time.monotonic() + timeout_s
    held = []
    try:
        for fleet_id in sorted(set(fleet_ids)):
            while not engine.lease_claim(fleet_id, owner) and time.monotonic() < deadline:
                time.sleep(poll_s)
            held.append(fleet_id)
        yield owner
    finally:
        from apps.fleets.services import request_reconcile

        for fleet_id in held:
            engine.lease_release(fleet_id, owner)
            if Fleet.objects.filter(pk=fleet_id, auto_rollout=True, change_seq__gt=F("rendered_seq")).exists():
                request_reconcile(fleet_id)
