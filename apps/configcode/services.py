"""Apply a config document: plan against the live export, then run the plan through the API's own rules.

Every change goes through the same viewset, serializer and service a single API call would use (so
no rule — tenancy, address policy, hostname claims, port conflicts — is written twice), all inside
one transaction: the first refused object rolls everything back. The org row is locked first and
the live export's etag compared with the one the caller read (If-Match), so an edit made by anyone
between export and apply refuses the apply (412) instead of being silently overwritten.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Organization
from apps.balancers.api import views as bv
from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Route
from apps.capacity.api.views import CapacityTestViewSet
from apps.capacity.models import CapacityTest
from apps.configcode import document, selectors
from apps.core.errors import DomainError
from apps.core.tenancy import Action, restricted, scope_for
from apps.fleets.models import Certificate
from apps.scheduling.api.views import JobViewSet
from apps.scheduling.models import Job

VIEWSETS = {"load_balancers": bv.LoadBalancerViewSet, "pools": bv.PoolViewSet, "pool_regions": bv.PoolRegionViewSet,
            "members": bv.MemberViewSet, "listeners": bv.ListenerViewSet, "routes": bv.RouteViewSet,
            "capacity_tests": CapacityTestViewSet, "jobs": JobViewSet}


class StaleDocument(DomainError):
    status = 412


def _one(qs, what: str):
    obj = qs.first()
    if obj is None:
        raise DomainError("unknown_reference", f"{what} does not exist (or is not yours to use).")
    return obj


class _Resolver:
    """Names in the file → rows the target org may use (a foreign name answers like a missing one).

    Names resolve in the org the document is applied to, whoever sends it (`scope_for`): an operator applying
    acme's file must not land acme's listener on globex's same-named LB or certificate."""

    def __init__(self, principal: Any, org: Organization) -> None:
        self.principal, self.org = scope_for(principal, org), org

    def lb(self, name: str) -> LoadBalancer:
        return _one(restricted(LoadBalancer, self.principal, Action.USE).filter(name=name), f"load balancer {name!r}")

    def pool(self, lb: str, name: str) -> Pool:
        return _one(restricted(Pool, self.principal, Action.USE).filter(lb__name=lb, name=name, org=self.org),
                    f"pool {lb}/{name}")

    def certificate(self, name: str) -> Certificate:
        return _one(restricted(Certificate, self.principal, Action.USE).filter(name=name), f"certificate {name!r}")

    def _ref(self, model, ref: str, field: str):
        """`lb/<name or priority>` → a row of `model` on that LB the principal may use."""
        lb, _, value = str(ref).partition("/")
        return _one(restricted(model, self.principal, Action.USE).filter(lb__name=lb, **{field: value}),
                    f"{model._meta.verbose_name} {ref}")

    def existing(self, kind: str, key: dict[str, Any]):
        qs = {
            "load_balancers": lambda: LoadBalancer.objects.filter(org=self.org, name=key["name"]),
            "pools": lambda: Pool.objects.filter(org=self.org, lb__name=key["lb"], name=key["name"]),
            "pool_regions": lambda: PoolRegion.objects.filter(pool__org=self.org, pool__lb__name=key["lb"],
                                                              pool__name=key["pool"], region__slug=key["region"]),
            "members": lambda: Member.objects.filter(pool__org=self.org, pool__lb__name=key["lb"],
                                                     pool__name=key["pool"], name=key["name"]),
            "listeners": lambda: Listener.objects.filter(lb__org=self.org, lb__name=key["lb"], name=key["name"]),
            "routes": lambda: Route.objects.filter(org=self.org, lb__name=key["lb"], priority=key["priority"]),
            "capacity_tests": lambda: CapacityTest.objects.filter(org=self.org, name=key["name"]),
            "jobs": lambda: Job.objects.filter(org=self.org, name=key["name"]),
        }[kind]()
        return qs.first()

    def data(self, kind: str, row: dict[str, Any]) -> dict[str, Any]:
        """The API payload for one row of the file: names replaced by the ids the serializer expects."""
        data = dict(row)
        if kind in ("load_balancers", "pools", "routes", "jobs"):
            data["org"] = self.org.slug  # an operator applying a tenant's file creates the tenant's objects
        if kind in ("pools", "listeners", "routes"):
            data["lb"] = self.lb(row["lb"]).pk
        if kind in ("pool_regions", "members"):
            data.pop("lb", None)
            data["pool"] = self.pool(row["lb"], row["pool"]).pk  # region stays a slug, as the API takes it
        if kind == "listeners":
            data["default_pool"] = self.pool(row["lb"], row["default_pool"]).pk if row.get("default_pool") else None
            data["certificate"] = self.certificate(row["certificate"]).pk if row.get("certificate") else None
        if kind == "capacity_tests":
            data["org"] = self.org.slug
            data["listener"] = self._ref(Listener, row.get("listener"), "name").pk if row.get("listener") else None
            data["route"] = self._ref(Route, row.get("route"), "priority").pk if row.get("route") else None
            data["pool"] = self.pool(*row["pool"].split("/", 1)).pk if row.get("pool") else None
        if kind == "routes":
            data["targets"] = [{"pool": self.pool(row["lb"], t["pool"]).pk, "weight": t.get("weight", 100)}
                               for t in row.get("targets") or []]
        return data


def _run(request: Any, change: document.Change, resolver: _Resolver) -> None:
    view = VIEWSETS[change.kind](request=request, format_kwarg=None, kwargs={},
                                 action={"create": "create", "update": "partial_update", "delete": "destroy"}[
                                     change.action])
    if change.action == "delete":
        view.perform_destroy(resolver.existing(change.kind, change.key))
        return
    data = resolver.data(change.kind, change.desired)
    if change.action == "update":
        instance = resolver.existing(change.kind, change.key)
        keep = set(change.fields) | {"targets"} if change.kind == "routes" else set(change.fields)
        serializer = view.get_serializer(instance, data={k: v for k, v in data.items() if k in keep}, partial=True)
        serializer.is_valid(raise_exception=True)
        view.perform_update(serializer)
    else:
        serializer = view.get_serializer(data=data)
        serializer.is_valid(raise_exception=True)
        view.perform_create(serializer)


def org_plan(*, org: Organization, doc: Any) -> tuple[dict[str, Any], list[document.Change]]:
    """(the live export, the changes applying `doc` would make)."""
    current = selectors.org_export(org)
    return current, document.plan(document.canonical(current), document.canonical(doc))


def org_apply(*, request: Any, org: Organization, doc: Any, if_match: str | None) -> list[document.Change]:
    """Apply `doc` all-or-nothing; `if_match` must be the etag of the export the file was made from."""
    document.canonical(doc)  # a malformed file is a 400 before anything else is asked of it
    wanted = (if_match or (doc.get("etag") if isinstance(doc, dict) else "") or "").strip().strip('"')
    if not wanted:
        raise DomainError("precondition_required", "Send the etag of the export this file starts from "
                          "(If-Match header or the document's etag) so a concurrent edit is not overwritten.",
                          status=428)
    resolver = _Resolver(request.principal, org)
    with transaction.atomic():
        Organization.objects.select_for_update().filter(pk=org.pk).first()
        current, changes = org_plan(org=org, doc=doc)
        if wanted not in (current["etag"], "*"):
            raise StaleDocument("stale_revision", "The org changed since this file was exported; export again, "
                                "re-apply your edit and retry.")
        for change in changes:
            try:
                _run(request, change, resolver)
            except ValidationError as exc:
                raise DomainError("apply_refused", f"{change.action} {change.kind} {change.key}: {exc.detail}",
                                  field=change.kind) from None
            except DomainError as exc:
                raise DomainError(exc.code, f"{change.action} {change.kind} {change.key}: {exc.detail}",
                                  field=exc.field, status=exc.status) from None
    return changes
