"""Balancers' signals -> fleet work. Both signals are sent after commit (apps.balancers.signals)."""

from __future__ import annotations

import logging

from apps.core.enqueue import enqueue
from apps.fleets import selectors, services

logger = logging.getLogger(__name__)


def on_lb_changed(sender, lb_id: int, revision: int, routes_only: bool = False, **kwargs) -> None:
    services.lb_fleets_mark_changed(lb_id=lb_id, routes_only=routes_only)


def on_member_runtime_changed(sender, member_id: int, **kwargs) -> None:
    from apps.balancers.models import Member

    lb_id = Member.objects.filter(pk=member_id).values_list("pool__lb_id", flat=True).first()
    if lb_id is None or not selectors.fleet_ids_for_lb(lb_id):
        return  # no HAProxy node serves it
    # A task, not inline: the web request must not wait on (possibly remote) nodes.
    enqueue("fleets.member_runtime_task", member_id)


def connect() -> None:
    from apps.balancers.signals import lb_changed, member_runtime_changed

    lb_changed.connect(on_lb_changed, dispatch_uid="fleets.on_lb_changed")
    member_runtime_changed.connect(on_member_runtime_changed, dispatch_uid="fleets.on_member_runtime_changed")
