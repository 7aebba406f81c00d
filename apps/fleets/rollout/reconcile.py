"""The reconcile loop: one reconciler per fleet at a time renders what moved and runs the newest rollout.

Level-triggered: every entry point (a change, an API rollout, the periodic converge) ends in
`fleet_reconcile`, which renders if desired state moved, then runs the newest active rollout, and loops
until nothing is left. Only the holder of the fleet's lease (rollout/lease.py) touches its nodes.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from apps.core.commits import asynchronous_commit
from apps.core.prepared import PreparedQuery, PreparedUpdate
from apps.fleets.config.revisions import AUTO_RENDER_REASON, fleet_render
from apps.fleets.models import ConfigRevision, Fleet, Rollout
from apps.fleets.rollout import lease
from apps.fleets.rollout.execute import execute, finish
from apps.fleets.rollout.rollouts import change_seq_bump, request_reconcile, rollout_create

MAX_LOOPS = 50  # a reconcile hands over to a fresh task after this many rounds


def _fleet_with_region(fleet_id: int) -> QuerySet:
    return Fleet.objects.select_related("region").filter(pk=fleet_id)


def _active_rollouts(fleet_id: int) -> QuerySet:
    # Read as execute needs it (its fleet and revision with it): execute does not read it again.
    return (Rollout.objects.filter(fleet_id=fleet_id, status__in=Rollout.ACTIVE).with_fleet_and_revision()
            .order_by("-id"))


def _fleet_state(fleet_id: int) -> QuerySet:
    active = Rollout.objects.filter(fleet=OuterRef("pk"), status__in=Rollout.ACTIVE)
    return (Fleet.objects.filter(pk=fleet_id).annotate(active=Exists(active))
            .values_list("auto_rollout", "change_seq", "rendered_seq", "active"))


_FLEET_ID = {"fleet_id": (1, 2)}
_SEQS = {"fleet_id": (1, 2), "seq": (3, 4)}
# Read or written on every pass of every reconcile (a route change's path): compiled once, not on each use.
_FLEET = PreparedQuery(_fleet_with_region, probes=_FLEET_ID)
_ACTIVE_ROLLOUTS = PreparedQuery(_active_rollouts, probes=_FLEET_ID)
_FLEET_STATE = PreparedQuery(_fleet_state, probes=_FLEET_ID)
_UNCHANGED_SINCE = PreparedQuery(
    lambda fleet_id, seq: Fleet.objects.filter(pk=fleet_id, change_seq=seq).values_list("pk", flat=True)[:1], _SEQS)
_RENDERED = PreparedUpdate(
    lambda fleet_id, seq: (Fleet.objects.filter(pk=fleet_id, rendered_seq__lt=seq), {"rendered_seq": seq}), _SEQS)
_REFUSED_BY_CANARY = PreparedQuery(
    lambda revision_id: Rollout.objects.filter(revision_id=revision_id, stopped_by_canary=True)
    .values_list("pk", flat=True)[:1], {"revision_id": (1, 2)})
_QUEUED_CLEARED = PreparedUpdate(
    lambda fleet_id: (Fleet.objects.filter(pk=fleet_id, reconcile_queued=True), {"reconcile_queued": False}), _FLEET_ID)


def fleet_reconcile(*, fleet_id: int) -> dict[str, Any]:
    """Render if desired state moved, run the newest active rollout, repeat until quiet.

    Returns {"busy": True} when another reconciler holds the lease: it loops until quiet, and it
    re-checks after releasing, so no change is lost.
    """
    owner = lease.new_owner()
    # The claim clears reconcile_queued in its own statement: a change recorded from here on queues a reconcile.
    if not lease.claim(fleet_id, owner, clear_queued=True):
        # The holder loops until quiet, then clears reconcile_queued and queues again for what it missed
        # (request_reconcile_if_due). Clearing the flag here made every route change queue a task that only
        # found the lease taken: 1,400 of 1,450 tasks of a shard worker in bench-scale's sustained run.
        return {"busy": True}
    ran: list[int] = []
    rendered: list[int] = []
    try:
        for _ in range(MAX_LOOPS):
            fleet = _FLEET.first(fleet_id=fleet_id)
            if fleet is None:
                raise Fleet.DoesNotExist(f"fleet {fleet_id}")
            seq = fleet.change_seq
            # Held changes (auto_rollout off) wait for fleet_push; they stay visible in the preview.
            if seq > fleet.rendered_seq and fleet.auto_rollout:
                revision = fleet_render(fleet=fleet, reason=AUTO_RENDER_REASON, seqs=(seq, fleet.route_seq))
                rendered.append(revision.number)
                # The render read change_seq itself, maybe past `seq` (a change recorded meanwhile, whose
                # routes it read too): marking only `seq` made the next loop render that change again,
                # with nothing recorded since the route lane's state, which sends it to the full render.
                covered = max(seq, getattr(revision, "covered_seq", seq))
                # One transaction (a route change's path: each is 3 round trips more), lost with a crash: the
                # converge renders the change again (missed) and makes its rollout again.
                with asynchronous_commit():
                    _RENDERED.run(fleet_id=fleet_id, seq=covered)
                    # A revision a watched canary refused comes back from the render unchanged when nothing in it
                    # moved since (a fleet setting saved): sent again, its canary's clients would meet it again.
                    refused = bool(_REFUSED_BY_CANARY.all(revision_id=revision.pk))
                    if revision.validation_ok and revision.number != fleet.desired_revision and not refused:
                        # Only certificate contents moved (a renewal): no config change for a canary to try
                        # first, and each certificate was checked when stored; every node at once halves
                        # the rotation's time on the nodes (a failing node still falls back and rolls back).
                        certs_only = revision.validation_kind == ConfigRevision.Validation.CERTIFICATES_ONLY
                        # A route-lane revision moves map entries only (haproxy.cfg is the base's), each read back
                        # from every node: a canary would try nothing the other nodes do not check themselves,
                        # unless it is watched (what clients get from a route is the point of a route change).
                        lane = (revision.validation_kind == ConfigRevision.Validation.ROUTE_LANE
                                and not fleet.canary_watch_s)
                        rollout_create(fleet=fleet, revision=revision, enqueue=False,
                                       canary=False if certs_only or lane else None,
                                       running=not fleet.restore_hold)  # run below, unless held
            if fleet.restore_hold:
                break  # rollouts wait for an operator (rollout/restore.py)
            rollout = _next_rollout(fleet)
            if rollout is not None:
                execute(rollout, owner)
                ran.append(rollout.pk)
                if not lease.renew(fleet_id, owner):
                    return {"rendered": rendered, "rollouts": ran, "lease_lost": True}
                continue
            if not fleet.auto_rollout or _UNCHANGED_SINCE.all(fleet_id=fleet_id, seq=seq):
                break
    finally:
        lease.release(fleet_id, owner)
        # A change or rollout that arrived after our last look found the lease taken and gave up, leaving
        # reconcile_queued set for this holder: looked at when this loop failed too, or they would wait for the
        # converge (and every change after them, which finds the flag set).
        request_reconcile_if_due(fleet_id)
    return {"rendered": rendered, "rollouts": ran}


def request_reconcile_if_due(fleet_id: int) -> None:
    """After holding a fleet's lease: queue a reconcile when a change or rollout is waiting (a reconcile that
    found the lease taken gave up and left it to the holder)."""
    # Cleared first, then read: a change recorded before the clear is seen by the read (its row lock makes the clear
    # wait for its commit), and one after it finds the flag clear and queues its own reconcile.
    _QUEUED_CLEARED.run(fleet_id=fleet_id)
    row = _FLEET_STATE.first(fleet_id=fleet_id)
    if row is None:
        return
    auto_rollout, change_seq, rendered_seq, active_rollout = row
    if (auto_rollout and change_seq > rendered_seq) or active_rollout:  # a change missed, or a rollout waiting
        request_reconcile(fleet_id)


def _next_rollout(fleet: Fleet) -> Rollout | None:
    """The newest pending or running rollout; older active ones are superseded by it."""
    active = _ACTIVE_ROLLOUTS.all(fleet_id=fleet.pk)
    if not active:
        return None
    for stale in active[1:]:
        finish(stale, Rollout.Status.SUPERSEDED, "superseded by a newer rollout")
    return active[0]


def fleet_reconcile_now(*, fleet_id: int) -> dict[str, Any]:
    """Mark the fleet's desired state changed and reconcile it in this process; a queued reconcile finds
    it done. Returns {"busy": True} at once when another reconciler holds the lease: a caller that must
    see its change served before going on (ACME's handshake check) uses rollout.settle.fleet_settle."""
    change_seq_bump([fleet_id])
    return fleet_reconcile(fleet_id=fleet_id)
