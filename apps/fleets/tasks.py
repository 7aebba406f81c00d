"""Celery tasks for fleets: thin, take ids, idempotent (re-running one converges)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from apps.balancers.services import route_changes_prune
from apps.core.enqueue import enqueue
from apps.fleets import services
from apps.fleets.beat import CONVERGE_EVERY_S
from apps.fleets.models import Fleet, Rollout

logger = logging.getLogger(__name__)


# A reconcile the database failed under (restarted, failed over, a lock timeout) is run again every 2 s for two minutes:
# left to the next converge (every 10 s), the changes written before the fault waited up to 15 s after the database
# was back in bench-chaos. Safe: a reconcile is idempotent, and the lease it may have left is taken over (lease._HELD).
@shared_task(name="fleets.reconcile_task", autoretry_for=(OperationalError, InterfaceError), max_retries=60,
             retry_backoff=2, retry_backoff_max=2, retry_jitter=False)
def reconcile_task(fleet_id: int) -> dict[str, Any]:
    """Render if desired state moved and run the fleet's newest rollout (apps.fleets.rollout.reconcile)."""
    result = services.fleet_reconcile(fleet_id=fleet_id)
    # A deleted fleet's lease cannot be claimed: asked only then, not before every reconcile (a round trip on each
    # route change's path).
    if result.get("busy") and not Fleet.objects.filter(pk=fleet_id).exists():
        return {"missing": True}
    return result


@shared_task(name="fleets.member_runtime_task")
def member_runtime_task(member_id: int) -> dict[str, str | None]:
    return services.member_runtime_apply(member_id=member_id)


@shared_task(name="fleets.converge_task")
def converge_task() -> dict[str, Any]:
    """Level-triggered safety net (beat): hands each fleet's converge to the worker holding its route lane."""
    route_changes_prune()  # the route lane reads an hour at most; older state renders in full
    fleets = list(Fleet.objects.values_list("pk", flat=True))
    for fleet_id in fleets:
        # A converge still queued at the next tick is dropped (that tick queues a fresh one): on a busy shard
        # they piled up behind each other and took the threads the fleet's route changes wait for.
        converge_fleet_task.apply_async((fleet_id,), expires=CONVERGE_EVERY_S)
    return {"fleets": len(fleets)}


_CONVERGING: set[int] = set()  # fleets whose converge runs in this process now
_CONVERGING_LOCK = threading.Lock()


@contextmanager
def _converging(fleet_id: int) -> Iterator[bool]:
    """True when this call may converge the fleet: no other converge of it runs in this process (a fleet's
    converges run on its shard's one process, apps.fleets.rollout.queues)."""
    with _CONVERGING_LOCK:
        mine = fleet_id not in _CONVERGING
        _CONVERGING.add(fleet_id)
    try:
        yield mine
    finally:
        if mine:
            with _CONVERGING_LOCK:
                _CONVERGING.discard(fleet_id)


@shared_task(name="fleets.converge_fleet_task")
def converge_fleet_task(fleet_id: int) -> dict[str, Any]:
    """Renders missed changes, resumes rollouts a dead worker left, re-converges drifted nodes and nodes that
    came back. On the fleet's shard queue (apps.fleets.rollout.queues): the drift check renders each node's applied
    revision, which the process holding the fleet's route lane has at hand (a lane revision elsewhere is a full
    render: seconds at 100k routes, under the fleet's lease, so route changes waited behind it)."""
    with _converging(fleet_id) as mine:
        if not mine:
            logger.info("fleet %s: a converge is still running; this one is skipped", fleet_id)
            return {"skipped": "a converge of this fleet is running"}
        try:
            return _converge_fleet(fleet_id)
        except (OperationalError, InterfaceError):
            # The database failed under it, maybe while it held the fleet's lease: the reconciles that found the
            # lease taken left their changes to it, and it could not look again. A reconcile (which retries every
            # 2 s) picks them up once the database is back, not the next converge tick (bench-chaos: 11.7 s
            # after a 30 s PostgreSQL outage). No database needed to send it.
            enqueue("fleets.reconcile_task", fleet_id, countdown=2)
            raise


def _converge_fleet(fleet_id: int) -> dict[str, Any]:
    fleet = Fleet.objects.filter(pk=fleet_id).first()
    if fleet is None:
        return {}
    done: dict[str, Any] = {}
    stale = Rollout.objects.filter(fleet=fleet, status__in=Rollout.ACTIVE).exists()
    missed = fleet.auto_rollout and fleet.change_seq > fleet.rendered_seq
    if missed or stale:
        done["reconcile"] = services.fleet_reconcile(fleet_id=fleet.pk)
        fleet.refresh_from_db()
    rollout = services.fleet_converge(fleet=fleet, enqueue=False)
    if rollout is not None:
        logger.info("fleet %s: converging %s", fleet.name, rollout)
        done["converge"] = services.fleet_reconcile(fleet_id=fleet.pk)
    return done


@shared_task(name="fleets.health_task")
def health_task() -> dict[str, int]:
    """Collect every fleet's health, then hand it to the capacity model (re-renders what it changed)."""
    collected = {fleet.name: services.fleet_health_collect(fleet=fleet)
                 for fleet in Fleet.objects.filter(nodes__enabled=True).distinct()}
    services.fleet_capacity_follow()
    return collected


@shared_task(name="fleets.enforce_task", ignore_result=True)
def enforce_task() -> dict[str, object]:
    """Each node's share of each region's capacity, from the demand it sees now (apps.fleets.enforcement).
    The fallback of the `enforcer` process: it does nothing while one runs (that one runs 4 times as often)."""
    from apps.fleets.enforcement import enforce, enforcer_running

    if enforcer_running():
        return {"skipped": "enforcer process running"}
    return enforce()
