"""Rollouts and the changes that start them: mark fleets changed, create, roll back, re-push.

A write marks the fleets serving what it changed (`fleets_mark_changed`: change_seq, one reconcile queued per
fleet); the reconcile loop (rollout/reconcile.py) renders and runs the rollout. `rollout_create` is also how
an operator rolls out, back or forward by hand.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.audit.services import audit_record
from apps.balancers.models import LoadBalancer
from apps.core.errors import Conflict, DomainError, NotFoundError
from apps.core.prepared import TIME_PROBES, PreparedQuery, PreparedUpdate
from apps.fleets import queries
from apps.fleets.config.revisions import fleet_render
from apps.fleets.models import ConfigRevision, Fleet, Node, NodeResult, Rollout
from apps.fleets.rollout.queues import enqueue_reconcile
from apps.traffic.services import capacity_record

logger = logging.getLogger(__name__)


def _org(principal: Principal | None):
    return principal.org if principal is not None else None


def _pending(fleet_id: int) -> QuerySet:
    return Rollout.objects.filter(fleet_id=fleet_id, status=Rollout.Status.PENDING)


_FLEET_ID = {"fleet_id": (1, 2)}
# rollout_create's statements, on every route change's path: compiled once (apps.core.prepared).
_FLEET_LOCKED = PreparedQuery(lambda fleet_id: Fleet.objects.select_for_update().filter(pk=fleet_id), _FLEET_ID)
_RESULTS_SUPERSEDED = PreparedUpdate(
    lambda fleet_id: (NodeResult.objects.filter(rollout__in=_pending(fleet_id), status=NodeResult.Status.PENDING),
                      {"status": NodeResult.Status.SKIPPED, "error": "superseded by a newer rollout"}), _FLEET_ID)
_ROLLOUTS_SUPERSEDED = PreparedUpdate(
    lambda fleet_id, now: (_pending(fleet_id), {"status": Rollout.Status.SUPERSEDED, "finished_at": now}),
    {**_FLEET_ID, "now": TIME_PROBES})
# (id, name) only: every node built as a model (with its applied revision) for its id and name was a tenth of a route
# change's rollout record at 67 nodes a fleet.
_TARGETS = PreparedQuery(lambda fleet_id: queries.enabled_nodes(fleet_id).values_list("pk", "name"), _FLEET_ID)
_DESIRED = PreparedUpdate(
    lambda fleet_id, number: (Fleet.objects.filter(pk=fleet_id), {"desired_revision": number}),
    {**_FLEET_ID, "number": (3, 4)})


def rollout_create(
    *,
    fleet: Fleet,
    revision: ConfigRevision,
    principal: Principal | None = None,
    kind: str = Rollout.Kind.DEPLOY,
    canary: bool | None = None,
    batch_size: int | None = None,
    nodes: list[Node] | None = None,
    rollback_of: Rollout | None = None,
    enqueue: bool = True,
    running: bool = False,
) -> Rollout:
    """Make `revision` the fleet's desired revision and queue a rollout of it (newest intent wins:
    older pending rollouts of the fleet are superseded). With `enqueue` a reconcile task runs it
    after commit; the reconcile loop passes False when it runs the rollout itself, and `running` when it
    runs it at once (holding the lease: created running and started, as execute would mark it)."""
    if revision.fleet_id != fleet.pk:
        raise DomainError("wrong_fleet", f"Revision {revision.number} belongs to another fleet.",
                          field="revision")
    if not revision.validation_ok:
        raise DomainError("revision_invalid",
                          f"Revision {revision.number} failed validation and can never be pushed.",
                          field="revision")
    # Inside a caller's transaction (the reconcile loop's), no savepoint of its own: nothing here is caught and
    # retried, and a savepoint is two round trips more on a route change's path.
    with transaction.atomic(savepoint=False):
        fleet = _FLEET_LOCKED.first(fleet_id=fleet.pk)
        if fleet is None:
            raise Fleet.DoesNotExist(f"fleet {revision.fleet_id}")
        now = timezone.now()
        _RESULTS_SUPERSEDED.run(fleet_id=fleet.pk)
        _ROLLOUTS_SUPERSEDED.run(fleet_id=fleet.pk, now=now)
        rollout = Rollout.objects.create(
            fleet=fleet, revision=revision, from_revision=fleet.desired_revision, kind=kind,
            canary=fleet.canary if canary is None else canary,
            batch_size=fleet.batch_size if batch_size is None else batch_size,
            actor=principal.actor if principal else "system", rollback_of=rollback_of,
            **({"status": Rollout.Status.RUNNING, "started_at": now} if running else {}),
        )
        targets = [(n.pk, n.name) for n in nodes] if nodes is not None else _TARGETS.all(fleet_id=fleet.pk)
        # Run at once in one batch (a route change's rollout): every node's result starts running with it, as execute
        # would mark them in a transaction of its own (four round trips before the first node is touched).
        one_batch = running and len(rollout.batches(targets)) <= 1
        started = {"status": NodeResult.Status.RUNNING, "started_at": now} if one_batch else {}
        NodeResult.objects.bulk_create([NodeResult(rollout_id=rollout.pk, node_id=pk, **started) for pk, _ in targets])
        _DESIRED.run(fleet_id=fleet.pk, number=revision.number)
        audit_record(principal=principal, org=_org(principal), action=f"rollout.{kind}", obj=rollout,
                     after={"fleet": fleet.name, "revision": revision.number,
                            "from_revision": rollout.from_revision, "nodes": [name for _, name in targets]})
        if enqueue:
            transaction.on_commit(lambda: request_reconcile(fleet.pk))
    return rollout


def request_reconcile(fleet_id: int) -> bool:
    """Queue one reconcile for the fleet unless one is queued already (the queued one sees every
    change made before it starts). True when a task was queued."""
    queued = Fleet.objects.filter(pk=fleet_id, reconcile_queued=False).update(reconcile_queued=True)
    if queued and not enqueue_reconcile(fleet_id):
        # Not sent (the broker is down): a flag left set would make every later change wait for the converge.
        Fleet.objects.filter(pk=fleet_id).update(reconcile_queued=False)
        return False
    return bool(queued)


def change_seq_bump(fleet_ids: list[int], routes_only: bool = False) -> None:
    """Record a change of these fleets' desired state without queueing anything (the caller reconciles).
    Not `routes_only`: the next render is a full one, whatever the route lane holds."""
    bump: dict[str, Any] = {"change_seq": F("change_seq") + 1}
    if routes_only:
        bump["route_seq"] = F("route_seq") + 1
    Fleet.objects.filter(pk__in=fleet_ids).update(**bump)


def fleets_mark_changed(*, fleet_ids: list[int], routes_only: bool = False) -> list[int]:
    """Record that these fleets' desired state changed, and queue a reconcile (render, then roll out what
    changed) for each that has none queued; coalesced with changes close to this one. `routes_only`: the
    change only touched journaled routes (balancers.lb_touch), which the route lane applies without a
    full render. A fleet with `auto_rollout` off only notes the change; it rolls out when someone pushes.

    One statement whatever the fleet count (one fleet at a time took three queries each: a route write's
    share of the API's time at 1,000 route changes a minute), locking the fleets' rows in id order: two
    writes updating the same two fleets' rows in whatever order the plan visited them deadlocked each other
    (and a render storing its revision) in bench-scale's sustained run, and one of them answered 500.
    Returns the ids queued.
    """
    if not fleet_ids:
        return []
    ids = sorted(set(fleet_ids))
    if connection.vendor != "postgresql":  # SQLite: one writer at a time, no row locks to order
        change_seq_bump(ids, routes_only)
        marks = ", ".join(["%s"] * len(ids))
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Fleet._meta.db_table} SET reconcile_queued = %s WHERE id IN ({marks}) "  # noqa: S608
                           "AND auto_rollout AND NOT reconcile_queued RETURNING id", [True, *ids])
            queued = sorted(row[0] for row in cursor.fetchall())
        return _enqueue_marked(queued)
    return _mark("id = ANY(%(ids)s)", {"ids": ids}, routes_only)


def lb_fleets_mark_changed(*, lb_id: int, routes_only: bool = False) -> list[int]:
    """fleets_mark_changed for every fleet serving the HAProxy LB `lb_id` (queries.fleet_ids_for_lb), in the same
    one statement on PostgreSQL: it runs after every route write's commit, before the API answers and before the
    reconcile is queued (reading the ids first was a round trip more on that path)."""
    if connection.vendor != "postgresql":
        return fleets_mark_changed(fleet_ids=queries.fleet_ids_for_lb(lb_id), routes_only=routes_only)
    return _mark(f"id IN ({queries.FLEET_IDS_FOR_LB_SUBQUERY})",
                 {"lb": lb_id, "kind": LoadBalancer.Kind.HAPROXY.value}, routes_only)


def _mark(which: str, params: dict[str, Any], routes_only: bool) -> list[int]:
    """The fleets the condition `which` picks (with `params`): change_seq (and route_seq) bumped and a reconcile
    queued, in one statement (PostgreSQL)."""
    table = Fleet._meta.db_table
    # The subquery locks the rows (in id order) and reads each one's reconcile_queued as it was, under
    # that lock: RETURNING sees only new values (PostgreSQL < 18), and "queued by this call" is the old one.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS f SET change_seq = f.change_seq + 1, route_seq = f.route_seq + %(routes)s, "  # noqa: S608
            "reconcile_queued = f.reconcile_queued OR f.auto_rollout "
            f"FROM (SELECT id, reconcile_queued AS was_queued FROM {table} WHERE {which} "
            "ORDER BY id FOR UPDATE) AS locked WHERE f.id = locked.id "
            "RETURNING f.id, f.auto_rollout AND NOT locked.was_queued",
            {"routes": 1 if routes_only else 0, **params})
        queued = sorted(pk for pk, mine in cursor.fetchall() if mine)
    return _enqueue_marked(queued)


def _enqueue_marked(queued: list[int]) -> list[int]:
    unsent = [fleet_id for fleet_id in queued if not enqueue_reconcile(fleet_id)]
    for fleet_id in unsent:  # the broker is down: the converge (or the next change, once it is back) reconciles
        # One row at a time, in id order (as the statement above locks them): no deadlock with another writer.
        Fleet.objects.filter(pk=fleet_id).update(reconcile_queued=False)
    return [fleet_id for fleet_id in queued if fleet_id not in unsent]


def fleet_mark_changed(*, fleet: Fleet | int, routes_only: bool = False) -> bool:
    """fleets_mark_changed for one fleet. True when a reconcile was queued. (To render and roll out now,
    auto_rollout or not, the fleet page's "push": fleet_push.)"""
    fleet_id = fleet if isinstance(fleet, int) else fleet.pk
    return bool(fleets_mark_changed(fleet_ids=[fleet_id], routes_only=routes_only))


def fleet_capacity_follow() -> list[int]:
    """After a health collection: record the capacity the fresh health gives every pool (traffic owns
    the model and the last-seen state) and mark every fleet serving an LB whose capacity changed as
    changed, so its per-node limits are re-rendered. Returns the LB ids whose capacity changed.

    The collector calls this right after it wrote the hot copy, instead of traffic re-reading it on a
    timer of its own and reaching back into fleets.
    """
    changed = capacity_record()
    for lb_id in changed:
        lb_fleets_mark_changed(lb_id=lb_id)
    return changed


def fleet_push(*, fleet: Fleet, principal: Principal | None = None, full: bool = False) -> Rollout | None:
    """Render now and roll out what changed (the "push" of a fleet whose changes are held). `full`: render
    in full, whatever the route lane holds (the API's "render now").

    None when nothing changed or the render is invalid (then stored with its reason, not pushed).
    """
    if full:
        change_seq_bump([fleet.pk])
    seq = Fleet.objects.values_list("change_seq", flat=True).get(pk=fleet.pk)
    revision = fleet_render(fleet=fleet, reason=f"pushed by {principal.actor if principal else 'system'}")
    Fleet.objects.filter(pk=fleet.pk, rendered_seq__lt=seq).update(rendered_seq=seq)
    fleet.refresh_from_db()
    if not revision.validation_ok or revision.number == fleet.desired_revision:
        return None
    return rollout_create(fleet=fleet, revision=revision, principal=principal)


def rollout_rollback(*, rollout: Rollout, principal: Principal | None) -> Rollout:
    """Put the fleet back on the revision it had before `rollout`."""
    if rollout.from_revision == 0:
        raise Conflict("nothing_to_roll_back",
                       "This rollout was the fleet's first: there is no earlier revision.")
    revision = ConfigRevision.objects.filter(fleet=rollout.fleet, number=rollout.from_revision).first()
    if revision is None:
        raise Conflict("revision_missing", f"Revision {rollout.from_revision} no longer exists.")
    rollback = rollout_create(fleet=rollout.fleet, revision=revision, principal=principal,
                              kind=Rollout.Kind.ROLLBACK, rollback_of=rollout)
    if revision.number < rollout.revision.number:  # undoing a rollback moves forward: no pin
        _pin(rollout.fleet_id)
    return rollback


def _pin(fleet_id: int) -> None:
    """A rolled-back fleet stays where it was put: changes are held (shown as pinned, queries.fleet_pin)
    until someone pushes or turns automatic rollout back on; a new change must not undo the rollback."""
    Fleet.objects.filter(pk=fleet_id).update(auto_rollout=False)


def fleet_rollback(*, fleet: Fleet, number: int, principal: Principal | None) -> Rollout:
    """Roll the fleet to any earlier valid revision (it stays there until the next change)."""
    revision = ConfigRevision.objects.filter(fleet=fleet, number=number).first()
    if revision is None:
        raise NotFoundError(f"Fleet {fleet.name} has no revision {number}.", field="revision")
    rollback = rollout_create(fleet=fleet, revision=revision, principal=principal, kind=Rollout.Kind.ROLLBACK)
    if revision.number < rollback.from_revision:
        _pin(fleet.pk)
    return rollback


def fleets_sharing(fleet_ids: set[int]) -> set[int]:
    """These fleets and every fleet serving one of their LBs: node counts there feed the share rule."""
    lb_ids = set(LoadBalancer.objects.filter(fleet_id__in=fleet_ids).values_list("pk", flat=True))
    lb_ids |= set(Fleet.serves.through.objects.filter(fleet_id__in=fleet_ids)
                  .values_list("loadbalancer_id", flat=True))
    sharing = set(fleet_ids)
    sharing |= set(LoadBalancer.objects.filter(pk__in=lb_ids, fleet__isnull=False)
                   .values_list("fleet_id", flat=True))
    sharing |= set(Fleet.serves.through.objects.filter(loadbalancer_id__in=lb_ids)
                   .values_list("fleet_id", flat=True))
    return sharing


def fleets_mark_changed_after_commit(fleet_ids: set[int]) -> None:
    """Once the caller's transaction commits, mark these fleets and every fleet sharing an LB with them changed
    (a fleet or node setting moved what they render)."""

    def start() -> None:
        for fleet_id in sorted(fleets_sharing(fleet_ids)):
            fleet_mark_changed(fleet=fleet_id)

    transaction.on_commit(start)


def vrrp_refresh(*, fleet_id: int) -> Rollout | None:
    """Re-push the desired revision to the fleet's VRRP nodes after a node-level VRRP change (drain,
    interface, peers): their keepalived.conf changed though the fleet's revision did not. Nodes already
    serving their bundle are only verified (node/apply.apply_node)."""
    fleet = Fleet.objects.get(pk=fleet_id)
    desired = ConfigRevision.objects.filter(fleet=fleet, number=fleet.desired_revision, validation_ok=True).first()
    nodes = queries.vrrp_nodes(fleet_id)
    if desired is None or not nodes:
        return None
    return rollout_create(fleet=fleet, revision=desired, kind=Rollout.Kind.CONVERGE, canary=False, nodes=nodes)


# What a node's own render reads besides the fleet's revision (queries.node_spec): a change re-pushes the node.
NODE_SPEC_FIELDS = ("drained", "health_port")


def node_refresh(*, node_id: int) -> Rollout | None:
    """Re-push the fleet's desired revision to one node whose own settings changed (drained: its health endpoint
    answers 503; its health port): a map entry, applied through the runtime API with no reload."""
    node = Node.objects.select_related("fleet").filter(pk=node_id, enabled=True).first()
    if node is None:
        return None
    fleet = node.fleet
    desired = ConfigRevision.objects.filter(fleet=fleet, number=fleet.desired_revision, validation_ok=True).first()
    if desired is None:
        return None
    return rollout_create(fleet=fleet, revision=desired, kind=Rollout.Kind.CONVERGE, canary=False, nodes=[node])
