"""Drift: does each node run what Spillway verified on it, on disk *and* live? Then converge.

A check reads every enabled node (in threads, like a rollout) and compares:
- the config on disk (hash) and the worker (PID, failed reloads) with what the last verified apply
  recorded: a difference marks the node drifted; the next converge re-pushes and reloads it;
- the live runtime state with the desired state: every map of the verified bundle (`show map`) and
  every server's admin state and weight (`show servers state`, against the members in the database).
  A live difference is repaired at once through the runtime API and read back; only when that
  fails is the node marked drifted (then a reload repairs it).
Every difference found is audited (`node.drift`) with its readable diff and how it was repaired, and
the node's status line says what was found. Skipped while a rollout holds the fleet's lease: its
nodes are legitimately in between; the periodic check also puts a fleet off (up to MAX_DEFER_S) when rollouts
ran during its lease-free first look. The periodic check (each converge) reads a node's large maps back less
often than the rest (LIVE_MAPS_EVERY_S); "Check drift" reads them all.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.balancers.models import Member
from apps.fleets import caches, queries
from apps.fleets import events as emit
from apps.fleets.config.render import UnsafeValue, backend_name
from apps.fleets.config.spec import ConfigBundle
from apps.fleets.fanout import on_this_host, parallel
from apps.fleets.models import ConfigRevision, Fleet, Node, NodeResult, Rollout
from apps.fleets.node.apply import NODE_ERRORS
from apps.fleets.node.live import LiveDrift, ServerWanted, read_live_drift, repair_live_drift
from apps.fleets.node.outside_rollout import read_state
from apps.fleets.node.transports import NodeConn
from apps.fleets.rollout import lease
from apps.fleets.rollout.execute import BundleRenderer
from apps.fleets.rollout.reconcile import request_reconcile_if_due
from apps.fleets.rollout.rollouts import rollout_create

logger = logging.getLogger(__name__)

@dataclass
class DriftReport:
    checked: int = 0
    skipped: bool = False  # a rollout held the fleet
    down: list[str] = field(default_factory=list)
    drifted: dict[str, list[str]] = field(default_factory=dict)  # still drifted: converge reloads them
    repaired: dict[str, list[str]] = field(default_factory=dict)  # live drift put back by the runtime API

    def summary(self) -> str:
        if self.skipped:
            return "A rollout is running on this fleet: drift is checked once it ends."
        parts = []
        if self.repaired:
            parts.append("live state repaired through the runtime API on " + ", ".join(sorted(self.repaired)))
        if self.drifted:
            parts.append("drifted (re-pushed by a converge): " + ", ".join(sorted(self.drifted)))
        if self.down:
            parts.append("unreachable: " + ", ".join(sorted(self.down)))
        if not parts:
            return f"No drift: all {self.checked} node(s) run their verified config, maps and server states."
        return "; ".join(parts) + "."


def _wanted_servers(fleet: Fleet) -> dict[tuple[str, str], ServerWanted]:
    """(backend, server) -> the member's desired admin state and weight, for both backend protocols."""
    wanted = {}
    rows = Member.objects.filter(pool__lb__in=queries.fleet_lbs(fleet)).values_list(
        "pool_id", "region__slug", "name", "admin_state", "weight")
    for pool_id, region, name, admin_state, weight in rows:
        for protocol in ("http", "tcp"):
            wanted[(backend_name(pool_id, region, protocol), name)] = ServerWanted(admin_state, weight)
    return wanted


# What happens to a drifted node of a fleet held after a restore (rollout/restore.py): nothing, until an operator
# confirms. "Re-pushed by the next converge" was false there: the converge leaves a held fleet alone.
HELD_NEXT_STEP = "held after a restore: nothing is pushed to it until an operator confirms on the fleet page"
REPUSH_NEXT_STEP = "re-pushed and reloaded by the next converge"


def _audit_drift(node: Node, lines: list[str], repair: str) -> None:
    audit_record(principal=None, org=None, action="node.drift", obj=node,
                 before={"differences": lines}, after={"repair": repair})


# How often the periodic check (each converge, every 10 s) reads a node's live maps back: at 100k routes that
# is 200k lines a node, the largest cost of a converge and CPU the route changes beside it need. Its first look reads
# and hashes the files on disk as often (between two, each file's name, mode, size and mtime must be as pushed:
# reading every file of every SSH node each converge held the node's SFTP session from the route changes beside it).
# The rest (worker, server states, ACME answers) is read every time, and "Check drift" reads every map and file.
LIVE_MAPS_EVERY_S = float(getattr(settings, "FLEET_LIVE_MAPS_EVERY_S", 30.0))
# node id -> when (monotonic) this process last read its maps and found them clean
_MAPS_READ: dict[int, float] = caches.register(
    "maps_read", {})
_STATE_LOCK = threading.Lock()  # _MAPS_READ and _DEFERRED_SINCE (checks run in threads)


def _maps_age(node_id: int) -> float:
    """Seconds since this process last found a node's live maps clean (a node it has not read yet counts from the
    first time it asks, as due; one whose maps differed counts as never read until they are found clean)."""
    now = time.monotonic()
    with _STATE_LOCK:
        return now - _MAPS_READ.setdefault(node_id, now - LIVE_MAPS_EVERY_S)


def _maps_due(node: Node, due_after_s: float | None) -> bool:
    """Whether a node's live maps are read now: `due_after_s` since they were last found clean (None: not now)."""
    return due_after_s is not None and (due_after_s <= 0 or _maps_age(node.pk) >= due_after_s)


def _maps_read(node_id: int, clean_at: float) -> None:
    """Remember when a node's live maps were found clean (-inf: found differing, read them at the next check)."""
    with _STATE_LOCK:
        _MAPS_READ[node_id] = clean_at


def _read_live(node: Node, conn: NodeConn, bundle: ConfigBundle, servers: dict[tuple[str, str], ServerWanted],
               challenges: dict[str, str], due_after_s: float | None, first_only: bool = False) -> LiveDrift:
    """read_live_drift with the maps when they are due; remembers when they were last found clean."""
    maps, read_at = _maps_due(node, due_after_s), time.monotonic()
    drift = read_live_drift(conn, bundle, servers, challenges, maps=maps, first_only=first_only)
    if maps:
        _maps_read(node.pk, read_at if not drift.maps else float("-inf"))
    return drift


def _looks_clean(fleet: Fleet, due_after_s: float | None) -> int | None:
    """A first look without the fleet's lease: the number of nodes checked when every enabled node is up,
    runs its verified config and worker, and serves exactly its bundle's server states and the maps that are due
    (`due_after_s`, _maps_due); else None.

    Reading every node's maps back takes seconds at 100k routes, and a route change waits for the fleet's
    lease: checks that find nothing (nearly all of them) no longer hold it. A rollout moving a node meanwhile
    can only make this look unclean, which sends the check to the leased path, which decides."""
    nodes = list(queries.enabled_nodes(fleet))
    if any(n.status != Node.Status.UP or n.applied_revision_id is None for n in nodes):
        return None
    local = on_this_host(nodes)
    states = parallel(lambda n: read_state(queries.node_conn(n), fresh=_maps_due(n, due_after_s)),
                      nodes, in_turn=local) if nodes else []
    renderer = BundleRenderer()
    jobs = []
    for node, state in zip(nodes, states, strict=True):
        if (not state.reachable or state.on_disk_sha256 != node.applied_sha256 or state.failed_reloads
                or state.worker_pid != node.worker_pid):
            return None
        try:
            bundle = renderer.applied(node, drained_as_was=False)
        except UnsafeValue:
            return None
        if bundle.sha256 != node.applied_sha256:
            return None
        jobs.append((node, bundle))
    servers = _wanted_servers(fleet)
    challenges = dict(queries.challenge_answers())

    def live(job) -> bool:
        node, bundle = job
        try:
            return not _read_live(node, queries.node_conn(node), bundle, servers, challenges, due_after_s,
                                  first_only=True)
        except NODE_ERRORS:
            return False

    if not all(parallel(live, jobs, in_turn=local) if jobs else []):
        return None
    Node.objects.filter(pk__in=[n.pk for n in nodes], status=Node.Status.UP).update(last_seen=timezone.now())
    return len(nodes)


# How long the periodic check may put off a fleet whose rollouts keep moving its nodes under every first look
# (then it takes the fleet's lease, and route changes wait for the check). "Check drift" never waits.
MAX_DEFER_S = float(getattr(settings, "FLEET_DRIFT_MAX_DEFER_S", 300.0))
# fleet id -> when (monotonic) its periodic check was first put off
_DEFERRED_SINCE: dict[int, float] = caches.register(
    "drift_deferred_since", {})
# A fleet whose last rollout ended this recently is busy: its first look leaves the live maps (fleet_drift_report).
QUIET_S = 2.0


@dataclass(frozen=True)
class _Marks:
    newest: int | None  # the fleet's newest rollout
    active: int  # rollouts pending or running
    last_finished: dt.datetime | None

    def busy(self) -> bool:
        return bool(self.active) or (self.last_finished is not None
                                     and (timezone.now() - self.last_finished).total_seconds() < QUIET_S)


def _rollout_marks(fleet: Fleet) -> _Marks:
    """Equal (newest, active) before and after a look when no rollout started, ran or ended meanwhile. Two indexed
    reads, whatever the fleet's history (rollouts are kept)."""
    newest = Rollout.objects.filter(fleet=fleet).order_by("-pk").values_list("pk", "finished_at").first()
    active = Rollout.objects.filter(fleet=fleet, status__in=Rollout.ACTIVE).count()
    return _Marks(newest[0] if newest else None, active, newest[1] if newest else None)


def _moved_under(fleet: Fleet, before: _Marks) -> bool:
    """A rollout ran during a look that began at `before`: what it saw may be a node between two revisions."""
    after = _rollout_marks(fleet)
    return bool(before.active) or (after.newest, after.active) != (before.newest, before.active)


def _maps_overdue(fleet: Fleet) -> bool:
    """A node's live maps have waited for a quiet moment past MAX_DEFER_S (the leased check then reads them)."""
    return any(_maps_age(pk) >= LIVE_MAPS_EVERY_S + MAX_DEFER_S
               for pk in queries.enabled_nodes(fleet).values_list("pk", flat=True))


def _defer(fleet_id: int) -> bool:
    """Whether the periodic check may put this fleet off again (MAX_DEFER_S since it was first put off)."""
    now = time.monotonic()
    with _STATE_LOCK:
        since = _DEFERRED_SINCE.setdefault(fleet_id, now)
    return now - since < MAX_DEFER_S


def _checked(fleet_id: int) -> None:
    with _STATE_LOCK:
        _DEFERRED_SINCE.pop(fleet_id, None)


def fleet_drift_report(*, fleet: Fleet, all_maps: bool = True) -> DriftReport:
    """Check every enabled node's disk, worker and live state; repair live drift through the runtime API and
    mark the rest drifted (the converge re-pushes it). `all_maps=False` (the periodic check): a node's live
    maps only when LIVE_MAPS_EVERY_S have passed since this process last found them clean.

    The periodic check does not take the lease when a rollout ran during its first look: the look then saw
    nodes moving between revisions, not drift, and the leased check would hold every route change for as long
    as it reads (1-2 s at 100k routes, every converge, in bench-scale's sustained run). It looks again at the
    next converge, and takes the lease once it has been put off for MAX_DEFER_S; each rollout reads back every
    key it moves meanwhile.

    Nor does its first look read a busy fleet's live maps (a rollout pending or running, or one ended within
    QUIET_S): 200k lines a node, read and compared in the process that rolls the fleet's changes out (its shard
    worker), made that process's rollouts take 1-3 s instead of ~0.2 s, every 10 s, in the same run, and while
    changes roll out continuously the read is inconclusive anyway (keys move under it). They are read at the
    first quiet converge once due (LIVE_MAPS_EVERY_S), or under the lease once MAX_DEFER_S overdue."""
    before = _rollout_marks(fleet)
    busy = not all_maps and before.busy()
    due_after_s = 0.0 if all_maps else (None if busy else LIVE_MAPS_EVERY_S)
    clean = _looks_clean(fleet, due_after_s)
    if clean is not None and not (busy and _maps_overdue(fleet)):
        _checked(fleet.pk)
        return DriftReport(checked=clean)
    due_after_s = 0.0 if all_maps else LIVE_MAPS_EVERY_S + (MAX_DEFER_S if busy else 0.0)
    if clean is None and not all_maps and _moved_under(fleet, before) and _defer(fleet.pk):
        logger.info("fleet %s: rollouts ran during the drift check's first look; checking at the next converge",
                    fleet.pk)
        return DriftReport(skipped=True)
    report = DriftReport()
    owner = lease.new_owner()
    if not lease.claim(fleet.pk, owner):
        report.skipped = True
        return report
    try:
        held = bool(Fleet.objects.filter(pk=fleet.pk).values_list("restore_hold", flat=True).first())
        nodes = list(queries.enabled_nodes(fleet))
        report.checked = len(nodes)
        local = on_this_host(nodes)
        states = parallel(lambda n: read_state(queries.node_conn(n), recorded_sha256=n.applied_sha256, fresh=True),
                          nodes, in_turn=local) if nodes else []
        renderer = BundleRenderer()
        servers = _wanted_servers(fleet)
        challenges = dict(queries.challenge_answers())
        now = timezone.now()
        live_jobs = []
        verdicts: dict[int, list[str]] = {}
        restarted: dict[int, int | None] = {}  # node id -> the worker that started from the verified files
        for node, state in zip(nodes, states, strict=True):
            if not state.reachable:
                Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN, status_detail=state.error[:5000])
                emit.node_status_changed(node, node.status, Node.Status.DOWN, state.error)
                report.down.append(node.name)
                continue
            reasons = []
            if node.applied_revision_id is None:
                reasons.append("never received a verified config from Spillway")
            else:
                if state.on_disk_sha256 != node.applied_sha256 and state.on_disk_sha256_v1 == node.applied_sha256:
                    # Verified by an earlier version, whose digest read every byte into one hash: the same files.
                    Node.objects.filter(pk=node.pk).update(applied_sha256=state.on_disk_sha256)
                    node.applied_sha256 = state.on_disk_sha256
                if state.on_disk_sha256 != node.applied_sha256:
                    reasons.append(f"config on disk {str(state.on_disk_sha256)[:12]} is not the verified "
                                   f"{node.applied_sha256[:12]}")
                if state.worker_pid != node.worker_pid:
                    if state.on_disk_sha256 == node.applied_sha256 and not state.failed_reloads:
                        # Restarted from its verified files (a reboot: last-known-good). Adopted once its live
                        # state reads as theirs, with every map: a reload would only start the same files again
                        # (~5 s over SSH, holding the fleet's changes: bench-chaos, a node rebooted).
                        restarted[node.pk] = state.worker_pid
                    else:
                        reasons.append(f"worker {state.worker_pid} is not the verified worker {node.worker_pid} "
                                       "(reloaded or restarted outside Spillway)")
            if state.failed_reloads:
                reasons.append(f"the master reports {state.failed_reloads} failed reload(s)")
            verdicts[node.pk] = reasons
            if not reasons:
                try:
                    bundle = renderer.applied(node, drained_as_was=False)
                except UnsafeValue:
                    continue
                if bundle.sha256 == node.applied_sha256:  # live maps must equal exactly this bundle's
                    live_jobs.append((node, bundle))

        def live(job) -> tuple[LiveDrift | None, str | None]:
            node, bundle = job
            conn = queries.node_conn(node)
            try:
                drift = _read_live(node, conn, bundle, servers, challenges,
                                   0.0 if node.pk in restarted else due_after_s)
            except NODE_ERRORS as exc:
                return None, f"live state unreadable: {exc}"
            problem = repair_live_drift(conn, drift) if drift else None
            if drift.maps and problem is None:  # put back and read back: clean as of now
                _maps_read(node.pk, time.monotonic())
            return drift, problem

        read_live: set[int] = set()
        for (node, _bundle), (drift, problem) in zip(live_jobs, parallel(live, live_jobs, in_turn=local)
                                                     if live_jobs else [],
                                                     strict=True):
            if drift is not None:
                read_live.add(node.pk)
            if drift is None:
                verdicts[node.pk].append(problem or "live state unreadable")
            elif drift and problem is None:
                report.repaired[node.name] = drift.lines
                _audit_drift(node, drift.lines, "put back through the runtime API (no reload)")
                emit.drift_repaired_live(node, drift.lines)
            elif drift:
                verdicts[node.pk] += [*drift.lines, f"runtime repair failed ({problem}): a reload repairs it"]
        for node in nodes:
            if node.pk not in restarted:
                continue
            if node.pk in read_live and verdicts.get(node.pk) == []:
                Node.objects.filter(pk=node.pk).update(worker_pid=restarted[node.pk])
                _audit_drift(node, [f"worker {restarted[node.pk]} started from the verified files (was "
                                    f"{node.worker_pid})"], "adopted: it serves the verified revision (no reload)")
            elif node.pk in verdicts:
                verdicts[node.pk].append(f"worker {restarted[node.pk]} is not the verified worker {node.worker_pid} "
                                         "(restarted outside Spillway)")
        for node in nodes:
            reasons = verdicts.get(node.pk)
            if reasons is None:
                continue
            if reasons:
                report.drifted[node.name] = reasons
                detail = "; ".join([*reasons, HELD_NEXT_STEP] if held else reasons)
                if node.status != Node.Status.DRIFTED or node.status_detail != detail[:5000]:
                    _audit_drift(node, reasons, HELD_NEXT_STEP if held else REPUSH_NEXT_STEP)
                Node.objects.filter(pk=node.pk).update(status=Node.Status.DRIFTED, status_detail=detail[:5000],
                                                       last_seen=now)
                emit.node_status_changed(node, node.status, Node.Status.DRIFTED, detail)
            else:
                repaired = report.repaired.get(node.name)
                detail = (f"live state repaired at {now:%Y-%m-%d %H:%M:%S} UTC: " + "; ".join(repaired)
                          if repaired else "")
                Node.objects.filter(pk=node.pk).update(status=Node.Status.UP, status_detail=detail[:5000],
                                                       last_seen=now)
                emit.node_status_changed(node, node.status, Node.Status.UP, detail)
        _checked(fleet.pk)
        return report
    finally:
        lease.release(fleet.pk, owner)
        # A reconcile that found the lease taken meanwhile gave up, leaving its change to the holder.
        request_reconcile_if_due(fleet.pk)


def fleet_drift_check(*, fleet: Fleet, all_maps: bool = True) -> list[str]:
    """Names of the nodes still drifted after a check (live drift the runtime API fixed is not)."""
    return sorted(fleet_drift_report(fleet=fleet, all_maps=all_maps).drifted)


def _blocked(node: Node, desired: int) -> bool:
    """The node refused or failed the desired revision while reachable: retrying would fail again."""
    unfinished = [NodeResult.Status.PENDING, NodeResult.Status.RUNNING, NodeResult.Status.SKIPPED]
    last = (NodeResult.objects.filter(node=node, rollout__revision__number=desired,
                                      rollout__fleet_id=node.fleet_id)
            .exclude(status__in=unfinished).order_by("-id").first())
    return last is not None and last.status != NodeResult.Status.SUCCEEDED and not last.unreachable


def fleet_converge(*, fleet: Fleet, check_drift: bool = True, enqueue: bool = True) -> Rollout | None:
    """Bring back nodes that are off the desired revision because they were down or drifted.

    Nodes that refused the desired revision while reachable are left alone (the rollout already
    failed with their error); a new change or a rollback moves them.
    """
    fleet = Fleet.objects.get(pk=fleet.pk)
    if fleet.desired_revision == 0 or fleet.restore_hold:
        return None
    if check_drift:  # the periodic path (converge_fleet_task): maps as they fall due
        fleet_drift_check(fleet=fleet, all_maps=False)
    # On the fleet as it is after the check, which lasts long enough for the engine to roll newer revisions out:
    # with the desired revision read before it, nodes the engine had moved on looked "off" between two of its
    # rollouts, and the converge pushed the older revision back onto them, superseding the engine's pending rollout
    # (bench-scale's sustained run: routes served a moment before went away until the next change).
    fleet.refresh_from_db(fields=["desired_revision"])
    if Rollout.objects.filter(fleet=fleet, status__in=Rollout.ACTIVE).exists():
        return None
    desired = ConfigRevision.objects.filter(fleet=fleet, number=fleet.desired_revision).first()
    if desired is None or not desired.validation_ok:
        return None
    if Rollout.objects.filter(revision=desired, stopped_by_canary=True).exists():
        return None  # a watched canary refused it: only a new change or a push sends it (no converge around it)
    candidates = []
    for node in queries.enabled_nodes(fleet):
        off = node.applied_revision_id != desired.pk
        if node.status == Node.Status.DOWN:
            continue
        if node.status == Node.Status.DRIFTED or (off and not _blocked(node, desired.number)):
            candidates.append(node)
    if not candidates:
        return None
    # Confirmed under the fleet's row lock, which every rollout_create and route-lane revision takes: a revision
    # the engine rolled out since the look above leaves this converge to the next one.
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
        if (fleet.desired_revision != desired.number
                or Rollout.objects.filter(fleet=fleet, status__in=Rollout.ACTIVE).exists()):
            return None
        return rollout_create(fleet=fleet, revision=desired, kind=Rollout.Kind.CONVERGE, canary=False,
                              nodes=candidates, enqueue=enqueue)
