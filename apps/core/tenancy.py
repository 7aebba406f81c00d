"""The one way to reach any row through the API or the UI: `Model.objects.restrict(principal, action)`.

Every model a principal can name has a queryset with `restrict`, which answers per action
(NetBox's `RestrictedQuerySet.restrict(user, action)`):

- `view`:   rows the principal may read (lists, details, filters);
- `use`:    rows the principal may *reference* from a field it writes (a listener's certificate,
            a route's pool, an LB's cloud target). Never wider than `view`;
- `change`: rows the principal may update or delete. Never wider than `view`.

The base viewset, the base UI view and the scoped relation fields of the base serializer all go
through `restrict`, so a new endpoint or relation field is scoped without anyone remembering.
A row outside the scope is simply absent: a foreign id answers exactly like a missing one.
Operators see and use everything, except where a model says otherwise.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import Any

from django.db import models


class Action(StrEnum):
    VIEW = "view"
    USE = "use"
    CHANGE = "change"


class RestrictedQuerySet(models.QuerySet):
    """Base of every scoped queryset. Subclasses override `visible_to` / `usable_by` / `writable_by`."""

    def restrict(self, principal: Any, action: Action | str = Action.VIEW) -> models.QuerySet:
        if principal is None:
            return self.none()
        action = Action(action)
        if action is Action.USE:
            return self.usable_by(principal)
        if action is Action.CHANGE:
            return self.writable_by(principal)
        return self.visible_to(principal)

    def visible_to(self, principal: Any) -> models.QuerySet:
        raise NotImplementedError

    def usable_by(self, principal: Any) -> models.QuerySet:
        return self.visible_to(principal)

    def writable_by(self, principal: Any) -> models.QuerySet:
        return self.visible_to(principal)


class TenantQuerySet(RestrictedQuerySet):
    """Rows owned by an org, found through `TENANT_PATH` on the model (e.g. "pool__org").

    Operators see everything; anyone else sees, uses and changes only their own org's rows.
    """

    def own(self, principal: Any) -> models.QuerySet:
        return self.filter(**{f"{self.model.TENANT_PATH}_id": principal.org_id})

    def visible_to(self, principal: Any) -> models.QuerySet:
        if principal.is_operator:
            return self
        return self.own(principal)


class SharedInfraQuerySet(RestrictedQuerySet):
    """Infrastructure every org reads and references (regions, IP pools); only operators change it."""

    def visible_to(self, principal: Any) -> models.QuerySet:
        return self

    def writable_by(self, principal: Any) -> models.QuerySet:
        return self if principal.is_operator else self.none()


class OperatorQuerySet(RestrictedQuerySet):
    """The operator's own machinery (fleets, nodes, config revisions): absent for everyone else."""

    def visible_to(self, principal: Any) -> models.QuerySet:
        return self if principal.is_operator else self.none()


def restricted(model: type[models.Model], principal: Any, action: Action | str = Action.VIEW) -> models.QuerySet:
    """`model.objects.restrict(...)`, refusing models that have no scoping at all (a programming error)."""
    manager = model._default_manager
    if not hasattr(manager, "restrict"):
        raise TypeError(f"{model.__name__} has no restrict(); give it a RestrictedQuerySet before exposing it")
    return manager.restrict(principal, action)


def scope_for(principal: Any, org: Any) -> Any:
    """The principal whose scope a write into `org` resolves its references in: `org`'s own, whoever writes.

    An operator acting on a tenant's behalf (an API call with `org=acme`, an applied document, a job, a
    renewal) may see every row, but what it writes into acme must only name rows acme itself may use: an
    acme route on globex's private LB, or acme's listener serving globex's certificate, would otherwise be
    one request away. The scope is acme's; the actor stays the operator (audit and labels are unchanged,
    since only `restrict` reads the returned principal's org).
    """
    if principal is None or org is None or getattr(principal, "org_id", None) == org.pk:
        return principal
    return dataclasses.replace(principal, org=org)
