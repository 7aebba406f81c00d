"""Config revisions: render a fleet's desired state, judge it, store it as the next revision.

A route-only change takes the route lane (config/routelane.py); anything else renders from a snapshot of the
database, leaves out what cannot render (render/quarantine.py), and is judged by `haproxy -c -dW` unless only
certificate or map contents moved since a revision that passed it (ConfigRevision.validation_kind says which).
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.db import transaction

from apps.core import crypto
from apps.fleets import caches, queries
from apps.fleets.config import routelane
from apps.fleets.config.check import validate_bundle
from apps.fleets.config.reasons import change_reason
from apps.fleets.config.render import UnsafeValue, render
from apps.fleets.config.render.quarantine import quarantine
from apps.fleets.config.spec import MAIN_FILE, ConfigBundle
from apps.fleets.config.stored import content_sha256, display_text, revision_diff, snapshot_to_json, strip_header
from apps.fleets.models import ConfigRevision, Fleet

logger = logging.getLogger(__name__)

AUTO_RENDER_REASON = "desired state changed"


CERTIFICATES_ONLY_NOTE = ("Only certificate contents changed since the previous revision, which passed "
                          "`haproxy -c -dW`; each certificate was checked when stored (PEM, key matches, chain, "
                          "validity), so the check was not run again.")


def _certificates_only(latest: ConfigRevision | None, text: str) -> bool:
    """The new render differs from the latest validated revision only in certs/*.pem contents.

    The display text is haproxy.cfg (which names every certificate file) plus every other file, so an
    equal text below the header leaves only the certificates' contents. Those passed
    apps.fleets.config.certificates' checks when stored, and the nodes take them through `set ssl cert`, which
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
_VALIDATED_SHAPE: dict[int, tuple[str, str]] = caches.register("validated_shape", {})


def _shape(bundle: ConfigBundle) -> str:
    """What `haproxy -c` judges besides map contents: haproxy.cfg's body, the file names, non-map files."""
    digest = hashlib.sha256(bundle.body.encode())
    for name in sorted(bundle.files):
        digest.update(b"\0" + name.encode() + b"\0")
        if name != MAIN_FILE and name not in bundle.rendered_manifest.maps:
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


def fleet_render(*, fleet: Fleet, reason: str = "", seqs: tuple[int, int] | None = None) -> ConfigRevision:
    """Render the fleet's desired state and validate it: the latest revision if nothing changed.

    The same content as the latest revision makes no new revision; the latest then also covers the
    LB revisions just read (it serves them). A config the renderer refuses (a value failing its
    allowlist) or `haproxy -c -dW` rejects is stored with the reason and can never be rolled out.

    The fleet row is locked only to store the result, not while rendering: every route write bumps
    that row's change_seq, and at 100k routes a render holding the lock kept each write waiting for
    seconds. A revision stored by someone else meanwhile makes this render start over (its number
    and diff base are stale); the reconciler's lease makes that rare.

    `seqs`: the fleet's (change_seq, route_seq) as the caller just read them (else read here).
    """
    revision = routelane.lane_render(fleet=fleet, reason=reason, seqs=seqs)
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
    latest = queries.latest_revision(fleet)
    number = latest.number + 1 if latest else 1
    snap, lb_revisions = queries.fleet_snapshot(fleet, number)
    # One tenant's broken object must not block the others: render what is valid, keep the rest
    # as problems for their owners.
    snap, left_out = quarantine(snap, shared_bind=queries.fleet_binds_one_address(fleet))
    problems = [p.as_json() for p in left_out]
    if problems:
        logger.warning("fleet %s: revision %s leaves out %s", fleet.name, number, problems)
    try:
        bundle = render(snap, queries.reference_node(fleet))
    except UnsafeValue as exc:
        # Same refusal twice = same "content": no new revision for it.
        text, ok, output, took_ms = "", False, f"render refused: {exc}", 0.0
        kind = ConfigRevision.Validation.REFUSED
        content = hashlib.sha256(output.encode()).hexdigest()
    else:
        text, content = display_text(bundle), content_sha256(bundle)
    if latest is not None and latest.sha256 == content:
        with transaction.atomic():
            Fleet.objects.select_for_update().get(pk=fleet.pk)
            if queries.latest_revision(fleet) != latest:
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
        kind = ConfigRevision.Validation.CERTIFICATES_ONLY
    elif text and latest is not None and _maps_only(fleet.pk, latest, bundle):
        ok, output, took_ms = True, MAPS_ONLY_NOTE.format(number=latest.number), 0.0
        kind = ConfigRevision.Validation.MAPS_ONLY
    elif text:
        result = validate_bundle(bundle, settings.HAPROXY_BIN)
        ok, output, took_ms = result.ok, result.output, result.duration_ms
        kind = ConfigRevision.Validation.HAPROXY
    # After route-lane revisions (no text of their own) the diff starts from the last full text.
    shown = queries.text_revision(latest) if latest else None
    diff = revision_diff(shown.text if shown else "", text,
                         f"revision {shown.number}" if shown else "empty", f"revision {number}")
    # Name the changes it carries (from the audit log) rather than only how the render was started.
    changes = change_reason(lb_ids={int(k) for k in lb_revisions}, since=latest.created_at if latest else None)
    if changes:
        reason = changes if reason in ("", AUTO_RENDER_REASON) else f"{reason}: {changes}"
    stored = snapshot_to_json(snap, crypto.encrypt)
    with transaction.atomic():
        Fleet.objects.select_for_update().get(pk=fleet.pk)
        if queries.latest_revision(fleet) != latest:
            return None
        revision = ConfigRevision.objects.create(
            fleet=fleet, number=number, text=text, sha256=content, diff=diff,
            snapshot=stored, validation_ok=ok, validation_output=output, validation_kind=kind,
            validation_ms=took_ms, lb_revisions=lb_revisions, reason=reason[:200], problems=problems,
        )
    queries.remember_revision_snapshot(revision, snap)
    if ok and text:
        _VALIDATED_SHAPE[fleet.pk] = (content, _shape(bundle))
        routelane.remember(fleet_id=fleet.pk, revision=revision, snap=snap, bundle=bundle,
                           change_seq=seqs[0], route_seq=seqs[1])
    else:
        routelane.forget(fleet.pk)
    if not ok:
        logger.warning("fleet %s: revision %s is invalid and will not be pushed:\n%s",
                       fleet.name, number, output)
    revision.covered_seq = seqs[0]  # what this render read (rollout.reconcile.fleet_reconcile marks it rendered)
    return revision
