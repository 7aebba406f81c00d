"""A database restored from a backup never rolls the fleet back silently.

After a restore, the database's desired state can be older than what the nodes serve: every revision rendered
after the dump (route changes, new LBs) is gone from it, but not from the nodes. Its first rollout would push
that older state onto every node. So each node keeps a record of the revision it was last given (`served.json`
beside its config sets, written by every apply: node/apply.py), and before a process first rolls a fleet out
(and whenever the fleet is held) it reads every node's record. A record this database cannot account for — a
revision number past its newest one, or a number it has with other contents — means the nodes are ahead of it:
the fleet is held (Fleet.restore_hold, with what the push would change on a node), its rollouts stay pending
and no node is touched, until an operator confirms (API and fleet page). Confirming accepts replacing what the
nodes serve with this database's state; the held rollouts then run.

Drift (someone editing a node's files) leaves the record alone, so a drifted node is still re-pushed at once.
The check runs once per process and fleet (a restore means stopping and starting the control plane: README),
so a route change pays nothing for it.
"""

from __future__ import annotations

import difflib
import json
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.fleets import caches
from apps.fleets.config.spec import MAIN_FILE
from apps.fleets.fanout import parallel
from apps.fleets.models import ConfigRevision, Fleet, Rollout
from apps.fleets.node.apply import NODE_ERRORS, NodePlan, transport_of
from apps.fleets.node.mapdelta import map_entries

logger = logging.getLogger(__name__)

_CHECKED: set[int] = caches.register("restore_checked", set())
DIFF_LINES = 200  # of haproxy.cfg shown in a hold
KEYS_SHOWN = 20  # map keys shown per map and direction


def served_record(rollout: Rollout) -> bytes:
    """What a node is told it is given (its served.json)."""
    revision = rollout.revision
    return json.dumps({"fleet": rollout.fleet_id, "revision": revision.number, "sha256": revision.sha256,
                       "rollout": rollout.pk}, sort_keys=True).encode()


def _read(plan: NodePlan) -> dict[str, Any] | None:
    transport = transport_of(plan.conn)
    try:
        raw = transport.read_served()
    except NODE_ERRORS:
        return None  # unreachable: the rollout's pre-flight reports it
    finally:
        transport.close()
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def unknown_records(fleet: Fleet, records: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """The nodes (by name) whose record names a revision of this fleet that this database cannot account for."""
    mine = {name: r for name, r in records.items()
            if r and r.get("fleet") == fleet.pk and isinstance(r.get("revision"), int)}
    if not mine:
        return {}
    accepted = set(fleet.restore_accepted or [])
    numbers = {r["revision"] for r in mine.values()}
    known = dict(ConfigRevision.objects.filter(fleet=fleet, number__in=numbers).values_list("number", "sha256"))
    newest = ConfigRevision.objects.filter(fleet=fleet).order_by("-number").values_list("number", flat=True).first()
    unknown = {}
    for name, record in mine.items():
        if record.get("sha256") in accepted:
            continue
        number = record["revision"]
        if (number in known and known[number] != record.get("sha256")) or (
                number not in known and number > (newest or 0)):
            unknown[name] = record
    return unknown


def _entries(content: bytes) -> dict[str, str]:
    return dict(map_entries(content.decode("utf-8", errors="replace").splitlines()))


def would_change(served: dict[str, bytes], wanted: dict[str, bytes]) -> dict[str, Any]:
    """What pushing `wanted` onto a node serving `served` changes: haproxy.cfg's diff (header comments left out)
    and each map's entries the node would lose and gain."""
    def body(files: dict[str, bytes]) -> list[str]:
        text = files.get(MAIN_FILE, b"").decode("utf-8", errors="replace")
        return [line for line in text.splitlines() if not line.startswith("# Spillway:")]

    diff = list(difflib.unified_diff(body(served), body(wanted), "on the node", "this database", lineterm="", n=1))
    maps = {}
    for name in sorted(n for n in set(served) | set(wanted) if n.startswith("maps/")):
        before, after = _entries(served.get(name, b"")), _entries(wanted.get(name, b""))
        lost = sorted(k for k in before if after.get(k) != before[k])
        gained = sorted(k for k in after if before.get(k) != after[k])
        if lost or gained:
            maps[name] = {"lost": len(lost), "gained": len(gained), "lost_keys": lost[:KEYS_SHOWN],
                          "gained_keys": gained[:KEYS_SHOWN]}
    return {"config_diff": diff[:DIFF_LINES], "config_diff_lines": len(diff), "maps": maps}


def check(rollout: Rollout, plans: dict[str, NodePlan]) -> bool:
    """Before `rollout` touches a node: True when the fleet is (now) held. Reads the nodes' records once per
    process and fleet, and again while the fleet is held."""
    fleet = rollout.fleet  # read with the rollout by execute, just before
    if fleet.pk in _CHECKED and not fleet.restore_hold:
        return False
    names = list(plans)
    records = dict(zip(names, parallel(lambda n: _read(plans[n]), names) if names else [], strict=True))
    unknown = unknown_records(fleet, records)
    if not unknown:
        _CHECKED.add(fleet.pk)
        return bool(fleet.restore_hold)
    first = sorted(unknown)[0]
    plan = plans[first]
    transport = transport_of(plan.conn)
    try:
        served = transport.read_current_files()
    except NODE_ERRORS:
        served = {}
    finally:
        transport.close()
    newest = ConfigRevision.objects.filter(fleet=fleet).order_by("-number").values_list("number", flat=True).first()
    hold = {
        "detected_at": timezone.now().isoformat(),
        "database_newest_revision": newest or 0,
        "desired_revision": rollout.revision.number,
        "nodes": [{"node": name, "serves_revision": r["revision"], "sha256": r.get("sha256", "")}
                  for name, r in sorted(unknown.items())],
        "example_node": first,
        "would_change": would_change(served, dict(plan.bundle.files)),
    }
    with transaction.atomic():
        Fleet.objects.filter(pk=fleet.pk).update(restore_hold=hold)
        Rollout.objects.filter(pk=rollout.pk).update(status=Rollout.Status.PENDING)
    logger.warning("fleet %s: nodes serve revisions this database does not know (%s): held until an operator "
                   "confirms (restored from an older backup?)", fleet.name,
                   ", ".join(f"{n['node']} r{n['serves_revision']}" for n in hold["nodes"]))
    return True


def confirm(*, fleet: Fleet, principal: Any) -> Fleet:
    """An operator accepts replacing what the nodes serve with this database's state: the held rollouts run."""
    from apps.fleets.rollout.rollouts import request_reconcile

    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
        hold = fleet.restore_hold or {}
        if not hold:
            return fleet
        accepted = list(dict.fromkeys([*(fleet.restore_accepted or []),
                                       *(n["sha256"] for n in hold.get("nodes", []) if n.get("sha256"))]))
        Fleet.objects.filter(pk=fleet.pk).update(restore_hold={}, restore_accepted=accepted[-1000:])
        audit_record(principal=principal, org=None, action="fleet.restore_confirmed", obj=fleet,
                     before={"nodes": hold.get("nodes", []),
                             "database_newest_revision": hold.get("database_newest_revision")},
                     after={"desired_revision": fleet.desired_revision})
        transaction.on_commit(lambda: request_reconcile(fleet.pk))
    fleet.refresh_from_db()
    return fleet
