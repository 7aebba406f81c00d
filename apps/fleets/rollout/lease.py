"""A fleet's lease: one reconciler at a time touches a fleet's nodes.

The lease is a conditional UPDATE on the fleet row (`lease_owner`, `lease_until`), renewed per batch. A killed
worker's lease expires after LEASE_S, or is taken over at once when its PID is gone on this host, and the next
reconcile picks the rollout up where it stood.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import UTC, datetime, timedelta
from functools import partial

from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.core.commits import asynchronous_commit
from apps.core.locks import made_by_this_process, process_gone, process_token
from apps.core.prepared import TIME_PROBES, PreparedUpdate
from apps.fleets.models import Fleet

logger = logging.getLogger(__name__)

LEASE_S = 30.0

RENEW_AFTER_S = 5.0  # renew() writes only once the lease is this old (it then has LEASE_S - 5 s left at least)

# Owners of the leases this process claimed and has not released, each with when its lease was last written (the
# monotonic clock read with the `lease_until` written; -inf until the claim is). A lease whose owner names this
# process but is not here was left by a reconcile that ended without releasing it (its release failed: the database
# restarted under it), so the next claim in this process takes it at once instead of waiting LEASE_S for it to expire.
_HELD: dict[str, float] = {}
_HELD_LOCK = threading.Lock()


def _taken(owner: str, until: datetime, clear_queued: bool) -> dict[str, object]:
    taken: dict[str, object] = {"lease_owner": owner, "lease_until": until}
    if clear_queued:
        taken["reconcile_queued"] = False
    return taken


def _claim(*, fleet_id: int, owner: str, now: datetime, until: datetime,
           clear_queued: bool) -> tuple[QuerySet, dict[str, object]]:
    free = Q(lease_owner="") | Q(lease_until__lt=now) | Q(lease_until__isnull=True) | Q(lease_owner=owner)
    return Fleet.objects.filter(free, pk=fleet_id), _taken(owner, until, clear_queued)


def _release(*, fleet_id: int, owner: str) -> tuple[QuerySet, dict[str, object]]:
    return Fleet.objects.filter(pk=fleet_id, lease_owner=owner), {"lease_owner": "", "lease_until": None}


# Each reconcile claims and releases (a route change's path): compiled once (apps.core.prepared).
_PROBES = {"fleet_id": (1, 2), "owner": ("probe-a", "probe-b"),
           "now": TIME_PROBES,
           "until": (datetime(2003, 3, 3, tzinfo=UTC), datetime(2004, 4, 4, tzinfo=UTC))}
_CLAIM = {clear: PreparedUpdate(partial(_claim, clear_queued=clear), _PROBES) for clear in (False, True)}
_RELEASE = PreparedUpdate(_release, {"fleet_id": (1, 2), "owner": ("probe-a", "probe-b")})


def new_owner() -> str:
    return process_token(str(threading.get_ident()))


def _owner_gone(owner: str) -> bool:
    """The lease holder ran on this host and its process no longer exists, or it is this process and no reconcile
    of its own holds it."""
    if made_by_this_process(owner):
        with _HELD_LOCK:
            return owner not in _HELD
    return process_gone(owner)


def claim(fleet_id: int, owner: str, *, clear_queued: bool = False) -> bool:
    """Take the fleet's lease for `owner` when it is free, expired or left by a holder that is gone.
    `clear_queued`: the reconciler's claim also clears `reconcile_queued` in the same statement (it sees every
    change recorded before it, so a change recorded after it must queue a reconcile of its own)."""
    now, written = timezone.now(), time.monotonic()
    until = now + timedelta(seconds=LEASE_S)
    with _HELD_LOCK:
        _HELD[owner] = -math.inf  # before the UPDATE: a holder is never "gone" to its own process
    with asynchronous_commit():  # a lease lost with a database crash expires (LEASE_S)
        if _CLAIM[clear_queued].run(fleet_id=fleet_id, owner=owner, now=now, until=until):
            _written(owner, written)
            return True
    holder = Fleet.objects.filter(pk=fleet_id).values_list("lease_owner", flat=True).first()
    if holder and _owner_gone(holder):
        logger.warning("fleet %s: taking over the lease of %s (its holder is gone)", fleet_id, holder)
        if Fleet.objects.filter(pk=fleet_id, lease_owner=holder).update(**_taken(owner, until, clear_queued)):
            _written(owner, written)
            return True
    with _HELD_LOCK:
        _HELD.pop(owner, None)
    return False


def renew(fleet_id: int, owner: str) -> bool:
    """Extend the lease; False when `owner` no longer holds it. A lease claimed or renewed less than RENEW_AFTER_S
    ago is held for LEASE_S - RENEW_AFTER_S more at least: nobody else can take it (only this module writes those
    columns: fleets.services.fleet_save saves only the fields it was given; and a live holder is never "gone"), so the
    write is left for later (a route change's rollout renewed a lease claimed milliseconds before: a transaction on
    its path)."""
    written = time.monotonic()
    with _HELD_LOCK:
        if written - _HELD.get(owner, -math.inf) < RENEW_AFTER_S:
            return True
    until = timezone.now() + timedelta(seconds=LEASE_S)
    with asynchronous_commit():
        held = bool(Fleet.objects.filter(pk=fleet_id, lease_owner=owner).update(lease_until=until))
    if held:
        _written(owner, written)
    return held


def release(fleet_id: int, owner: str) -> None:
    with _HELD_LOCK:
        _HELD.pop(owner, None)  # first: if the UPDATE fails, the next claim in this process takes the lease over
    with asynchronous_commit():
        _RELEASE.run(fleet_id=fleet_id, owner=owner)


def _written(owner: str, at: float) -> None:
    """`owner`'s lease was written at `at` (monotonic, read before its `lease_until` was computed)."""
    with _HELD_LOCK:
        if owner in _HELD:  # not released meanwhile
            _HELD[owner] = at


def is_free(fleet_id: int) -> bool:
    """No live reconciler holds the fleet's lease: free, expired, or its holder's process is gone (what
    claim would take). One indexed read of the fleet row; touches no node."""
    row = Fleet.objects.filter(pk=fleet_id).values_list("lease_owner", "lease_until").first()
    if row is None:
        return True
    owner, until = row
    return not owner or until is None or until < timezone.now() or _owner_gone(owner)
