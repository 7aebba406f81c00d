"""The rollout engine: one reconciler per fleet at a time, canary then batches, drift, health.

Level-triggered: every entry point (a change, an API rollout, the periodic converge) ends in
`fleet_reconcile`, which renders if desired state moved, then runs the newest active rollout,
and loops until nothing is left. Only the holder of the fleet's lease (a conditional UPDATE on the
fleet row, renewed per batch) touches its nodes; a killed worker's lease expires, or is taken over
at once when its PID is gone on this host, and the next run picks the rollout up where it stood:
nodes already serving the revision are verified, not reloaded.

Node I/O runs in threads (apps.fleets.delivery, no database); all database writes happen here, in
the calling thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connections, transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.core import wakeups
from apps.core.bulk import bulk_set
from apps.core.commits import fast_commit
from apps.fleets import emit, routelane, selectors
from apps.fleets.delivery import (
    NodeOutcome,
    NodePlan,
    apply_node,
    precheck_binds,
    reachable,
)
from apps.fleets.models import REVISION_BULK_FIELDS, ConfigRevision, Fleet, Node, NodeHealth, NodeResult, Rollout
from apps.fleets.nodeops import read_state
from apps.fleets.render import UnsafeValue, render
from apps.fleets.snapshot import ConfigBundle, FleetSnapshot, NodeSpec
from apps.traffic.services import NodeReadings, readings_from_stats, readings_record

logger = logging.getLogger(__name__)

LEASE_S = 30.0
# True: local nodes run `haproxy -c` on every push as SSH nodes do (see CentrallyValidatedLocalTransport).
REVALIDATE_LOCAL_NODES = getattr(settings, "FLEET_REVALIDATE_LOCAL_NODES", False)
MAX_LOOPS = 50  # a reconcile hands over to a fresh task after this many rounds
NODE_THREADS = 16
HEALTH_CACHE_S = 120


def health_cache_key(fleet_id: int) -> str:
    return f"fleets:health:{fleet_id}"


# --- lease -------------------------------------------------------------------------------------------


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


def _owner_gone(owner: str) -> bool:
    """The lease holder ran on this host and its process no longer exists."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # A killed worker whose parent died too can linger as a zombie (state Z) until reaped.
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def lease_claim(fleet_id: int, owner: str) -> bool:
    now = timezone.now()
    until = now + timedelta(seconds=LEASE_S)
    free = Q(lease_owner="") | Q(lease_until__lt=now) | Q(lease_until__isnull=True) | Q(lease_owner=owner)
    with fast_commit():  # a lease lost with a database crash expires (LEASE_S)
        if Fleet.objects.filter(free, pk=fleet_id).update(lease_owner=owner, lease_until=until):
            return True
    holder = Fleet.objects.filter(pk=fleet_id).values_list("lease_owner", flat=True).first()
    if holder and _owner_gone(holder):
        logger.warning("fleet %s: taking over the lease of %s (process gone)", fleet_id, holder)
        return bool(Fleet.objects.filter(pk=fleet_id, lease_owner=holder).update(lease_owner=owner,
                                                                                 lease_until=until))
    return False


def lease_renew(fleet_id: int, owner: str) -> bool:
    until = timezone.now() + timedelta(seconds=LEASE_S)
    with fast_commit():
        return bool(Fleet.objects.filter(pk=fleet_id, lease_owner=owner).update(lease_until=until))


def lease_release(fleet_id: int, owner: str) -> None:
    with fast_commit():
        Fleet.objects.filter(pk=fleet_id, lease_owner=owner).update(lease_owner="", lease_until=None)


def lease_free(fleet_id: int) -> bool:
    """No live reconciler holds the fleet's lease: free, expired, or its holder's process is gone (what
    lease_claim would take). One indexed read of the fleet row; touches no node."""
    row = Fleet.objects.filter(pk=fleet_id).values_list("lease_owner", "lease_until").first()
    if row is None:
        return True
    owner, until = row
    return not owner or until is None or until < timezone.now() or _owner_gone(owner)


# --- reconcile loop ------------------------------------------------------------------------------------


def fleet_reconcile(*, fleet_id: int) -> dict[str, Any]:
    """Render if desired state moved, run the newest active rollout, repeat until quiet.

    Returns {"busy": True} when another reconciler holds the lease: it loops until quiet, and it
    re-checks after releasing, so no change is lost.
    """
    from apps.fleets.services import (
        AUTO_RENDER_REASON,
        CERTIFICATES_ONLY_NOTE,
        fleet_render,
        rollout_create,
    )

    owner = new_owner()
    if not lease_claim(fleet_id, owner):
        # The holder loops until quiet, then clears reconcile_queued and queues again for what it missed
        # (request_reconcile_if_due). Clearing the flag here made every route change queue a task that only
        # found the lease taken: 1,400 of 1,450 tasks of a shard worker in bench-scale's sustained run.
        return {"busy": True}
    Fleet.objects.filter(pk=fleet_id).update(reconcile_queued=False)
    ran: list[int] = []
    rendered: list[int] = []
    try:
        for _ in range(MAX_LOOPS):
            fleet = Fleet.objects.select_related("region").get(pk=fleet_id)
            seq = fleet.change_seq
            # Held changes (auto_rollout off) wait for fleet_push; they stay visible in the preview.
            if seq > fleet.rendered_seq and fleet.auto_rollout:
                revision = fleet_render(fleet=fleet, reason=AUTO_RENDER_REASON)
                rendered.append(revision.number)
                # The render read change_seq itself, maybe past `seq` (a change recorded meanwhile, whose
                # routes it read too): marking only `seq` made the next loop render that change again,
                # with nothing recorded since the route lane's state, which sends it to the full render.
                covered = max(seq, getattr(revision, "covered_seq", seq))
                with fast_commit():  # lost with a crash: the converge renders the change again (missed)
                    Fleet.objects.filter(pk=fleet_id, rendered_seq__lt=covered).update(rendered_seq=covered)
                if revision.validation_ok and revision.number != fleet.desired_revision:
                    # Only certificate contents moved (a renewal): no config change for a canary to try
                    # first, and each certificate was checked when stored; every node at once halves
                    # the rotation's time on the nodes (a failing node still falls back and rolls back).
                    certs_only = revision.validation_output == CERTIFICATES_ONLY_NOTE
                    # A route-lane revision moves map entries only (haproxy.cfg is the base's), each read back
                    # from every node: a canary would try nothing the other nodes do not check themselves.
                    lane = revision.base_id is not None
                    with fast_commit():  # the engine's own rollout: lost with a crash, the converge makes it again
                        rollout_create(fleet=fleet, revision=revision, enqueue=False,
                                       canary=False if certs_only or lane else None)
            rollout = _next_rollout(fleet)
            if rollout is not None:
                _execute(rollout, owner)
                ran.append(rollout.pk)
                if not lease_renew(fleet_id, owner):
                    return {"rendered": rendered, "rollouts": ran, "lease_lost": True}
                continue
            if not fleet.auto_rollout or Fleet.objects.filter(pk=fleet_id, change_seq=seq).exists():
                break
    finally:
        lease_release(fleet_id, owner)
        # A change or rollout that arrived after our last look found the lease taken and gave up, leaving
        # reconcile_queued set for this holder: looked at when this loop failed too, or they would wait for the
        # converge (and every change after them, which finds the flag set).
        request_reconcile_if_due(fleet_id)
    return {"rendered": rendered, "rollouts": ran}


def request_reconcile_if_due(fleet_id: int) -> None:
    """After holding a fleet's lease: queue a reconcile when a change or rollout is waiting (a reconcile that
    found the lease taken gave up and left it to the holder)."""
    from apps.fleets.services import request_reconcile

    # Cleared first, then read: a change recorded before the clear is seen by the read (its row lock makes the clear
    # wait for its commit), and one after it finds the flag clear and queues its own reconcile.
    Fleet.objects.filter(pk=fleet_id, reconcile_queued=True).update(reconcile_queued=False)
    fleet = Fleet.objects.filter(pk=fleet_id).first()
    if fleet is None:
        return
    missed = fleet.auto_rollout and fleet.change_seq > fleet.rendered_seq
    if missed or _next_rollout(fleet) is not None:
        request_reconcile(fleet_id)


def _next_rollout(fleet: Fleet) -> Rollout | None:
    """The newest pending or running rollout; older active ones are superseded by it."""
    active = list(Rollout.objects.filter(fleet=fleet, status__in=Rollout.ACTIVE).order_by("-id"))
    if not active:
        return None
    for stale in active[1:]:
        _finish(stale, Rollout.Status.SUPERSEDED, "superseded by a newer rollout")
    return active[0]


# --- rollout execution -----------------------------------------------------------------------------------


_BUNDLE_CACHE: OrderedDict[tuple, ConfigBundle] = OrderedDict()
_BUNDLE_CACHE_SIZE = 512
# Also bounded by map entries held: a 100k-route bundle holds ~400k (tens of MB), and a sustained run of
# route changes renders a revision per change for every node.
_BUNDLE_CACHE_ENTRIES = 3_000_000


def _weight(bundle: ConfigBundle) -> int:
    return 1 + sum(len(entries) for entries in bundle.facts.maps.values())


def _evict() -> None:
    held = sum(_weight(b) for b in _BUNDLE_CACHE.values())
    while _BUNDLE_CACHE and (len(_BUNDLE_CACHE) > _BUNDLE_CACHE_SIZE or held > _BUNDLE_CACHE_ENTRIES):
        held -= _weight(_BUNDLE_CACHE.popitem(last=False)[1])


class _BundleCache:
    """Renders each (revision, node) once: a revision never changes, so a worker keeps recent
    bundles (the next rollout's rollback target is this rollout's bundle)."""

    def __init__(self) -> None:
        self._snaps: dict[int, FleetSnapshot] = {}

    def bundle(self, revision: ConfigRevision, node: Node, spec: NodeSpec | None = None) -> ConfigBundle:
        spec = spec or selectors.node_spec(node)
        key = (revision.pk, revision.number, revision.fleet_id, revision.sha256, spec)  # no bulk field read
        cached = _BUNDLE_CACHE.get(key)
        if cached is not None:
            with contextlib.suppress(KeyError):  # evicted meanwhile by a reconcile in another thread
                _BUNDLE_CACHE.move_to_end(key)
            return cached
        # A route-lane revision: the node's bundle of its base with the moved maps (routelane).
        bundle = routelane.node_bundle(revision, node.name, lambda base_key: _BUNDLE_CACHE.get((*base_key, spec)))
        if bundle is None:
            snap = self._snaps.get(revision.pk)
            if snap is None:
                snap = self._snaps[revision.pk] = selectors.revision_snapshot(revision)
            bundle = render(snap, spec)
        _BUNDLE_CACHE[key] = bundle
        with contextlib.suppress(KeyError, RuntimeError):  # another thread changing the cache meanwhile
            _evict()
        return bundle


def _plan(renderer: _BundleCache, rollout: Rollout, node: Node,
          challenges: tuple[tuple[str, str], ...] = ()) -> NodePlan:
    last_good = None
    if node.applied_revision is not None and node.applied_revision.validation_ok:
        with contextlib.suppress(UnsafeValue):
            last_good = renderer.bundle(node.applied_revision, node)
            if node.applied_sha256 and last_good.sha256 != node.applied_sha256:
                # The node's own setting changed since it applied that revision (drained or not): what it serves
                # is the revision with the setting it had, which makes a drain a map change, not a reload.
                spec = selectors.node_spec(node)
                before = renderer.bundle(node.applied_revision, node, replace(spec, drained=not spec.drained))
                if before.sha256 == node.applied_sha256:
                    last_good = before
    applied_here = node.applied_revision_id == rollout.revision_id
    conn = selectors.node_conn(node)
    return NodePlan(
        conn=conn,
        bundle=renderer.bundle(rollout.revision, node),
        last_good=last_good,
        applied_sha256=node.applied_sha256 if applied_here else "",
        worker_pid=node.worker_pid,
        prevalidated=_same_binary_as_central(conn),
        recorded_clean=node.status == Node.Status.UP,
        challenges=challenges,
    )


def _same_binary_as_central(conn) -> bool:
    """A local node running the haproxy binary Spillway validates with (see delivery)."""
    if conn.transport != "local" or REVALIDATE_LOCAL_NODES:
        return False
    central, own = shutil.which(settings.HAPROXY_BIN), shutil.which(conn.haproxy_bin)
    return central is not None and own is not None and os.path.realpath(central) == os.path.realpath(own)


def _batches(items: list[NodeResult], canary: bool, batch_size: int) -> list[list[NodeResult]]:
    batches: list[list[NodeResult]] = []
    rest = list(items)
    if canary and rest:
        batches.append([rest.pop(0)])
    size = batch_size if batch_size > 0 else max(1, len(rest))
    batches += [rest[i : i + size] for i in range(0, len(rest), size)]
    return batches


# Kept across rollouts: starting a thread waits for it to take the interpreter lock, up to a switch interval (5 ms)
# while other threads compute, and a rollout started one per node twice (preflight, apply): a tenth of a shard
# worker's lock time in bench-scale's sustained run went to Thread.start.
_NODES = ThreadPoolExecutor(max_workers=2 * NODE_THREADS, thread_name_prefix="spillway-nodes")


def _parallel(fn, items: list) -> list:
    if len(items) == 1:
        return [fn(items[0])]
    if threading.current_thread().name.startswith("spillway-nodes"):
        # Called from one of _NODES' own threads: waiting there on the same pool could wait for good.
        with ThreadPoolExecutor(max_workers=min(NODE_THREADS, len(items))) as pool:
            return list(pool.map(fn, items))

    def run(item):  # type: ignore[no-untyped-def]
        try:
            return fn(item)
        finally:
            connections.close_all()  # a query made here leaves no connection behind in a thread that lives on

    return list(_NODES.map(run, items))


def _finish(rollout: Rollout, status: str, error: str = "") -> None:
    now = timezone.now()
    started = rollout.started_at or now
    with fast_commit():
        Rollout.objects.filter(pk=rollout.pk).update(
            status=status, error=error[:20000], finished_at=now,
            duration_ms=(now - started).total_seconds() * 1000.0 if rollout.started_at else None,
        )
        open_results = [NodeResult.Status.PENDING, NodeResult.Status.RUNNING]
        NodeResult.objects.filter(rollout=rollout, status__in=open_results).update(
            status=NodeResult.Status.SKIPPED, error="not attempted: the rollout stopped first")
        rollout.status = status
        if status == Rollout.Status.SUCCEEDED and rollout.rollback_of_id:
            Rollout.objects.filter(pk=rollout.rollback_of_id).update(status=Rollout.Status.ROLLED_BACK)
    emit.rollout_finished(rollout, status, error)


def _record(batch: list[NodeResult], outcomes: list[NodeOutcome], rollout: Rollout) -> None:
    """A batch's node results and nodes in a few statements, whatever the batch size (three statements per
    node were ~8 ms a node on a route change's path, before the `applied` long-polls could see it), in one
    transaction that does not wait for the disk (apps.core.commits: a node record lost with a database crash
    makes the node look drifted, and the converge pushes it again)."""
    with fast_commit():
        _record_in(batch, outcomes, rollout)


def _record_in(batch: list[NodeResult], outcomes: list[NodeOutcome], rollout: Rollout) -> None:
    now = timezone.now()
    statuses = {"succeeded": NodeResult.Status.SUCCEEDED, "rolled_back": NodeResult.Status.ROLLED_BACK}
    before = {n.pk: n for n in Node.objects.filter(pk__in=[r.node_id for r in batch]).order_by()
              .only("pk", "name", "fleet_id", "status")}
    updates: dict[int, dict[str, Any]] = {}
    for result, outcome in zip(batch, outcomes, strict=True):
        node_update: dict[str, Any] = {"last_seen": now}
        if outcome.ok:
            # Recorded only now, once the node proved it: after a reload `show proc`, the listener probes and
            # proxies (delivery.verify); after a runtime update, every moved key or certificate read back.
            node_update.update(applied_revision=rollout.revision, applied_sha256=outcome.sha256,
                               worker_pid=outcome.worker_pid, status=Node.Status.UP, status_detail="")
        elif outcome.unreachable:
            node_update = {"status": Node.Status.DOWN, "status_detail": outcome.error[:5000]}
        elif outcome.status == "rolled_back":
            node_update.update(worker_pid=outcome.worker_pid, status=Node.Status.UP,
                               status_detail=f"rollout {rollout.pk} failed here and was rolled back")
            if outcome.sha256:
                node_update["applied_sha256"] = outcome.sha256
        elif outcome.reloaded:
            node_update.update(status=Node.Status.DRIFTED, status_detail=outcome.error[:5000])
        updates[result.node_id] = node_update
    by_fields: dict[tuple[str, ...], list[Node]] = {}
    for node_id, node_update in updates.items():
        by_fields.setdefault(tuple(sorted(node_update)), []).append(Node(pk=node_id, **node_update))
    for fields, nodes in by_fields.items():
        bulk_set(Node, nodes, fields)
    if any(outcome.ok for outcome in outcomes):
        wakeups.notify("applied")  # parked `applied` long-polls re-check now (controlplane/asgi.py)
    bulk_set(NodeResult, [
        NodeResult(pk=result.pk, status=statuses.get(outcome.status, NodeResult.Status.FAILED),
                   error=outcome.error[:20000], unreachable=outcome.unreachable, duration_ms=outcome.duration_ms,
                   push_ms=outcome.push_ms or None, reload_ms=outcome.reload_ms or None, finished_at=now)
        for result, outcome in zip(batch, outcomes, strict=True)],
        ["status", "error", "unreachable", "duration_ms", "push_ms", "reload_ms", "finished_at"])
    for node_id, node_update in updates.items():
        node = before.get(node_id)
        if node is not None and "status" in node_update:
            emit.node_status_changed(node, node.status, node_update["status"], node_update.get("status_detail", ""))


def _execute(rollout: Rollout, owner: str) -> Rollout:
    """Canary first, then batches; stop at the first failing batch. Safe to call again."""
    fleet_id = rollout.fleet_id
    with fast_commit():
        Rollout.objects.filter(pk=rollout.pk).update(status=Rollout.Status.RUNNING,
                                                     started_at=Coalesce("started_at", Value(timezone.now())))
    rollout = (Rollout.objects.select_related("fleet", "revision")
               .defer(*(f"revision__{f}" for f in REVISION_BULK_FIELDS)).get(pk=rollout.pk))
    results = list(rollout.results.select_related("node__applied_revision")
                   .defer(*(f"node__applied_revision__{f}" for f in REVISION_BULK_FIELDS)).order_by("node__name"))
    todo = [r for r in results if r.status != NodeResult.Status.SUCCEEDED and r.node.enabled]
    for r in results:
        if not r.node.enabled and r.status == NodeResult.Status.PENDING:
            NodeResult.objects.filter(pk=r.pk).update(status=NodeResult.Status.SKIPPED, error="node disabled")

    renderer = _BundleCache()
    plans: dict[int, NodePlan] = {}
    challenges = selectors.challenge_answers()  # what a reloaded node must answer again at once
    for r in todo:
        try:
            plans[r.pk] = _plan(renderer, rollout, r.node, challenges)
        except UnsafeValue as exc:
            NodeResult.objects.filter(pk=r.pk).update(status=NodeResult.Status.FAILED,
                                                      error=f"cannot render for this node: {exc}")
    if len(plans) != len(todo):
        _finish(rollout, Rollout.Status.FAILED, "a node's settings cannot be rendered (see its result)")
        return rollout

    # Pre-flight, for every node before any is touched: who is down, who would hit a bind conflict.
    def preflight(result: NodeResult) -> tuple[str, list[str]]:
        plan = plans[result.pk]
        proc, why = reachable(plan.conn)
        if proc is None:
            return why, []
        return "", precheck_binds(plan.conn, plan.bundle, plan.last_good)

    checks = dict(zip([r.pk for r in todo], _parallel(preflight, todo) if todo else [], strict=True))
    down = {rid: why for rid, (why, _) in checks.items() if why}
    live = [r for r in todo if r.pk not in down]
    clashing = {rid: c for rid, (_, c) in checks.items() if c}
    if clashing:
        names = {r.pk: r.node.name for r in todo}
        detail = "; ".join(f"{names[rid]}: {', '.join(c)}" for rid, c in clashing.items())
        for rid, c in clashing.items():
            NodeResult.objects.filter(pk=rid).update(
                status=NodeResult.Status.FAILED,
                error=f"bind conflict: {', '.join(c)} already held by another process; nothing was pushed")
        _finish(rollout, Rollout.Status.FAILED, f"bind conflict, refused before any push: {detail}")
        return rollout
    for r in todo:
        if r.pk in down:
            NodeResult.objects.filter(pk=r.pk).update(
                status=NodeResult.Status.FAILED, unreachable=True, finished_at=timezone.now(),
                error=f"{down[r.pk]}\nskipped: the node catches up when it is reachable again")
            Node.objects.filter(pk=r.node_id).update(status=Node.Status.DOWN, status_detail=down[r.pk][:5000])

    failure = ""
    for batch in _batches(live, rollout.canary, rollout.batch_size):
        if not lease_renew(fleet_id, owner):
            logger.warning("rollout %s: lease lost; leaving it to the new holder", rollout.pk)
            return rollout
        newer = Rollout.objects.filter(fleet_id=fleet_id, status=Rollout.Status.PENDING, pk__gt=rollout.pk)
        if newer.exists():
            _finish(rollout, Rollout.Status.SUPERSEDED, "superseded by a newer rollout")
            return rollout
        with fast_commit():
            NodeResult.objects.filter(pk__in=[r.pk for r in batch]).update(
                status=NodeResult.Status.RUNNING, started_at=timezone.now())
        outcomes = _parallel(lambda r: apply_node(plans[r.pk]), batch)
        _record(batch, outcomes, rollout)
        failed = [(r, o) for r, o in zip(batch, outcomes, strict=True) if not o.ok]
        if failed:
            failure = "\n\n".join(f"node {r.node.name}: {o.error}" for r, o in failed)
            break
    if not failure and down:
        failure = "\n".join(sorted(f"{down[r.pk]}" for r in todo if r.pk in down))
        failure += "\nunreachable nodes catch up when they return"
    _finish(rollout, Rollout.Status.FAILED if failure else Rollout.Status.SUCCEEDED, failure)
    return rollout


# --- health (drift and converge live in apps.fleets.drift) ---------------------------------------------


def _changed_at(stat, now):
    """`lastchg` (seconds since the server's last state change) as a time; None where HAProxy leaves it empty."""
    seconds = (stat.raw or {}).get("lastchg", "")
    return now - timedelta(seconds=int(seconds)) if seconds.isdigit() else None


def fleet_health_collect(*, fleet: Fleet) -> int:
    """Read `show stat` from every node into NodeHealth (hot copy) and the cache; returns rows written."""
    nodes = list(selectors.enabled_nodes(fleet))
    if not nodes:
        return 0
    started = time.monotonic()
    states = _parallel(lambda n: read_state(selectors.node_conn(n), with_stats=True), nodes)
    now = timezone.now()
    rows: list[NodeHealth] = []
    summary: dict[str, Any] = {"collected_at": now.isoformat(), "nodes": {}}
    for node, state in zip(nodes, states, strict=True):
        if not state.reachable:
            Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN, status_detail=state.error[:5000])
            emit.node_status_changed(node, node.status, Node.Status.DOWN, state.error)
            summary["nodes"][node.name] = {"reachable": False, "error": state.error}
            continue
        if Node.objects.filter(pk=node.pk, status__in=[Node.Status.DOWN, Node.Status.UNKNOWN]).update(
                status=Node.Status.UP, status_detail=""):
            emit.node_status_changed(node, node.status, Node.Status.UP)
        Node.objects.filter(pk=node.pk).update(last_seen=now)
        servers = []
        for s in state.stats:
            rows.append(NodeHealth(node=node, proxy=s.pxname[:128], server=s.svname[:128],
                                   status=s.status[:32], check_status=s.check_status[:32],
                                   weight=s.weight, sessions=s.scur, rate_per_s=s.rate,
                                   requests_total=s.req_tot, changed_at=_changed_at(s, now), updated_at=now))
            if s.is_server:
                servers.append({"backend": s.pxname, "server": s.svname, "status": s.status,
                                "check": s.check_status, "weight": s.weight, "rate": s.rate})
        summary["nodes"][node.name] = {"reachable": True, "servers": servers}
    seen = [node for node, state in zip(nodes, states, strict=True) if state.reachable]
    health_before = emit.member_health_before(seen)
    with transaction.atomic():
        NodeHealth.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["node", "proxy", "server"],
            update_fields=["status", "check_status", "weight", "sessions", "rate_per_s", "requests_total",
                           "changed_at", "updated_at"],
        )
        # Proxies and servers a node no longer has (a route or member went away).
        NodeHealth.objects.filter(node__in=seen).exclude(updated_at=now).delete()
    emit.member_health_changed(health_before, rows)
    summary["duration_ms"] = (time.monotonic() - started) * 1000.0
    cache.set(health_cache_key(fleet.pk), summary, HEALTH_CACHE_S)
    try:
        # History for the overflow charts (apps.traffic TrafficSample), from the same readings.
        readings_record(nodes=[
            NodeReadings(node_id=node.pk, node=f"{fleet.name}/{node.name}", region=fleet.region.slug,
                         readings=readings_from_stats(state.stats))
            for node, state in zip(nodes, states, strict=True) if state.reachable], at=now)
    except Exception:  # charts must never break health collection
        logger.exception("fleet %s: traffic samples not recorded", fleet.name)
    return len(rows)
