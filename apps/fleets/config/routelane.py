"""The route lane: a route-only change becomes a fleet revision in milliseconds, at any route count.

A full render reads every route of the fleet's LBs from the database, checks and lays out all of
them, and stores the whole text and snapshot: ~5 s and ~20 MB per revision at 100k routes, for a
change that moves a few map entries. The lane keeps, per fleet and in the process that rendered
the fleet's latest revision, what that render knew (the reference bundle, each listener's route maps
by host class: render/incremental.py), and applies the routes the LB revisions since then changed:

- which routes changed comes from the journal (balancers.RouteChange), which every route write
  fills in its own transaction; the lane runs only when every change since its state was such a
  route change (Fleet.route_seq moved exactly as far as change_seq) and the journal covers every LB
  revision since (no gap: pruned rows, a write that bypassed the journal). Anything else, and any
  route that fails the renderer's checks, a change that would alter haproxy.cfg (a pool or split a
  listener did not use), or a latest revision that left objects out, goes to the full render.
- the new bundle is the previous one with the moved maps (render.patch_maps), which equals a full
  render byte for byte (tests/fleets/test_render_incremental.py); every node's bundle is patched the
  same way from its previous one (`node_bundle`), and the moved keys travel in the bundle
  (`ConfigBundle.map_deltas`) so nodes take them through the runtime API without computing them again.
- the revision is stored as its route changes on its base revision (`base`, snapshot {"lane": ...},
  no text); queries.revision_snapshot rebuilds its snapshot from the chain when one is needed.
- `haproxy -c` is not run: haproxy.cfg and the file set are the validated base's; map entries come
  from checked routes, and each node reads every moved key back (`get map`), as for MAPS_ONLY_NOTE.

State is per process (a Celery worker renders a fleet under its lease); a process without it renders
in full once and has it from then on.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from apps.balancers.models import LoadBalancer, RouteChange
from apps.core.commits import asynchronous_commit
from apps.core.prepared import ID_LIST_PROBES, PreparedQuery
from apps.core.snapshots import one_snapshot
from apps.fleets import caches, queries
from apps.fleets.config.reasons import change_reason
from apps.fleets.config.render import UnsafeValue, patch_maps
from apps.fleets.config.render.guard import check_route, check_snapshot
from apps.fleets.config.render.incremental import ListenerRoutes, MapUpdate
from apps.fleets.config.spec import ConfigBundle, FleetSnapshot, RouteSpec
from apps.fleets.config.stored import content_sha256, lane_delta_to_json
from apps.fleets.models import ConfigRevision, Fleet

logger = logging.getLogger(__name__)

LANE_NOTE = ("Route-only change on revision {base}: only map contents moved, laid out for the changed routes' "
             "host classes; haproxy.cfg and the file set are revision {base}'s, which passed `haproxy -c -dW`, "
             "so the check was not run again. Each node reads every moved key back (`get map`).")


@dataclass
class _Lane:
    revision_pk: int
    number: int
    sha256: str
    change_seq: int
    route_seq: int
    lb_revisions: dict[str, int]
    bundle: ConfigBundle  # the reference node's
    snap: FleetSnapshot  # checked
    listeners: dict[int, ListenerRoutes] = field(default_factory=dict)  # by listener id, built when first used
    # Each moved map's entries by key, for the revision's diff: built once, then kept up to date from the
    # deltas (a dict of a 100k-entry map per revision cost ~50-150 ms of every lane revision).
    values: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Patch:
    base_key: tuple  # (pk, number, fleet_id, sha256) of the base revision, as rollout.execute.BundleRenderer keys it
    updates: tuple[MapUpdate, ...]


_LANES: dict[int, _Lane] = caches.register("route_lanes", {})
_PATCHES: OrderedDict[int, _Patch] = caches.register("route_patches", OrderedDict())  # by revision pk
_PATCHES_SIZE = 64
_LOCK = threading.Lock()


def remember(*, fleet_id: int, revision: ConfigRevision, snap: FleetSnapshot, bundle: ConfigBundle,
             change_seq: int, route_seq: int) -> None:
    """After a full render stored `revision` (rendered from `snap`, the fleet read at these seqs before
    the snapshot): the lane may continue from it. Only a clean, valid revision qualifies."""
    if not revision.validation_ok or revision.problems:
        forget(fleet_id)
        return
    checked = check_snapshot(snap)  # the render's own (memo.py): the listeners' maps below are its too
    # Built now, not at the first change: the render's memos make it cheap here (~0.4 s at 100k routes),
    # while the first route change would otherwise pay a whole layout.
    listeners = {ln.id: ListenerRoutes(ln) for ln in checked.listeners if ln.protocol != "tcp" and ln.routes}
    with _LOCK:
        _LANES[fleet_id] = _Lane(revision.pk, revision.number, revision.sha256, change_seq, route_seq,
                                 {k: int(v) for k, v in revision.lb_revisions.items()}, bundle, checked, listeners)
    if FREEZE and sum(len(state.routes) for state in listeners.values()) >= FREEZE_FROM_ROUTES:
        _freeze()


FREEZE_FROM_ROUTES = 10_000
# Set in Celery workers (controlplane/celery.py), which hold lanes: a web process renders only when someone pushes,
# and freezing there would keep its requests' objects out of cycle collection for good.
FREEZE = False


def _freeze() -> None:
    """Leave what the process holds now (the lanes' routes, layouts and bundles: millions of objects at 100k
    routes) out of the cyclic garbage collector's full collections, which walked all of it while every thread
    waited: 550-670 ms pauses of a shard worker in bench-scale's sustained run (apps.core.gcpause), each a stall
    of every change in flight. Reference counting still frees these objects; only a reference cycle among them
    would outlive its use, so what is already garbage is collected first (a full render just took seconds)."""
    gc.collect()
    gc.freeze()


def forget(fleet_id: int) -> None:
    with _LOCK:
        _LANES.pop(fleet_id, None)


# Read on every lane step (a route change's path): compiled once (apps.core.prepared).
_LATEST = PreparedQuery(
    lambda fleet_id: ConfigRevision.objects.filter(fleet_id=fleet_id)
    .only("pk", "number", "sha256", "lb_revisions", "created_at").order_by("-number")[:1], {"fleet_id": (1, 2)})
_LB_NAMES = PreparedQuery(lambda fleet_id: queries.fleet_lbs(fleet_id).values_list("pk", "name"), {"fleet_id": (1, 2)})
_FLEET_LOCKED = PreparedQuery(  # in a transaction: the row lock revisions are stored under
    lambda fleet_id: Fleet.objects.select_for_update().filter(pk=fleet_id).values_list("pk", flat=True),
    {"fleet_id": (1, 2)})
_LB_REVISIONS = PreparedQuery(lambda lb_ids: LoadBalancer.objects.filter(pk__any=lb_ids).values_list("pk", "revision"),
                              {"lb_ids": ID_LIST_PROBES})
_JOURNAL = PreparedQuery(  # the route ids of an LB's revisions (since, upto]
    lambda lb_id, since, upto: RouteChange.objects.filter(lb_id=lb_id, lb_revision__gt=since, lb_revision__lte=upto)
    .values_list("lb_revision", "route_id"), {"lb_id": (1, 2), "since": (3, 4), "upto": (5, 6)})


def _latest(fleet: Fleet) -> ConfigRevision | None:
    return _LATEST.first(fleet_id=fleet.pk)


_Changes = tuple[dict[str, int], dict[int, set[int]], dict[int, tuple[int, RouteSpec]]]


def _changes(lane: _Lane, lb_ids: list[int]) -> _Changes | None:
    """(LB revisions now, {LB id: route ids changed since the lane's}, {route id: (LB id, spec)} of those that
    exist), read as of one moment (a route with its targets); None when the journal has a gap."""
    with one_snapshot():
        found = _journal(lane, lb_ids)
        if found is None:
            return None
        ids = set().union(*found[1].values()) if found[1] else set()
        return (*found, {spec.id: (lb_id, spec) for lb_id, spec in queries.route_specs_of(sorted(ids))})


def _journal(lane: _Lane, lb_ids: list[int]) -> tuple[dict[str, int], dict[int, set[int]]] | None:
    now = {str(pk): rev for pk, rev in _LB_REVISIONS.all(lb_ids=lb_ids)}
    if now.keys() != lane.lb_revisions.keys():
        return None
    changed: dict[int, set[int]] = {}
    for key, revision in now.items():
        since = lane.lb_revisions[key]
        if revision == since:
            continue
        if revision < since:
            return None
        rows = _JOURNAL.all(lb_id=int(key), since=since, upto=revision)
        if {r for r, _ in rows} != set(range(since + 1, revision + 1)):
            return None  # an LB revision that is not a journaled route change
        changed[int(key)] = {route_id for _, route_id in rows}
    return now, changed


def lane_render(*, fleet: Fleet, reason: str, seqs: tuple[int, int] | None = None) -> ConfigRevision | None:
    """The fleet's next revision through the lane, the latest one when the changes moved nothing, or None
    when a full render is needed (the caller renders in full, which gives the lane a new state).

    `seqs`: (change_seq, route_seq) as the caller read them a moment ago. Older than the row is safe: the lane
    reads the journal as it is now, and marks only these seqs covered (the next look renders again, finding the
    journal's later changes applied, or declines to the full render)."""
    begun = time.monotonic()
    with _LOCK:
        lane = _LANES.get(fleet.pk)
    if lane is None:
        return None
    change_seq, route_seq = seqs or Fleet.objects.values_list("change_seq", "route_seq").get(pk=fleet.pk)
    latest = _latest(fleet)
    # Nothing recorded since (a direct "render now", a converge): the caller wants the database read in full.
    recorded = change_seq - lane.change_seq
    declined = (
        "no revision" if latest is None
        else f"revision {latest.number} is not the lane's" if latest.pk != lane.revision_pk
        else "nothing recorded since the lane's state" if recorded <= 0
        else "a change other than a route's was recorded" if recorded != route_seq - lane.route_seq
        else None)
    lbs: dict[int, str] = {}
    found = None
    if declined is None:
        lbs = dict(_LB_NAMES.all(fleet_id=fleet.pk))
        found = _changes(lane, list(lbs))
        if found is None:
            declined = "the route journal does not cover every LB revision since the lane's"
    if found is None:
        # Why matters: a full render costs seconds at 100k routes, and an unexpected one is a bug to find.
        logger.info("fleet %s: route lane declined (%s: seq %s/%s, lane %s/%s); rendering in full", fleet.name,
                    declined, change_seq, route_seq, lane.change_seq, lane.route_seq)
        forget(fleet.pk)
        return None
    lb_revisions, changed, now = found
    marks: dict[str, float] = {"journal": time.monotonic()}  # each step's end, logged below
    try:
        revision = _apply(fleet, lane, latest, lbs, lb_revisions, changed, now, reason, marks)
    except Exception:
        # A lane bug must not hold the change back: the full render reads the database and is the
        # reference the lane is tested against. The state may be half-changed: never reuse it.
        logger.exception("fleet %s: route lane failed; rendering in full", fleet.name)
        forget(fleet.pk)
        return None
    if revision is None:
        forget(fleet.pk)
        return None
    with _LOCK:
        lane.change_seq, lane.route_seq = change_seq, route_seq
    revision.covered_seq = change_seq  # what this render covered (rollout.reconcile.fleet_reconcile marks it rendered)
    steps = ", ".join(f"{name} {(at - before) * 1000.0:.0f}" for (name, at), before
                      in zip(marks.items(), [begun, *marks.values()], strict=False))
    logger.info("fleet %s: revision %s through the route lane in %.0f ms (%s route(s); ms: %s)", fleet.name,
                revision.number, (time.monotonic() - begun) * 1000.0, sum(len(v) for v in changed.values()), steps)
    return revision


def _apply(fleet: Fleet, lane: _Lane, latest: ConfigRevision, lbs: dict[int, str], lb_revisions: dict[str, int],
           changed: dict[int, set[int]], now: dict[int, tuple[int, RouteSpec]], reason: str,
           marks: dict[str, float]) -> ConfigRevision | None:
    pool_ids = {p.id for p in lane.snap.pools}
    per_listener: dict[int, tuple[list[RouteSpec], list[int]]] = {}  # as loaded (stored) and as checked
    checked_changes: dict[int, tuple[list[RouteSpec], list[int]]] = {}
    for lb_id, route_ids in changed.items():
        listeners = [ln for ln in lane.snap.listeners if ln.lb == lbs[lb_id] and ln.protocol != "tcp"]
        upserts = [now[i][1] for i in sorted(route_ids) if i in now and now[i][0] == lb_id]
        deletes = sorted(i for i in route_ids if i not in now or now[i][0] != lb_id)
        try:
            checked = [check_route(f"routes[{r.id}]", r, pool_ids) for r in upserts]
        except UnsafeValue as exc:
            logger.info("fleet %s: route lane declined (%s); rendering in full", fleet.name, exc)
            return None
        for ln in listeners:
            per_listener[ln.id] = (upserts, deletes)
            checked_changes[ln.id] = (checked, deletes)
    updates: list[MapUpdate] = []
    for listener_id, (checked, deletes) in checked_changes.items():
        state = lane.listeners.get(listener_id)
        if state is None:
            spec = next(ln for ln in lane.snap.listeners if ln.id == listener_id)
            state = lane.listeners[listener_id] = ListenerRoutes(spec)
        moved = state.apply(checked, deletes)
        if moved is None:
            logger.info("fleet %s: route lane declined (listener %s's actions or split ids move); rendering in full",
                        fleet.name, listener_id)
            return None
        updates += moved
    marks["apply"] = time.monotonic()
    absent = sorted(u.name for u in updates if u.name not in lane.bundle.files)
    if absent:
        # A listener's first routes (or a map its render left out): haproxy.cfg changes too, so full render.
        logger.info("fleet %s: route lane declined (no %s in the base); rendering in full", fleet.name,
                    ", ".join(absent))
        return None
    number = latest.number + 1
    bundle = patch_maps(lane.bundle, updates) if updates else lane.bundle
    content = content_sha256(bundle)
    marks["bundle"] = time.monotonic()
    if content == latest.sha256:
        _cover(fleet, latest, lb_revisions)
        lane.lb_revisions = lb_revisions
        return latest
    changes = change_reason(lb_ids=set(lbs), since=latest.created_at)
    if changes:
        reason = changes if reason in ("", "desired state changed") else f"{reason}: {changes}"
    marks["reason"] = time.monotonic()
    # Without waiting for the disk (apps.core.commits): a revision lost with a database crash is rendered again
    # from the journal, which the route writes committed durably.
    with asynchronous_commit():
        _FLEET_LOCKED.all(fleet_id=fleet.pk)
        marks["lock"] = time.monotonic()
        if queries.latest_revision_pk(fleet) != latest.pk:
            return None
        revision = ConfigRevision.objects.create(
            fleet=fleet, number=number, text="", sha256=content,
            diff=_diff(latest.number, number, lane, updates),
            snapshot=lane_delta_to_json(number, per_listener), validation_ok=True,
            validation_output=LANE_NOTE.format(base=latest.number),
            validation_kind=ConfigRevision.Validation.ROUTE_LANE, validation_ms=0.0,
            lb_revisions=lb_revisions, reason=reason[:200], problems=[], base=latest)
    marks["store"] = time.monotonic()
    with _LOCK:
        _PATCHES[revision.pk] = _Patch((latest.pk, latest.number, fleet.pk, latest.sha256), tuple(updates))
        while len(_PATCHES) > _PATCHES_SIZE:
            _PATCHES.popitem(last=False)
    lane.revision_pk, lane.number, lane.sha256, lane.lb_revisions = revision.pk, number, content, lb_revisions
    lane.bundle = bundle
    return revision


def _cover(fleet: Fleet, latest: ConfigRevision, lb_revisions: dict[str, int]) -> None:
    """Same content: the latest revision also serves these LB revisions (as fleet_render records it)."""
    with transaction.atomic():
        Fleet.objects.select_for_update().get(pk=fleet.pk)
        merged = dict(latest.lb_revisions)
        for key, rev in lb_revisions.items():
            merged[key] = max(int(merged.get(key, 0)), rev)
        ConfigRevision.objects.filter(pk=latest.pk).update(lb_revisions=merged)


def _diff(old: int, new: int, lane: _Lane, updates: list[MapUpdate]) -> str:
    """The moved map entries as a unified diff (a full diff would compare two 5 MB texts); moves the
    lane's entries by key (`values`) on to the new contents."""
    lines = [f"--- revision {old}\n", f"+++ revision {new}\n"]
    for update in updates:
        before = lane.values.get(update.name)
        if before is None:
            before = dict(lane.bundle.rendered_manifest.maps.get(update.name, ()))
        if update.delta is None:
            after = dict(update.entries)
            removed = [(k, v) for k, v in before.items() if after.get(k) != v]
            added = [(k, v) for k, v in after.items() if before.get(k) != v]
        else:
            removed = [(k, before[k]) for k in (*update.delta.removed, *(k for k, _ in update.delta.changed))
                       if k in before]
            added = [*update.delta.added, *update.delta.changed]
            after = before
            for key in update.delta.removed:
                after.pop(key, None)
            after.update(added)
        lane.values[update.name] = after
        lines.append(f"@@ {update.name} @@\n")
        lines += [f"-{k} {v}\n" for k, v in sorted(removed)]
        lines += [f"+{k} {v}\n" for k, v in sorted(added)]
    return "".join(lines)


def node_bundle(revision: ConfigRevision, cached: Any) -> ConfigBundle | None:
    """A lane revision's bundle for one node: the node's base bundle (`cached(base_key)`, None when this
    process does not hold it) with the revision's maps. None: render it from the snapshot instead."""
    with _LOCK:
        patch = _PATCHES.get(revision.pk)
    if patch is None:
        return None
    base = cached(patch.base_key)
    if base is None:
        return None
    return patch_maps(base, patch.updates)
