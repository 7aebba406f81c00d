"""Running one rollout: render each node's bundle, pre-flight every node, canary then batches, record.

Node I/O runs in threads (apps.fleets.node.apply, no database); all database writes happen here, in the
calling thread. Safe to run again: nodes already serving the revision are verified, not reloaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.core import gcpause, wakeups
from apps.core.bulk import bulk_set
from apps.core.commits import asynchronous_commit
from apps.core.prepared import ID_LIST_PROBES, TIME_PROBES, PreparedQuery, PreparedUpdate
from apps.fleets import caches, queries
from apps.fleets import events as emit
from apps.fleets.config import routelane
from apps.fleets.config.check import HostListeners
from apps.fleets.config.render import UnsafeValue, render, with_revision_header
from apps.fleets.config.render.chain import ENFORCER_MAPS
from apps.fleets.config.spec import ConfigBundle, FleetSnapshot, NodeSpec
from apps.fleets.enforcement import enforcer_running
from apps.fleets.fanout import parallel
from apps.fleets.models import (
    ConfigRevision,
    Fleet,
    Node,
    NodeResult,
    Rollout,
    revision_deferred,
)
from apps.fleets.node.apply import NodeOutcome, NodePlan, apply_node, new_binds, precheck_binds, reachable
from apps.fleets.node.hotchanges import hot_changes
from apps.fleets.rollout import canary, restore
from apps.fleets.rollout.lease import renew as lease_renew

logger = logging.getLogger(__name__)

SKIPPED_DOWN = "skipped: the node catches up when it is reachable again"

# True: local nodes run `haproxy -c` on every push as SSH nodes do (see CentrallyValidatedLocalTransport).
REVALIDATE_LOCAL_NODES = getattr(settings, "FLEET_REVALIDATE_LOCAL_NODES", False)

# Enough for two revisions of a fleet of ~2,000 nodes (a rollout's bundles and its rollback targets).
_BUNDLE_CACHE_SIZE = 4096
# Also bounded by map entries held: a 100k-route bundle holds ~400k (tens of MB), and a sustained run of
# route changes renders a revision per change for every node. Entries several bundles share (a revision's nodes hold
# one copy of each map: BundleRenderer._share_maps; a route-lane bundle keeps its base's unmoved maps) count once.
_BUNDLE_CACHE_ENTRIES = 3_000_000


class _BundleLRU(OrderedDict):
    """Least recently used bundles, with the map entries they hold kept as a running total: summing them on
    every insert cost a rollout O(cache) per node (bench-fleet-size: ~1 s of a 100-node fleet's route change).
    `held` is one per bundle plus each distinct entry list's length once, however many bundles hold it: counted
    per bundle, a 200-node fleet at 100k routes (~205k entries a bundle in bench-scale's shape) would have filled the
    bound with ~14 nodes' bundles of one revision and rendered the others again at every rollout."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self._lists: dict[int, list[int]] = {}  # id of an entry list a bundle here holds -> [bundles, its length]
        self._lock = threading.Lock()

    def _count(self, bundle: ConfigBundle, step: int) -> None:
        self.held += step
        for entries in bundle.rendered_manifest.maps.values():
            counted = self._lists.get(id(entries))
            if counted is None:  # step is 1: a list no bundle here holds (alive while this one is held)
                self._lists[id(entries)] = [1, len(entries)]
                self.held += len(entries)
                continue
            counted[0] += step
            if counted[0] == 0:  # its last holder here goes: its id may be another list's once it is freed
                del self._lists[id(entries)]
                self.held -= counted[1]

    def put(self, key: tuple, bundle: ConfigBundle) -> None:
        evicted: list[ConfigBundle] = []
        with self._lock:
            old = self.pop(key, None)
            if old is not None:
                self._count(old, -1)
                evicted.append(old)
            self[key] = bundle
            self._count(bundle, 1)
            while len(self) > 1 and (len(self) > _BUNDLE_CACHE_SIZE or self.held > _BUNDLE_CACHE_ENTRIES):
                evicted.append(self.popitem(last=False)[1])
                self._count(evicted[-1], -1)
            old = None  # the list holds the only references left
        if evicted:
            gcpause.release_later(evicted)  # a 100k-route bundle took ~30 ms to free, in the rollout's thread

    def touch(self, key: tuple) -> None:
        with self._lock, contextlib.suppress(KeyError):  # evicted meanwhile by a reconcile in another thread
            self.move_to_end(key)

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self._lists.clear()
            self.held = 0


_BUNDLE_CACHE: _BundleLRU = caches.register("bundles", _BundleLRU())


class BundleRenderer:
    """Renders each (revision, node) once: a revision never changes, so a worker keeps recent
    bundles (the next rollout's rollback target is this rollout's bundle)."""

    def __init__(self) -> None:
        self._snaps: dict[int, FleetSnapshot] = {}
        # Per revision, each map as the first node rendered in full holds it: (file, entries, owners).
        self._maps: dict[int, dict[str, tuple[bytes, list, Any]]] = {}
        # Whether a node's haproxy binary is the central one, by its path: looked up once per rollout, not per node
        # (two PATH searches and two realpaths were a tenth of a local node's plan).
        self.same_binary: dict[str, bool] = {}

    def bundle(self, revision: ConfigRevision, node: Node, spec: NodeSpec | None = None) -> ConfigBundle:
        spec = spec or queries.node_spec(node)
        key = (revision.pk, revision.number, revision.fleet_id, revision.sha256, spec)  # no bulk field read
        cached = _BUNDLE_CACHE.get(key)
        if cached is not None:
            _BUNDLE_CACHE.touch(key)
            return cached
        # A route-lane revision: the node's bundle of its base with the moved maps (routelane).
        bundle = routelane.node_bundle(revision, lambda base_key: _BUNDLE_CACHE.get((*base_key, spec)))
        if bundle is None:
            snap = self._snaps.get(revision.pk)
            if snap is None:
                snap = self._snaps[revision.pk] = queries.revision_snapshot(revision)
            bundle = self._share_maps(revision.pk, render(snap, spec))
        _BUNDLE_CACHE.put(key, bundle)
        return bundle

    def _share_maps(self, revision_id: int, bundle: ConfigBundle) -> ConfigBundle:
        """`bundle` holding the very map files and entries of the revision's nodes rendered before it, wherever
        its own are equal (most are: a map names no node). Each node rendered in full held its own copy of every
        map (1,000 routes: ~2,000 entries a node), kept in the bundle cache and freed again per node. Each node's
        own copy is still rendered and hashed (render), then dropped here."""
        seen = self._maps.setdefault(revision_id, {})
        manifest = bundle.rendered_manifest
        files, maps, owners = dict(bundle.files), dict(manifest.maps), dict(manifest.map_owners)
        shared = False
        for name, entries in manifest.maps.items():
            content = files.get(name)
            if content is None:
                continue
            first = seen.get(name)
            if first is None:
                seen[name] = (content, entries, owners.get(name))
            elif first[0] is not content and first[0] == content:  # the same bytes: the same entries, owners
                files[name], maps[name] = first[0], first[1]
                if name in owners:
                    owners[name] = first[2]
                shared = True
        if not shared:
            return bundle
        return ConfigBundle(files=files, sha256=bundle.sha256, map_deltas=bundle.map_deltas,
                            manifest=replace(manifest, maps=maps, map_owners=owners))

    def applied(self, node: Node, spec: NodeSpec | None = None, *, drained_as_was: bool = True) -> ConfigBundle:
        """The bundle of the node's applied revision that its recorded digest (applied_sha256) names; the one
        rendered with the node's settings now when none does. Tried: the node's settings now; its drained flag as
        it was (`drained_as_was`: the node's own setting changed since it applied that revision, which makes a
        drain a map change, not a reload); each with the header renderers wrote before 2026-11-26
        (render.with_revision_header: a node applied then holds those bytes until its next push)."""
        spec = spec or queries.node_spec(node)
        bundle = self.bundle(node.applied_revision, node, spec)
        if not node.applied_sha256 or bundle.sha256 == node.applied_sha256:
            return bundle
        candidates = [bundle]
        if drained_as_was:
            candidates.append(self.bundle(node.applied_revision, node, replace(spec, drained=not spec.drained)))
        for candidate in candidates:
            if candidate.sha256 == node.applied_sha256:
                return candidate
            older = with_revision_header(candidate, fleet=node.fleet.name, revision=node.applied_revision.number,
                                         node_name=node.name)
            if older.sha256 == node.applied_sha256:
                return older
        return bundle


def plan_for(renderer: BundleRenderer, rollout: Rollout, node: Node,
          challenges: tuple[tuple[str, str], ...] = (), keep_live_values: frozenset[str] | None = None) -> NodePlan:
    """`keep_live_values`: the maps whose live values a push keeps (the rollout asks once, not once per node)."""
    last_good = None
    spec = queries.node_spec(node)
    if node.applied_revision is not None and node.applied_revision.validation_ok:
        with contextlib.suppress(UnsafeValue):
            last_good = renderer.applied(node, spec)
    applied_here = node.applied_revision_id == rollout.revision_id
    conn = queries.node_conn(node)
    return NodePlan(
        conn=conn,
        bundle=renderer.bundle(rollout.revision, node, spec),
        last_good=last_good,
        applied_sha256=node.applied_sha256 if applied_here else "",
        worker_pid=node.worker_pid,
        prevalidated=_same_binary_as_central(conn, renderer.same_binary),
        recorded_clean=node.status == Node.Status.UP,
        challenges=challenges,
        served=restore.served_record(rollout),
        keep_live_values=(ENFORCER_MAPS if enforcer_running() else frozenset()) if keep_live_values is None
        else keep_live_values,
    )


def _same_binary_as_central(conn, memo: dict[str, bool]) -> bool:
    """A local node running the haproxy binary Spillway validates with (node/apply.CentrallyValidatedLocalTransport)."""
    if conn.transport != "local" or REVALIDATE_LOCAL_NODES:
        return False
    if conn.haproxy_bin not in memo:
        central, own = shutil.which(settings.HAPROXY_BIN), shutil.which(conn.haproxy_bin)
        memo[conn.haproxy_bin] = (central is not None and own is not None
                                  and os.path.realpath(central) == os.path.realpath(own))
    return memo[conn.haproxy_bin]


def _local_map_update(plan: NodePlan) -> bool:
    """A node on this host whose apply is a runtime update (no reload to wait for): nothing in it waits long."""
    return (plan.conn.transport == "local" and plan.recorded_clean and plan.last_good is not None
            and hot_changes(plan.last_good, plan.bundle) is not None)


def _finished(*, rollout_id: int, status: str, error: str, finished_at: Any, duration_ms: float) -> tuple:
    return Rollout.objects.filter(pk=rollout_id), {"status": status, "error": error, "finished_at": finished_at,
                                                   "duration_ms": duration_ms}


def _not_attempted(*, rollout_id: int) -> tuple:
    open_results = [NodeResult.Status.PENDING, NodeResult.Status.RUNNING]
    return NodeResult.objects.filter(rollout_id=rollout_id, status__in=open_results), {
        "status": NodeResult.Status.SKIPPED, "error": "not attempted: the rollout stopped first"}


# Written or read by every rollout (a route change's path): compiled once (apps.core.prepared).
_FINISHED = PreparedUpdate(_finished, {
    "rollout_id": (1, 2), "status": ("probe-s1", "probe-s2"), "error": ("probe-e1", "probe-e2"),
    "finished_at": TIME_PROBES, "duration_ms": (1.5, 2.5)})
_NOT_ATTEMPTED = PreparedUpdate(_not_attempted, {"rollout_id": (1, 2)})
_RESULTS = PreparedQuery(
    lambda rollout_id: NodeResult.objects.filter(rollout_id=rollout_id).select_related("node__applied_revision")
    .defer(*revision_deferred("node__applied_revision")).order_by("node__name"),
    {"rollout_id": (1, 2)})
_NEWER_PENDING = PreparedQuery(
    lambda fleet_id, rollout_id: Rollout.objects.filter(fleet_id=fleet_id, status=Rollout.Status.PENDING,
                                                        pk__gt=rollout_id).values_list("pk", flat=True)[:1],
    {"fleet_id": (1, 2), "rollout_id": (3, 4)})
_NODES_BEFORE = PreparedQuery(  # a batch's nodes, before their record
    lambda ids: Node.objects.filter(pk__any=ids).order_by().only("pk", "name", "fleet_id", "status"),
    {"ids": ID_LIST_PROBES})


def finish(rollout: Rollout, status: str, error: str = "") -> None:
    now = timezone.now()
    started = rollout.started_at or now
    with asynchronous_commit():
        # str(): a Status member is a str of another type, which the prepared update would leave to the ORM.
        _FINISHED.run(rollout_id=rollout.pk, status=str(status), error=error[:20000], finished_at=now,
                      duration_ms=(now - started).total_seconds() * 1000.0 if rollout.started_at else None)
        _NOT_ATTEMPTED.run(rollout_id=rollout.pk)
        rollout.status = status
        if status == Rollout.Status.SUCCEEDED and rollout.rollback_of_id:
            Rollout.objects.filter(pk=rollout.rollback_of_id).update(status=Rollout.Status.ROLLED_BACK)
    emit.rollout_finished(rollout, status, error)


def _record(batch: list[NodeResult], outcomes: list[NodeOutcome], rollout: Rollout) -> None:
    """A batch's node results and nodes in a few statements, whatever the batch size (three statements per
    node were ~8 ms a node on a route change's path, before the `applied` long-polls could see it), in one
    transaction that does not wait for the disk (apps.core.commits: a node record lost with a database crash
    makes the node look drifted, and the converge pushes it again)."""
    with asynchronous_commit():
        _record_in(batch, outcomes, rollout)


def _record_in(batch: list[NodeResult], outcomes: list[NodeOutcome], rollout: Rollout) -> None:
    now = timezone.now()
    statuses = {"succeeded": NodeResult.Status.SUCCEEDED, "rolled_back": NodeResult.Status.ROLLED_BACK}
    before = {n.pk: n for n in _NODES_BEFORE.all(ids=[r.node_id for r in batch])}
    updates: dict[int, dict[str, Any]] = {}
    for result, outcome in zip(batch, outcomes, strict=True):
        node_update: dict[str, Any] = {"last_seen": now}
        if outcome.ok:
            # Recorded only now, once the node proved it: after a reload `show proc`, the listener probes and
            # proxies (node/apply.verify); after a runtime update, every moved key or certificate read back.
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


def _canary_tripped(rollout: Rollout, result: NodeResult, plan: NodePlan, applied: NodeOutcome,
                    others: list[Node], owner: str) -> bool:
    """Watch the canary (rollout/canary.py); past a guard, put it back on what it served and stop the rollout.
    True: the rollout is finished (rolled back, or its lease lost while watching)."""
    fleet, node = rollout.fleet, result.node
    watch = canary.Watch(fleet_id=fleet.pk, canary=Node.label(fleet.name, node.name),
                         others=tuple(Node.label(fleet.name, n.name) for n in others), since=timezone.now(),
                         max_5xx_rise_pct=fleet.guard_5xx_rise_pct, max_p99_rise_ms=fleet.guard_p99_rise_ms,
                         lb_ids=tuple(sorted(emit.changed_lbs(rollout.revision))))
    held = {"lease": True}

    def keep_going() -> bool:
        held["lease"] = lease_renew(fleet.pk, owner)
        return held["lease"]

    verdict = canary.watch_canary(watch, fleet.canary_watch_s, keep_going)
    if not held["lease"]:
        logger.warning("rollout %s: lease lost while watching its canary; leaving it to the new holder", rollout.pk)
        return True
    if not verdict.failed:
        with asynchronous_commit():
            NodeResult.objects.filter(pk=result.pk).update(error=f"canary watched: {verdict.reason}")
        return False
    reason = f"canary {node.name}: {verdict.reason}"
    restored = False
    if plan.last_good is None:
        reason += "; it keeps this revision (it had no verified config to go back to); no other node took it"
    else:
        back = apply_node(replace(plan, bundle=plan.last_good, last_good=plan.bundle, applied_sha256=applied.sha256,
                                  worker_pid=applied.worker_pid, recorded_clean=True))
        restored = back.ok
        with asynchronous_commit():
            if back.ok:
                Node.objects.filter(pk=node.pk).update(
                    applied_revision=node.applied_revision, applied_sha256=back.sha256, worker_pid=back.worker_pid,
                    status=Node.Status.UP, status_detail="", last_seen=timezone.now())
                reason += (f"; it serves revision {node.applied_revision.number} again and no other node took "
                           "this one")
            else:
                Node.objects.filter(pk=node.pk).update(status=Node.Status.DRIFTED,
                                                       status_detail=f"canary restore failed: {back.error}"[:5000])
                reason += f"; putting it back failed ({back.error[:500]}): the converge repairs it; no other node " \
                          "took this one"
    with asynchronous_commit():
        status = NodeResult.Status.ROLLED_BACK if restored else NodeResult.Status.FAILED
        NodeResult.objects.filter(pk=result.pk).update(status=status, error=reason)
        # The fleet wants what its other nodes serve again (and the converge then puts a canary that could not be
        # restored back on it): the next change renders this one's state with it, and meets the canary again if
        # the trouble is still there.
        if rollout.from_revision:
            Fleet.objects.filter(pk=fleet.pk, desired_revision=rollout.revision.number).update(
                desired_revision=rollout.from_revision)
        Rollout.objects.filter(pk=rollout.pk).update(stopped_by_canary=True)
    finish(rollout, Rollout.Status.ROLLED_BACK if restored else Rollout.Status.FAILED, reason)
    emit.canary_failed(rollout, node, reason, restored=restored)
    return True


def execute(rollout: Rollout, owner: str) -> Rollout:
    """Canary first, then batches; stop at the first failing batch. Safe to call again. A rollout read with its fleet
    and revision (`Rollout.objects.with_fleet_and_revision()`, as the reconcile loop reads it) is not read again."""
    fleet_id = rollout.fleet_id
    if rollout.status != Rollout.Status.RUNNING or rollout.started_at is None:  # else created running (reconcile)
        now = timezone.now()
        with asynchronous_commit():
            Rollout.objects.filter(pk=rollout.pk).update(status=Rollout.Status.RUNNING,
                                                         started_at=Coalesce("started_at", Value(now)))
        rollout.status, rollout.started_at = Rollout.Status.RUNNING, rollout.started_at or now
    if not (Rollout.fleet.is_cached(rollout) and Rollout.revision.is_cached(rollout)):
        rollout = Rollout.objects.with_fleet_and_revision().get(pk=rollout.pk)
    results = _RESULTS.all(rollout_id=rollout.pk)
    for r in results:
        r.rollout = rollout  # as `rollout.results` would have set it
        r.node.fleet = rollout.fleet  # read per node (its spec, its name) and the same for all: one query each
    todo = [r for r in results if r.status != NodeResult.Status.SUCCEEDED and r.node.enabled]
    for r in results:
        if not r.node.enabled and r.status == NodeResult.Status.PENDING:
            NodeResult.objects.filter(pk=r.pk).update(status=NodeResult.Status.SKIPPED, error="node disabled")

    renderer = BundleRenderer()
    plans: dict[int, NodePlan] = {}
    challenges = queries.challenge_answers()  # what a reloaded node must answer again at once
    keep = ENFORCER_MAPS if enforcer_running() else frozenset()
    for r in todo:
        try:
            plans[r.pk] = plan_for(renderer, rollout, r.node, challenges, keep)
        except UnsafeValue as exc:
            NodeResult.objects.filter(pk=r.pk).update(status=NodeResult.Status.FAILED,
                                                      error=f"cannot render for this node: {exc}")
    if len(plans) != len(todo):
        finish(rollout, Rollout.Status.FAILED, "a node's settings cannot be rendered (see its result)")
        return rollout
    if restore.check(rollout, {r.node.name: plans[r.pk] for r in todo}):
        return rollout  # pending: the nodes serve what this database does not know, an operator decides

    # Pre-flight, for every node before any is touched: who is down, who would hit a bind conflict. A rollout
    # without a canary whose nodes bind nothing new (a route change) has nothing to find there that the apply does
    # not: a node the apply cannot reach is left untouched and counted down below, as here. Skipping it saves a
    # round of every node (a runtime-API exchange each) before the first change goes live.
    host = HostListeners()

    def preflight(result: NodeResult) -> tuple[str, list[str]]:
        plan = plans[result.pk]
        proc, why = reachable(plan.conn)
        if proc is None:
            return why, []
        return "", precheck_binds(plan.conn, plan.bundle, plan.last_good, proc=proc, host=host)

    needed = rollout.canary or any(new_binds(plans[r.pk].bundle, plans[r.pk].last_good) for r in todo)
    checks = dict(zip([r.pk for r in todo], parallel(preflight, todo), strict=True)) if todo and needed else {}
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
        finish(rollout, Rollout.Status.FAILED, f"bind conflict, refused before any push: {detail}")
        return rollout
    for r in todo:
        if r.pk in down:
            NodeResult.objects.filter(pk=r.pk).update(
                status=NodeResult.Status.FAILED, unreachable=True, finished_at=timezone.now(),
                error=f"{down[r.pk]}\n{SKIPPED_DOWN}")
            Node.objects.filter(pk=r.node_id).update(status=Node.Status.DOWN, status_detail=down[r.pk][:5000])

    failure = ""
    batches = rollout.batches(live)
    for index, batch in enumerate(batches):
        if not lease_renew(fleet_id, owner):
            logger.warning("rollout %s: lease lost; leaving it to the new holder", rollout.pk)
            return rollout
        if _NEWER_PENDING.all(fleet_id=fleet_id, rollout_id=rollout.pk):
            finish(rollout, Rollout.Status.SUPERSEDED, "superseded by a newer rollout")
            return rollout
        if any(r.status != NodeResult.Status.RUNNING or r.started_at is None for r in batch):  # else created running
            with asynchronous_commit():
                NodeResult.objects.filter(pk__in=[r.pk for r in batch]).update(
                    status=NodeResult.Status.RUNNING, started_at=timezone.now())
        outcomes = parallel(lambda r: apply_node(plans[r.pk]), batch,
                            in_turn=all(_local_map_update(plans[r.pk]) for r in batch))
        # A canary must prove the config before any other node takes it: one gone since the pre-flight stops the
        # rollout. Elsewhere a node found down is skipped, as the pre-flight skips one.
        canary_batch = index == 0 and rollout.canary and len(batches) > 1
        skipped = set() if canary_batch else {r.pk for r, o in zip(batch, outcomes, strict=True) if o.untouched}
        for r, o in zip(batch, outcomes, strict=True):
            if r.pk in skipped:
                down[r.pk] = o.error
                o.error = f"{o.error}\n{SKIPPED_DOWN}"
        _record(batch, outcomes, rollout)
        failed = [(r, o) for r, o in zip(batch, outcomes, strict=True) if not o.ok and r.pk not in skipped]
        if failed:
            failure = "\n\n".join(f"node {r.node.name}: {o.error}" for r, o in failed)
            break
        watched = canary_batch and rollout.fleet.canary_watch_s > 0
        if watched and _canary_tripped(rollout, batch[0], plans[batch[0].pk], outcomes[0],
                                       [r.node for later in batches[1:] for r in later], owner):
            return rollout
    if not failure and down:
        failure = "\n".join(sorted(f"{down[r.pk]}" for r in todo if r.pk in down))
        failure += "\nunreachable nodes catch up when they return"
    finish(rollout, Rollout.Status.FAILED if failure else Rollout.Status.SUCCEEDED, failure)
    return rollout
