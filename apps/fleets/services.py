"""Writes for fleets: config revisions, rollouts, rollbacks, runtime changes, preview.

The rollout engine itself (lease, coalescing loop, canary + batches, drift, health) lives in
apps.fleets.engine; the functions other apps and the API call are re-exported here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import string
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.balancers.models import LoadBalancer, Member
from apps.core import crypto
from apps.core.errors import Conflict, DomainError, NotFoundError
from apps.fleets import routelane, selectors
from apps.fleets.codec import content_sha256, display_text, revision_diff, snapshot_to_json, strip_header
from apps.fleets.enforce import sync_usable
from apps.fleets.models import ChallengeAnswer, ConfigRevision, Fleet, Node, NodeResult, Rollout
from apps.fleets.nodeops import set_map_entries, set_server
from apps.fleets.reasons import change_reason
from apps.fleets.render import UnsafeValue, backend_name, render
from apps.fleets.render.frontends import ACME_CHALLENGE_MAP
from apps.fleets.render.quarantine import quarantine
from apps.fleets.snapshot import MAIN_FILE, ConfigBundle
from apps.fleets.transports.base import NodeConn
from apps.fleets.validate import validate_bundle
from apps.traffic.services import capacity_record

logger = logging.getLogger(__name__)

# Coalescing: a change starts a reconcile at once unless one is queued already (it will see the
# change); changes arriving while a rollout runs all go into the next one. So a burst costs at most
# two rollouts per fleet and an isolated change waits for nothing. A debounce (ms) would add its
# whole length to every isolated change's latency; measured with bench_propagation, 20 ms bought
# no fewer rollouts for writes ~30 ms apart, so the default is 0.
DEBOUNCE_S = getattr(settings, "FLEET_ROLLOUT_DEBOUNCE_MS", 0) / 1000.0
RUNTIME_THREADS = 16


def _org(principal: Principal | None):
    return principal.org if principal is not None else None


# --- config revisions ------------------------------------------------------------------------------


AUTO_RENDER_REASON = "desired state changed"


CERTIFICATES_ONLY_NOTE = ("Only certificate contents changed since the previous revision, which passed "
                          "`haproxy -c -dW`; each certificate was checked when stored (PEM, key matches, chain, "
                          "validity), so the check was not run again.")


def _certificates_only(latest: ConfigRevision | None, text: str) -> bool:
    """The new render differs from the latest validated revision only in certs/*.pem contents.

    The display text is haproxy.cfg (which names every certificate file) plus every other file, so an
    equal text below the header leaves only the certificates' contents. Those passed
    apps.fleets.certs' checks when stored, and the nodes take them through `set ssl cert`, which
    refuses a PEM HAProxy cannot load; re-running `haproxy -c` on an unchanged configuration costs
    seconds per renewal on a fleet with many certificates and finds nothing new.
    """
    return latest is not None and latest.validation_ok and strip_header(latest.text) == strip_header(text)


MAPS_ONLY_NOTE = ("Only map contents changed since revision {number}, which passed `haproxy -c -dW` with the "
                  "same haproxy.cfg and files: map entries are written by the renderer from allowlisted values, "
                  "and each node reads every moved entry back (`get map`), so the check was not run again.")
# {fleet id: (revision sha256, digest of everything but map contents)} of the newest revision this process
# validated. Kept here, not parsed back from the stored text: a worker that did not validate the latest
# revision itself runs `haproxy -c` once more, which is always safe.
_VALIDATED_SHAPE: dict[int, tuple[str, str]] = {}


def _shape(bundle: ConfigBundle) -> str:
    """What `haproxy -c` judges besides map contents: haproxy.cfg's body, the file names, non-map files."""
    digest = hashlib.sha256(bundle.body.encode())
    for name in sorted(bundle.files):
        digest.update(b"\0" + name.encode() + b"\0")
        if name != MAIN_FILE and name not in bundle.facts.maps:
            digest.update(bundle.files[name])
    return digest.hexdigest()


def _maps_only(fleet_id: int, latest: ConfigRevision | None, bundle: ConfigBundle) -> bool:
    """The new render differs from the latest validated revision only in map contents.

    A route change at 100k routes moves a few map entries; `haproxy -c` would load ~200k entries again
    (about a second) to judge a haproxy.cfg it already passed.
    """
    seen = _VALIDATED_SHAPE.get(fleet_id)
    return (latest is not None and latest.validation_ok and seen is not None
            and seen == (latest.sha256, _shape(bundle)))


def fleet_render(*, fleet: Fleet, reason: str = "") -> ConfigRevision:
    """Render the fleet's desired state and validate it: the latest revision if nothing changed.

    The same content as the latest revision makes no new revision; the latest then also covers the
    LB revisions just read (it serves them). A config the renderer refuses (a value failing its
    allowlist) or `haproxy -c -dW` rejects is stored with the reason and can never be rolled out.

    The fleet row is locked only to store the result, not while rendering: every route write bumps
    that row's change_seq, and at 100k routes a render holding the lock kept each write waiting for
    seconds. A revision stored by someone else meanwhile makes this render start over (its number
    and diff base are stale); the reconciler's lease makes that rare.
    """
    revision = routelane.lane_render(fleet=fleet, reason=reason)
    if revision is not None:
        return revision
    for _ in range(3):
        revision = _render_once(fleet, reason)
        if revision is not None:
            return revision
    with transaction.atomic():  # still racing: render holding the lock, as before
        Fleet.objects.select_for_update().get(pk=fleet.pk)
        revision = _render_once(fleet, reason)
    assert revision is not None
    return revision


def _render_once(fleet: Fleet, reason: str) -> ConfigRevision | None:
    fleet = Fleet.objects.select_related("region").get(pk=fleet.pk)
    seqs = (fleet.change_seq, fleet.route_seq)  # read before the snapshot: the lane continues from here
    latest = selectors.latest_revision(fleet)
    number = latest.number + 1 if latest else 1
    snap, lb_revisions = selectors.fleet_snapshot(fleet, number)
    # One tenant's broken object must not block the others: render what is valid, keep the rest
    # as problems for their owners.
    snap, left_out = quarantine(snap, shared_bind=selectors.fleet_binds_one_address(fleet))
    problems = [p.as_json() for p in left_out]
    if problems:
        logger.warning("fleet %s: revision %s leaves out %s", fleet.name, number, problems)
    try:
        bundle = render(snap, selectors.reference_node(fleet))
    except UnsafeValue as exc:
        # Same refusal twice = same "content": no new revision for it.
        text, ok, output, took_ms = "", False, f"render refused: {exc}", 0.0
        content = hashlib.sha256(output.encode()).hexdigest()
    else:
        text, content = display_text(bundle), content_sha256(bundle)
    if latest is not None and latest.sha256 == content:
        with transaction.atomic():
            Fleet.objects.select_for_update().get(pk=fleet.pk)
            if selectors.latest_revision(fleet) != latest:
                return None
            latest.refresh_from_db(fields=["lb_revisions"])
            merged = dict(latest.lb_revisions)
            for lb_id, lb_rev in lb_revisions.items():
                merged[lb_id] = max(int(merged.get(lb_id, 0)), lb_rev)
            if merged != latest.lb_revisions:
                latest.lb_revisions = merged
                latest.save(update_fields=["lb_revisions"])
        latest.covered_seq = seqs[0]
        return latest
    if text and _certificates_only(latest, text):
        ok, output, took_ms = True, CERTIFICATES_ONLY_NOTE, 0.0
    elif text and latest is not None and _maps_only(fleet.pk, latest, bundle):
        ok, output, took_ms = True, MAPS_ONLY_NOTE.format(number=latest.number), 0.0
    elif text:
        result = validate_bundle(bundle, settings.HAPROXY_BIN)
        ok, output, took_ms = result.ok, result.output, result.duration_ms
    # After route-lane revisions (no text of their own) the diff starts from the last full text.
    shown = selectors.text_revision(latest) if latest else None
    diff = revision_diff(shown.text if shown else "", text,
                         f"revision {shown.number}" if shown else "empty", f"revision {number}")
    # Name the changes it carries (from the audit log) rather than only how the render was started.
    changes = change_reason(lb_ids={int(k) for k in lb_revisions}, since=latest.created_at if latest else None)
    if changes:
        reason = changes if reason in ("", AUTO_RENDER_REASON) else f"{reason}: {changes}"
    stored = snapshot_to_json(snap, crypto.encrypt)
    with transaction.atomic():
        Fleet.objects.select_for_update().get(pk=fleet.pk)
        if selectors.latest_revision(fleet) != latest:
            return None
        revision = ConfigRevision.objects.create(
            fleet=fleet, number=number, text=text, sha256=content, diff=diff,
            snapshot=stored, validation_ok=ok, validation_output=output,
            validation_ms=took_ms, lb_revisions=lb_revisions, reason=reason[:200], problems=problems,
        )
    selectors.remember_revision_snapshot(revision, snap)
    if ok and text:
        _VALIDATED_SHAPE[fleet.pk] = (content, _shape(bundle))
        routelane.remember(fleet_id=fleet.pk, revision=revision, snap=snap, bundle=bundle,
                           change_seq=seqs[0], route_seq=seqs[1])
    else:
        routelane.forget(fleet.pk)
    if not ok:
        logger.warning("fleet %s: revision %s is invalid and will not be pushed:\n%s",
                       fleet.name, number, output)
    revision.covered_seq = seqs[0]  # what this render read (engine.fleet_reconcile marks it rendered)
    return revision


# --- rollouts ---------------------------------------------------------------------------------------


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
) -> Rollout:
    """Make `revision` the fleet's desired revision and queue a rollout of it (newest intent wins:
    older pending rollouts of the fleet are superseded). With `enqueue` a reconcile task runs it
    after commit; the engine passes False when it runs the rollout itself."""
    if revision.fleet_id != fleet.pk:
        raise DomainError("wrong_fleet", f"Revision {revision.number} belongs to another fleet.",
                          field="revision")
    if not revision.validation_ok:
        raise DomainError("revision_invalid",
                          f"Revision {revision.number} failed validation and can never be pushed.",
                          field="revision")
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
        now = timezone.now()
        superseded = Rollout.objects.filter(fleet=fleet, status=Rollout.Status.PENDING)
        NodeResult.objects.filter(rollout__in=superseded, status=NodeResult.Status.PENDING).update(
            status=NodeResult.Status.SKIPPED, error="superseded by a newer rollout")
        superseded.update(status=Rollout.Status.SUPERSEDED, finished_at=now)
        rollout = Rollout.objects.create(
            fleet=fleet, revision=revision, from_revision=fleet.desired_revision, kind=kind,
            canary=fleet.canary if canary is None else canary,
            batch_size=fleet.batch_size if batch_size is None else batch_size,
            actor=principal.actor if principal else "system", rollback_of=rollback_of,
        )
        targets = nodes if nodes is not None else list(selectors.enabled_nodes(fleet))
        NodeResult.objects.bulk_create([NodeResult(rollout=rollout, node=n) for n in targets])
        Fleet.objects.filter(pk=fleet.pk).update(desired_revision=revision.number)
        audit_record(principal=principal, org=_org(principal), action=f"rollout.{kind}", obj=rollout,
                     after={"fleet": fleet.name, "revision": revision.number,
                            "from_revision": rollout.from_revision, "nodes": [n.name for n in targets]})
        if enqueue:
            transaction.on_commit(lambda: request_reconcile(fleet.pk))
    return rollout


def request_reconcile(fleet_id: int) -> bool:
    """Queue one reconcile for the fleet unless one is queued already (the queued one sees every
    change made before it starts). True when a task was queued."""
    queued = Fleet.objects.filter(pk=fleet_id, reconcile_queued=False).update(reconcile_queued=True)
    if queued:
        from apps.fleets.tasks import reconcile_task

        reconcile_task.apply_async((fleet_id,), countdown=DEBOUNCE_S or None)
    return bool(queued)


def _change_seq_bump(fleet_ids: list[int], routes_only: bool) -> None:
    bump: dict[str, Any] = {"change_seq": F("change_seq") + 1}
    if routes_only:
        bump["route_seq"] = F("route_seq") + 1
    Fleet.objects.filter(pk__in=fleet_ids).update(**bump)


def fleets_change_record(*, fleet_ids: list[int], routes_only: bool = False) -> list[int]:
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
    table = Fleet._meta.db_table
    marks = ", ".join(["%s"] * len(ids))
    if connection.vendor != "postgresql":  # SQLite: one writer at a time, no row locks to order
        _change_seq_bump(ids, routes_only)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET reconcile_queued = %s WHERE id IN ({marks}) "  # noqa: S608
                           "AND auto_rollout AND NOT reconcile_queued RETURNING id", [True, *ids])
            queued = sorted(row[0] for row in cursor.fetchall())
    else:
        # The subquery locks the rows (in id order) and reads each one's reconcile_queued as it was, under
        # that lock: RETURNING sees only new values (PostgreSQL < 18), and "queued by this call" is the old one.
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS f SET change_seq = f.change_seq + 1, route_seq = f.route_seq + %s, "  # noqa: S608
                "reconcile_queued = f.reconcile_queued OR f.auto_rollout "
                f"FROM (SELECT id, reconcile_queued AS was_queued FROM {table} WHERE id IN ({marks}) "
                "ORDER BY id FOR UPDATE) AS locked WHERE f.id = locked.id "
                "RETURNING f.id, f.auto_rollout AND NOT locked.was_queued",
                [1 if routes_only else 0, *ids])
            queued = sorted(pk for pk, mine in cursor.fetchall() if mine)
    from apps.fleets.tasks import reconcile_task

    for fleet_id in queued:
        reconcile_task.apply_async((fleet_id,), countdown=DEBOUNCE_S or None)
    return queued


def fleet_change_record(*, fleet: Fleet | int, force: bool = False, routes_only: bool = False) -> bool:
    """fleets_change_record for one fleet; `force=True` (the fleet page's and the LB preview's "push"
    buttons) renders and rolls out now, auto_rollout or not. True when queued or pushed."""
    fleet_id = fleet if isinstance(fleet, int) else fleet.pk
    if force:
        _change_seq_bump([fleet_id], routes_only)
        return fleet_push(fleet=Fleet.objects.get(pk=fleet_id)) is not None
    return bool(fleets_change_record(fleet_ids=[fleet_id], routes_only=routes_only))


def fleet_capacity_follow() -> list[int]:
    """After a health collection: record the capacity the fresh health gives every pool (traffic owns
    the model and the last-seen state) and mark every fleet serving an LB whose capacity changed as
    changed, so its per-node limits are re-rendered. Returns the LB ids whose capacity changed.

    The collector calls this right after it wrote the hot copy, instead of traffic re-reading it on a
    timer of its own and reaching back into fleets.
    """
    changed = capacity_record()
    for lb_id in changed:
        fleets_change_record(fleet_ids=selectors.fleet_ids_for_lb(lb_id))
    return changed


def fleet_push(*, fleet: Fleet, principal: Principal | None = None) -> Rollout | None:
    """Render now and roll out what changed (the "push" of a fleet whose changes are held).

    None when nothing changed or the render is invalid (then stored with its reason, not pushed).
    """
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
    """A rolled-back fleet stays where it was put: changes are held (shown as pinned, selectors.fleet_pin)
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


# --- runtime changes ---------------------------------------------------------------------------------


def member_runtime_apply(*, member_id: int) -> dict[str, str | None]:
    """Send a member's admin state and weight to every node serving its pool, all at once.

    The desired state is already in the database (balancers wrote it), so the next render agrees;
    the transport dumps runtime state to the server-state file before each reload, so it survives.
    Returns {"fleet/node": error or None}.
    """
    member = Member.objects.select_related("pool__lb", "region").filter(pk=member_id).first()
    if member is None:
        return {}
    backends = [backend_name(member.pool_id, member.region.slug, proto) for proto in ("http", "tcp")]
    nodes = list(Node.objects.filter(fleet__in=selectors.lb_fleets(member.pool.lb), enabled=True)
                 .select_related("fleet"))
    if not nodes:
        return {}
    conns = [(f"{n.fleet.name}/{n.name}", selectors.node_conn(n)) for n in nodes]

    def apply(conn: NodeConn) -> str | None:
        if member.admin_state == Member.AdminState.MAINT:
            sync_usable(conn, leaving=member.name, backends=backends)  # a failure is mended by the call after
        return set_server(conn, backends, member.name, member.admin_state, member.weight)

    with ThreadPoolExecutor(max_workers=min(RUNTIME_THREADS, len(conns))) as pool:
        futures = {key: pool.submit(apply, conn) for key, conn in conns}
        results = {key: future.result() for key, future in futures.items()}
        # A region whose last member left service is skipped by the chain at once (enforce.py).
        list(pool.map(sync_usable, [conn for key, conn in conns if not results[key]]))
    for key, error in results.items():
        if error:
            logger.warning("runtime change of member %s on %s failed: %s", member.pk, key, error)
    return results


def fleet_reconcile_now(*, fleet_id: int) -> dict[str, Any]:
    """Mark the fleet's desired state changed and reconcile it in this process; a queued reconcile finds
    it done. Returns {"busy": True} at once when another reconciler holds the lease: a caller that must
    see its change served before going on (ACME's handshake check) uses fleets.settle.fleet_settle."""
    Fleet.objects.filter(pk=fleet_id).update(change_seq=F("change_seq") + 1)
    return fleet_reconcile(fleet_id=fleet_id)


CHALLENGE_TTL_S = 3600.0  # an answer outlives any order (ACME_TIMEOUT_S): only a killed worker's stays


def acme_challenges_set(*, add: dict[str, str], remove: list[str] = ()) -> dict[str, str | None]:  # type: ignore[assignment]
    """Publish (token -> key authorization) and withdraw HTTP-01 answers on every enabled node of
    every fleet, at once, through the runtime API (no revision, no reload).

    Every node, not only those of fleets whose LBs route the hostname: DNS may send the CA to any of
    them, and a key authorization is public by design (the CA fetches it over plain HTTP).
    Stored first (ChallengeAnswer): a node reloading after that, by whichever worker, takes them again
    (delivery.apply_node). Returns {"fleet/node": error or None}.
    """
    if remove:
        ChallengeAnswer.objects.filter(token__in=list(remove)).delete()
    if add:
        expires = timezone.now() + dt.timedelta(seconds=CHALLENGE_TTL_S)
        ChallengeAnswer.objects.bulk_create(
            [ChallengeAnswer(token=token, key_authorization=value, expires_at=expires) for token, value in add.items()],
            update_conflicts=True, unique_fields=["token"], update_fields=["key_authorization", "expires_at"])
    nodes = list(Node.objects.filter(enabled=True).select_related("fleet"))
    if not nodes:
        return {}
    conns = [(f"{n.fleet.name}/{n.name}", selectors.node_conn(n)) for n in nodes]
    with ThreadPoolExecutor(max_workers=min(RUNTIME_THREADS, len(conns))) as pool:
        futures = {key: pool.submit(set_map_entries, conn, ACME_CHALLENGE_MAP, add, list(remove))
                   for key, conn in conns}
        return {key: future.result() for key, future in futures.items()}


def challenge_answers_expire() -> int:
    """Forget answers whose order was left open (its worker killed): past their expiry no reload or
    drift repair puts them back. The nodes drop them at their next reload. Returns how many."""
    deleted, _ = ChallengeAnswer.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


# --- fleets and nodes ---------------------------------------------------------------------------------


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


def _restart_after_commit(fleet_ids: set[int]) -> None:
    def start() -> None:
        for fleet_id in sorted(fleets_sharing(fleet_ids)):
            fleet_change_record(fleet=fleet_id)

    transaction.on_commit(start)


def vrrp_refresh(*, fleet_id: int) -> Rollout | None:
    """Re-push the desired revision to the fleet's VRRP nodes after a node-level VRRP change (drain,
    interface, peers): their keepalived.conf changed though the fleet's revision did not. Nodes already
    serving their bundle are only verified (delivery.apply_node)."""
    fleet = Fleet.objects.get(pk=fleet_id)
    desired = ConfigRevision.objects.filter(fleet=fleet, number=fleet.desired_revision, validation_ok=True).first()
    nodes = selectors.vrrp_nodes(fleet_id)
    if desired is None or not nodes:
        return None
    return rollout_create(fleet=fleet, revision=desired, kind=Rollout.Kind.CONVERGE, canary=False, nodes=nodes)


# What a node's own render reads besides the fleet's revision (selectors.node_spec): a change re-pushes the node.
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


def lb_serve(*, principal: Principal, lb: LoadBalancer, fleet: Fleet, serve: bool) -> LoadBalancer:
    """Add `fleet` to the fleets serving `lb` (its region's nodes then serve it) or remove it. The LB's own fleet
    (its `fleet`) can go too: another serving fleet takes its place. Audited; both fleets re-render."""
    if not principal.is_operator:
        raise DomainError("operator_only", "Only the operator decides which fleets serve a load balancer.",
                          status=403)
    with transaction.atomic():
        lb = LoadBalancer.objects.select_for_update().get(pk=lb.pk)
        before = sorted(selectors.lb_fleets(lb).values_list("name", flat=True))
        if serve:
            if lb.fleet_id is None:
                LoadBalancer.objects.filter(pk=lb.pk).update(fleet=fleet)
            elif lb.fleet_id != fleet.pk:
                fleet.serves.add(lb)
        else:
            fleet.serves.remove(lb)
            if lb.fleet_id == fleet.pk:
                heir = Fleet.objects.filter(serves=lb).order_by("name").first()
                LoadBalancer.objects.filter(pk=lb.pk).update(fleet=heir)
                if heir is not None:
                    heir.serves.remove(lb)  # the FK names it now
        lb.refresh_from_db()
        after = sorted(selectors.lb_fleets(lb).values_list("name", flat=True))
        audit_record(principal=principal, org=lb.org, action="loadbalancer.serve" if serve else "loadbalancer.unserve",
                     obj=lb, before={"fleets": before}, after={"fleets": after})
        # Every fleet that served it before or does now renders again (and the fleets sharing their LBs).
        _restart_after_commit({fleet.pk, *Fleet.objects.filter(name__in=before + after).values_list("pk", flat=True)})
    return lb


def new_vrrp_secret() -> str:
    """VRRPv2 PASS authentication carries at most 8 octets; letters and digits keep it config-safe."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def fleet_save(*, principal: Principal, fleet: Fleet, data: dict[str, Any]) -> Fleet:
    data = dict(data)
    serves = data.pop("serves", None)
    with transaction.atomic():
        # Fleets that shared an LB before the change count its nodes too (the share rule).
        sharing_before = fleets_sharing({fleet.pk}) if fleet.pk else set()
        before = audit_snapshot(fleet) if fleet.pk else None
        for key, value in data.items():
            setattr(fleet, key, value)
        if not fleet.vrrp_secret_encrypted:
            fleet.vrrp_secret_encrypted = crypto.encrypt(new_vrrp_secret())
        fleet.save()
        if before and (before["vrrp_version"], before["vrrp_advert_ms"]) != (fleet.vrrp_version, fleet.vrrp_advert_ms):
            transaction.on_commit(lambda: vrrp_refresh(fleet_id=fleet.pk))
        if serves is not None:
            fleet.serves.set(serves)
        audit_record(principal=principal, org=principal.org, action="fleet.save", obj=fleet, before=before,
                     after=audit_snapshot(fleet))
        _restart_after_commit({fleet.pk} | sharing_before)
    return fleet


def fleet_delete(*, principal: Principal, fleet: Fleet) -> None:
    with transaction.atomic():
        sharing = fleets_sharing({fleet.pk}) - {fleet.pk}
        audit_record(principal=principal, org=principal.org, action="fleet.delete", obj=fleet,
                     before=audit_snapshot(fleet))
        fleet.delete()
        if sharing:
            _restart_after_commit(sharing)


# What changes a node's keepalived.conf (its own or its peers') without changing the fleet's revision
# (haproxy_bin: keepalived follows the HAProxy processes by that file's name).
VRRP_NODE_FIELDS = ("address", "bind_address", "enabled", "vrrp_interface", "drained", "name", "haproxy_bin",
                    "vrrp_process_events")


# What decides where a node's config binds and how Spillway reaches it: a change re-verifies the node.
NODE_REACH_FIELDS = ("address", "transport", "runtime_dir", "config_dir", "bind_address", "ssh_host", "ssh_port",
                     "ssh_user")


def node_save(*, principal: Principal, node: Node, data: dict[str, Any]) -> Node:
    """Create or update a node; `ssh_private_key` (PEM) is encrypted before it is stored."""
    data = dict(data)
    key = data.pop("ssh_private_key", None)
    with transaction.atomic():
        before = audit_snapshot(node) if node.pk else None
        for field_name, value in data.items():
            setattr(node, field_name, value)
        if key is not None:
            node.ssh_private_key_encrypted = crypto.encrypt(key)
        moved = before is not None and any(before[f] != getattr(node, f) for f in NODE_REACH_FIELDS)
        if moved and node.applied_revision_id is not None:
            # Its bundle (binds) or the way to reach it changed: nothing verified there holds any more.
            # Drifted + no verified hash makes the converge below re-push, reload and re-verify it.
            node.status, node.applied_sha256 = Node.Status.DRIFTED, ""
            node.status_detail = "address, port or transport changed: re-rendering and re-verifying"
        node.save()
        after = audit_snapshot(node)
        after["ssh_key_changed"] = key is not None
        if before is None or any(before[f] != after[f] for f in VRRP_NODE_FIELDS if f in before):
            transaction.on_commit(lambda: vrrp_refresh(fleet_id=node.fleet_id))
        if before is not None and any(before.get(f) != after.get(f) for f in NODE_SPEC_FIELDS) \
                and not node.vrrp_interface:  # a VRRP node is re-pushed by vrrp_refresh above
            node_id = node.pk
            transaction.on_commit(lambda: node_refresh(node_id=node_id))
        audit_record(principal=principal, org=principal.org, action="node.save", obj=node, before=before,
                     after=after)
        _restart_after_commit({node.fleet_id})
        if moved:
            fleet_id = node.fleet_id
            transaction.on_commit(lambda: fleet_converge(fleet=Fleet(pk=fleet_id), check_drift=False))
    return node


def node_set_service(*, principal: Principal, node: Node, state: str) -> Node:
    """drain | maintenance | in-service (frontend NodeStateView says what each does to the node).

    Maintenance drains first and waits (up to 15 s) for the node to serve the drain before it leaves the
    rollouts: a node disabled first would never be told it is drained."""
    if state == "drain":
        return node_save(principal=principal, node=node, data={"drained": True})
    if state == "in-service":
        was_enabled = node.enabled
        node = node_save(principal=principal, node=node, data={"drained": False, "enabled": True})
        if not was_enabled:  # back from maintenance: bring it onto the desired revision (drift is mended too)
            fleet_id = node.fleet_id
            transaction.on_commit(lambda: fleet_converge(fleet=Fleet(pk=fleet_id), check_drift=True))
        return node
    if state != "maintenance":
        raise DomainError("invalid_state", "A node's service state is drain, maintenance or in-service.")
    if not node.drained:
        node = node_save(principal=principal, node=node, data={"drained": True})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the refresh rollout runs in a worker (or inline in tests)
            node.refresh_from_db()
            rollouts = Rollout.objects.filter(fleet_id=node.fleet_id, status__in=Rollout.ACTIVE)
            if not rollouts.exists():
                break
            time.sleep(0.2)
    return node_save(principal=principal, node=node, data={"enabled": False})


def node_delete(*, principal: Principal, node: Node) -> None:
    with transaction.atomic():
        audit_record(principal=principal, org=principal.org, action="node.delete", obj=node,
                     before=audit_snapshot(node))
        fleet_id = node.fleet_id
        node.delete()
        _restart_after_commit({fleet_id})


# --- the engine, re-exported --------------------------------------------------------------------------

from apps.fleets.drift import fleet_converge, fleet_drift_check, fleet_drift_report  # noqa: E402
from apps.fleets.engine import (  # noqa: E402  (engine imports the functions above)
    fleet_health_collect,
    fleet_reconcile,
)

__all__ = [
    "fleet_capacity_follow",
    "fleet_change_record",
    "fleet_converge",
    "fleet_delete",
    "fleet_drift_check",
    "fleet_drift_report",
    "fleet_health_collect",
    "fleet_push",
    "fleet_reconcile",
    "fleet_render",
    "fleet_rollback",
    "fleet_save",
    "fleets_sharing",
    "member_runtime_apply",
    "node_delete",
    "node_save",
    "request_reconcile",
    "rollout_create",
    "rollout_rollback",
]
