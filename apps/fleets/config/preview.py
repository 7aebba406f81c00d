"""What the next rollout would change on each fleet serving an LB: rendered, validated, never stored.

Operators get the whole diff and the validation output. A customer on a shared LB gets only the diff
lines the render manifest says are its own (routes, pools, hostnames: `_Own`), so it never reads
another tenant's hostnames. Nothing here parses config text: line owners come from the manifest of
the new render and of the base revision rendered again from its stored snapshot.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.accounts.principal import Principal
from apps.balancers.models import LoadBalancer, Pool, Route
from apps.fleets import queries
from apps.fleets.config.check import validate_bundle
from apps.fleets.config.render import UnsafeValue, render
from apps.fleets.config.render.quarantine import quarantine
from apps.fleets.config.render.routing import ANY_HOST_CLASS
from apps.fleets.config.spec import ConfigBundle, FleetSnapshot, NodeSpec, Owner
from apps.fleets.config.stored import content_sha256, display_lines, display_text, revision_diff
from apps.fleets.models import ConfigRevision


@dataclass(frozen=True)
class _Own:
    """Which rendered lines a customer may read: those whose manifest owner is its own.

    A routes-map entry (an owner with an action) is listed under every host class an any-host route
    reaches, other tenants' hostnames included: it is the customer's only when its action (own pool,
    or own route's redirect) *and* its host class (own hostname or `*`) both are.
    """

    routes: frozenset[int]
    pools: frozenset[int]
    hosts: frozenset[str]

    def __call__(self, owner: Owner | None) -> bool:
        if owner is None:
            return False
        if owner.route is not None:
            mine = owner.route in self.routes
        elif owner.pools:
            mine = all(p in self.pools for p in owner.pools)
        else:
            return owner.host is not None and owner.host in self.hosts
        if owner.action is not None:
            return mine and (owner.host == ANY_HOST_CLASS or owner.host in self.hosts)
        return mine


def _own(lb: LoadBalancer, principal: Principal) -> _Own:
    routes = list(Route.objects.visible_to(principal).filter(lb=lb).values_list("pk", "hosts"))
    pools = Pool.objects.visible_to(principal).filter(lb=lb).values_list("pk", flat=True)
    return _Own(routes=frozenset(pk for pk, _ in routes), pools=frozenset(pools),
                hosts=frozenset(h for _, hosts in routes for h in hosts or ()))


def lb_preview(*, lb: LoadBalancer, principal: Principal) -> list[dict[str, Any]]:
    """What the next rollout would change on each fleet serving `lb`: nothing is stored or pushed."""
    return _preview_compute(_preview_gather(lb, principal))


@dataclass(frozen=True)
class _PreviewInput:
    fleet: str
    base: ConfigRevision | None  # what the fleet's nodes should serve now
    base_snapshot: FleetSnapshot | None  # what `base` was rendered from (line owners of its text)
    snapshot: FleetSnapshot  # desired state, read from the database
    node: NodeSpec
    own: _Own | None  # customers: the diff lines they may read
    problems: list[dict[str, Any]]  # objects the render would leave out, the principal's own only


def _preview_gather(lb: LoadBalancer, principal: Principal) -> list[_PreviewInput]:
    """Everything a preview reads from the database; rendering and `haproxy -c` come after."""
    own = None if principal.is_operator else _own(lb, principal)
    inputs = []
    for fleet in queries.lb_fleets(lb).select_related("region"):
        base = ConfigRevision.objects.filter(fleet=fleet, number=fleet.desired_revision).first()
        latest = queries.latest_revision(fleet)
        snap, _ = queries.fleet_snapshot(fleet, (latest.number + 1) if latest else 1)
        snap, left_out = quarantine(snap, shared_bind=queries.fleet_binds_one_address(fleet))
        problems = queries.render_problems_for(principal, [p.as_json() for p in left_out])
        # A route-lane revision has no text of its own; its snapshot comes from its chain.
        base_snapshot = (queries.revision_snapshot(base) if base is not None and (base.text or base.base_id)
                         else None)
        inputs.append(_PreviewInput(fleet.name, base, base_snapshot, snap, queries.reference_node(fleet), own,
                                    problems))
    return inputs


def _changed_lines(old: ConfigBundle | None, new: ConfigBundle) -> list[tuple[str, Owner | None]]:
    """Every removed (`-`) and added (`+`) line between two renders, as in their unified diff, with its
    owner from the manifests."""
    old_lines, old_owners = display_lines(old) if old is not None else ([], [])
    new_lines, new_owners = display_lines(new)
    changed = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_lines, new_lines).get_opcodes():
        if tag != "equal":
            changed += [("-" + old_lines[i], old_owners[i]) for i in range(i1, i2)]
            changed += [("+" + new_lines[j], new_owners[j]) for j in range(j1, j2)]
    return changed


def _base_bundle(item: _PreviewInput) -> ConfigBundle | None:
    if item.base_snapshot is None:
        return None
    try:
        return render(item.base_snapshot, item.node)
    except UnsafeValue:  # stored before a rule tightened: its lines count as nobody's
        return None


def _preview_compute(inputs: list[_PreviewInput]) -> list[dict[str, Any]]:
    previews = []
    for item in inputs:
        base = item.base
        entry: dict[str, Any] = {"fleet": item.fleet, "base_revision": base.number if base else None,
                                 "left_out": item.problems}
        try:
            bundle = render(item.snapshot, item.node)
        except UnsafeValue as exc:
            # The value may be another tenant's (a hostname, a path): customers are told only that it failed.
            problem = str(exc) if item.own is None else (
                "The configuration could not be rendered; an operator can see why.")
            entry.update(changed=True, valid=False, diff="", problem=problem)
            previews.append(entry)
            continue
        changed = base is None or base.sha256 != content_sha256(bundle)
        lines = _changed_lines(_base_bundle(item), bundle) if changed else []
        result = validate_bundle(bundle, settings.HAPROXY_BIN) if changed else None
        entry.update(changed=changed, valid=True if result is None else result.ok, problem="")
        if item.own is None:
            base_text = base.text if base else ""
            if base is not None and not base_text:  # a route-lane revision: its text rendered from its chain
                base_bundle = _base_bundle(item)
                base_text = display_text(base_bundle) if base_bundle is not None else ""
            entry["diff"] = revision_diff(base_text, display_text(bundle),
                                          f"revision {base.number}" if base else "empty", "preview") if changed else ""
            entry["validation_output"] = result.output if result else ""
        else:
            lines = [(line, owner) for line, owner in lines if item.own(owner)]
            entry["diff"] = "".join(line + "\n" for line, _ in lines)
            # Whether, and how much, other tenants changed is theirs to know: "changed" and the diff
            # speak of the principal's own lines only, and no count of the others is given.
            entry["changed"] = bool(lines)
            entry["scope"] = "own"
            if result is not None and not result.ok:
                entry["problem"] = "The rendered configuration failed validation; an operator can see why."
        entry["legend"] = _action_legend([owner for _, owner in lines], item.snapshot)
        previews.append(entry)
    return previews


def _action_legend(owners: list[Owner | None], snapshot: FleetSnapshot) -> dict[str, str]:
    """What the action keys at the end of the shown routes-map lines stand for (`p12` -> its pool,
    `u7` -> route 7's redirect), for the lines shown only, so a customer's legend names nothing it
    may not see. Canary splits (`s0`) are spelled out in haproxy.cfg instead."""
    pools = {p.id: f"pool {p.name}" for p in snapshot.pools}
    legend = {}
    for owner in owners:
        if owner is None or owner.action is None:
            continue
        if owner.route is not None:
            legend[owner.action] = f"redirect of route {owner.route}"
        elif len(owner.pools) == 1 and owner.pools[0] in pools and not owner.action.startswith("s"):
            legend[owner.action] = pools[owner.pools[0]]
    return dict(sorted(legend.items()))


class _DiscardPreviewedChange(Exception):
    """Rolls back a change that was made only to be previewed."""


def lb_preview_change(*, lb: LoadBalancer, principal: Principal, change: Callable[[], Any]) -> list[dict[str, Any]]:
    """`lb_preview` as if `change` (a write through a balancers service) were saved; nothing is kept.

    The change runs in a transaction that is always rolled back, so its revision bump, audit event
    and rollout (those wait for commit) never happen. The change's own rules still run: a
    DomainError it raises reaches the caller, as it would on save.
    """
    inputs: list[_PreviewInput] = []
    try:
        with transaction.atomic():
            change()
            inputs = _preview_gather(lb, principal)
            raise _DiscardPreviewedChange
    except _DiscardPreviewedChange:
        pass
    # Rendered and validated after the rollback: the change's LB row lock must not be held through
    # `haproxy -c`, or every other tenant's save on a shared LB would wait for this preview.
    return _preview_compute(inputs)
