"""The load balancer workspace: routes (sort, create with a preview, inline edit, delete), members
(state and weight), static IPs, and the deploy panel (preview, push, rollout per node, history).

Reads go through visible_to (PrincipalView.scoped); writes through the balancers services, the same
ones the API calls; form errors come back next to their fields with status 422.
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.http import HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from apps.balancers.api.serializers import MemberStateSerializer, RouteSerializer
from apps.balancers.changes import change_revert, lb_changes
from apps.balancers.models import IpPool, LoadBalancer, Member, Pool, Route, StaticIP
from apps.balancers.services import member_set_state, object_delete, route_save, static_ip_allocate, static_ip_release
from apps.cloud.models import CloudApply
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView, errors_of
from apps.fleets import selectors as fleet_selectors
from apps.fleets.models import Fleet
from apps.fleets.selectors import (
    NOT_SERVED,
    diff_lines,
    lb_preview_change,
    member_health,
    serving,
    unserved_static_ips,
    what_if,
)
from apps.fleets.services import lb_serve

ROUTE_ORDERS = {"asc": ("priority", "pk"), "desc": ("-priority", "-pk")}


def route_form_data(post: QueryDict, lb: LoadBalancer, pools: list[Pool], route: Route | None = None) -> dict:
    """Form fields -> RouteSerializer input. One pool select (new route) or one weight per pool (edit)."""
    data: dict[str, Any] = {
        "lb": lb.pk,
        "hosts": [h.strip() for h in post.get("hosts", "").split(",") if h.strip()],
        "path_match": post.get("path_match", "prefix"),
        "path": post.get("path", "/"),
    }
    if post.get("priority", "").strip():  # blank: the service picks one, longer paths first
        data["priority"] = post["priority"].strip()
    if route is not None and route.redirect_url:
        data["redirect_url"] = post.get("redirect_url", "")
        data["targets"] = []
    elif "pool" in post:
        data["targets"] = [{"pool": post["pool"], "weight": 100}] if post["pool"] else []
    else:
        data["targets"] = [{"pool": p.pk, "weight": post[f"weight_{p.pk}"].strip()} for p in pools
                           if post.get(f"weight_{p.pk}", "").strip() != ""]
    return data


def route_target_pools(pools: QuerySet[Pool] | list[Pool], route: Route) -> list[Pool]:
    """Pools a route may forward to: on its LB, and its own org's unless an operator owns the route."""
    return [p for p in pools if p.lb_id == route.lb_id and (route.org.is_operator or p.org_id == route.org_id)]


def rollout_verb(fleets: list[Fleet]) -> str:
    """What saving a change does to the nodes: the submit buttons say it."""
    if not fleets:
        return ""
    if all(f.auto_rollout for f in fleets):
        return "push"
    return "held"


class WorkspaceMixin:
    """Queries shared by the workspace page and its partials (constant in the number of rows)."""

    def routes(self, lb: LoadBalancer, order: str) -> QuerySet[Route]:
        return (self.scoped(Route).filter(lb=lb).select_related("org")
                .prefetch_related("targets__pool").order_by(*ROUTE_ORDERS[order]))

    def pools(self, lb: LoadBalancer) -> QuerySet[Pool]:
        return (self.scoped(Pool).filter(lb=lb).select_related("org").order_by("name")
                .prefetch_related("regions__region",
                                  Prefetch("members", queryset=Member.objects.select_related("region"))))

    def can_manage(self, lb: LoadBalancer) -> bool:
        """Operators and the LB's owner see its listeners and its org's static IPs."""
        return self.principal.is_operator or lb.org_id == self.principal.org_id

    def ip_org(self, lb: LoadBalancer):
        return lb.org if self.can_manage(lb) else self.principal.org

    def static_ip_context(self, lb: LoadBalancer, errors: dict | None = None, values: Any = None) -> dict:
        ips = (self.scoped(StaticIP).filter(org=self.ip_org(lb)).exclude(state=StaticIP.State.FREE)
               .select_related("pool").prefetch_related("listeners__lb"))
        ip_pools = IpPool.objects.select_related("region").order_by("name")
        return {"lb": lb, "ips": ips, "ip_pools": ip_pools, "ip_org": self.ip_org(lb),
                "can_write": self.principal.can_write, "errors": errors or {}, "values": values or {}}

    def listeners_context(self, lb: LoadBalancer, errors: dict | None = None) -> dict:
        """The listeners card: listeners (owner and operators only) and the static IPs reserved for the
        LB's organization that this principal may attach."""
        listeners = (list(lb.listeners.select_related("lb", "static_ip", "default_pool").order_by("port"))
                     if self.can_manage(lb) else [])
        unserved = unserved_static_ips(listeners)
        for listener in listeners:
            listener.vip_unserved = listener.pk in unserved
        attachable = (self.scoped(StaticIP, "use").filter(org_id=lb.org_id).exclude(state=StaticIP.State.FREE)
                      .order_by("address"))
        return {"lb": lb, "listeners": listeners, "attachable": list(attachable), "can_manage": self.can_manage(lb),
                "not_served": NOT_SERVED,
                "can_write": self.principal.can_write, "listener_errors": errors or {}}

    def serving_context(self, lb: LoadBalancer) -> dict:
        rows = serving(lb) if lb.kind == LoadBalancer.Kind.HAPROXY else []
        taken = {r.fleet.pk for r in rows}
        addable = ([f for f in self.scoped(Fleet).select_related("region").order_by("name") if f.pk not in taken]
                   if self.principal.is_operator else [])
        return {"lb": lb, "serving": rows, "addable": addable, "is_operator": self.principal.is_operator,
                "can_serve": self.principal.is_operator and self.principal.can_write}

    def changes_context(self, lb: LoadBalancer) -> dict:
        return {"lb": lb, "changes": lb_changes(lb=lb, principal=self.principal),
                "can_revert": self.principal.can_write}

    def cloud_context(self, lb: LoadBalancer) -> dict | None:
        """A cloud LB's Terraform JSON (newest synthesis) and last plan, shown in place (also downloadable)."""
        if lb.kind == LoadBalancer.Kind.HAPROXY:
            return None
        applies = self.scoped(CloudApply).filter(lb=lb).order_by("-created_at", "-pk")
        synthesized = applies.exclude(synth_json=None).first()
        planned = applies.exclude(plan_output="").first()
        return {
            "synthesized": synthesized, "planned": planned,
            "json": json.dumps(synthesized.synth_json, indent=2, sort_keys=True) if synthesized else "",
        }

    def can_push(self, lb: LoadBalancer) -> bool:
        return fleet_selectors.can_push(self.principal, lb)


def with_health(pools: list[Pool]) -> list[Pool]:
    """Each member of these (prefetched) pools gets `.health` (apps.fleets.health.members), in one query."""
    members = [m for p in pools for m in p.members.all()]
    health = member_health(members)
    for m in members:
        m.health = health.get(m.pk)
    return pools


def order_of(request) -> str:
    order = request.GET.get("order", "asc")
    return order if order in ROUTE_ORDERS else "asc"


class LoadBalancerDetailView(WorkspaceMixin, PrincipalView):
    def get(self, request, pk: int):
        lb = get_object_or_404(self.scoped(LoadBalancer).select_related("org"), pk=pk)
        order = order_of(request)
        # Inside a shared LB a customer still sees only its own routes and pools.
        pools = with_health(list(self.pools(lb)))
        fleets = list(fleet_selectors.lb_fleets(lb).select_related("region")) if lb.kind == "haproxy" else []
        context = {
            **self.listeners_context(lb),
            "cloud": self.cloud_context(lb),
            "lb": lb, "routes": self.routes(lb, order), "order": order, "pools": pools,
            "can_write": self.principal.can_write, "can_push": self.can_push(lb), "fleets": fleets,
            "verb": rollout_verb(fleets), "values": {}, "errors": {},
            "deploy": fleet_selectors.deploy_state(lb, fleets, self.principal) if fleets else None,
            "history": fleet_selectors.history(fleets, self.principal.is_operator),
            **self.static_ip_context(lb),
        }
        return render(request, "lb_detail.html", context)


class LbServingView(WorkspaceMixin, PrincipalView):
    """The "Served by" card: the fleets (regions) serving the LB; operators add or remove one, after a what-if of
    what it does to each pool's traffic (GET ?fleet=<id>&serve=1|0), confirmed with POST."""

    def get(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        context = self.serving_context(lb)
        fleet = self._fleet(request.GET.get("fleet", ""))
        if fleet is not None and self.principal.is_operator:
            serve = request.GET.get("serve", "1") == "1"
            context.update(preview=what_if(lb, fleet, serve), preview_fleet=fleet, preview_serve=serve)
        return render(request, "partials/lb_serving.html", context)

    def post(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        fleet = self._fleet(request.POST.get("fleet", ""))
        if not (self.principal.is_operator and self.principal.can_write) or fleet is None:
            return HttpResponse("Only the operator decides which fleets serve a load balancer.", status=403)
        serve = request.POST.get("serve", "1") == "1"
        lb_serve(principal=self.principal, lb=lb, fleet=fleet, serve=serve)
        return render(request, "partials/lb_serving.html", {
            **self.serving_context(lb), "saved": f"{fleet.name} ({fleet.region.slug}) "
                                                 f"{'now serves' if serve else 'no longer serves'} {lb.name}; the "
                                                 "fleets roll it out now."})

    def _fleet(self, raw: str) -> Fleet | None:
        return self.scoped(Fleet).select_related("region").filter(pk=int(raw) if raw.isdigit() else 0).first()


class LbChangesView(WorkspaceMixin, PrincipalView):
    """The LB's changes card; POST reverts one on every fleet serving the LB (apps.balancers.changes)."""

    def get(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        return render(request, "partials/lb_changes.html", self.changes_context(lb))

    def post(self, request, pk: int, event: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot revert changes.", status=403)
        try:
            result = change_revert(principal=self.principal, lb=lb, event_id=event)
        except DomainError as exc:
            return render(request, "partials/lb_changes.html", {**self.changes_context(lb), "error": exc.detail},
                          status=exc.status if exc.status != 404 else 404)
        return render(request, "partials/lb_changes.html", {**self.changes_context(lb), "reverted": result})


class RoutesView(WorkspaceMixin, PrincipalView):
    """GET: the routes table in the asked order (the priority header toggles it). POST: a new route."""

    def get(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        order = order_of(request)
        return render(request, "partials/routes_table.html", {
            "lb": lb, "routes": self.routes(lb, order), "order": order, "can_write": self.principal.can_write})

    def new_route(self, request, pk: int) -> tuple[LoadBalancer, list[Pool], RouteSerializer] | HttpResponse:
        """The posted new-route form, bound to its LB and the principal's pools there (or a 403)."""
        lb = self.get_scoped(LoadBalancer, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change routes.", status=403)
        pools = list(self.scoped(Pool).filter(lb=lb))
        return lb, pools, RouteSerializer(data=route_form_data(request.POST, lb, pools), context={"request": request})

    def post(self, request, pk: int):
        bound = self.new_route(request, pk)
        if isinstance(bound, HttpResponse):
            return bound
        lb, pools, serializer = bound
        if serializer.is_valid():
            try:
                route_save(principal=self.principal, route=Route(), data=serializer.validated_data)
                return HttpResponseClientRedirect(reverse("lb-detail", kwargs={"pk": lb.pk}))
            except DomainError as exc:
                errors = errors_of(exc)
        else:
            errors = errors_of(serializer.errors)
        return self.form(request, lb, pools, errors=errors, status=422)

    def form(self, request, lb: LoadBalancer, pools: list[Pool], *, errors: dict, status: int = 200,
             previews: list | None = None) -> HttpResponse:
        fleets = list(fleet_selectors.lb_fleets(lb)) if lb.kind == "haproxy" else []
        return render(request, "partials/route_form.html", {
            "lb": lb, "pools": pools, "errors": errors, "values": request.POST, "previews": previews,
            "verb": rollout_verb(fleets), "fleets": fleets}, status=status)


class RoutePreviewView(RoutesView):
    """The new route's effect on every fleet's config, before anything is saved or pushed."""

    http_method_names = ["post"]

    def post(self, request, pk: int):
        bound = self.new_route(request, pk)
        if isinstance(bound, HttpResponse):
            return bound
        lb, pools, serializer = bound
        if not serializer.is_valid():
            return self.form(request, lb, pools, errors=errors_of(serializer.errors), status=422)
        try:
            previews = lb_preview_change(lb=lb, principal=self.principal, change=lambda: route_save(
                principal=self.principal, route=Route(), data=serializer.validated_data))
        except DomainError as exc:
            return self.form(request, lb, pools, errors=errors_of(exc), status=422)
        for entry in previews:
            entry["lines"] = diff_lines(entry.get("diff", ""))
        return self.form(request, lb, pools, errors={}, previews=previews)


class RouteView(WorkspaceMixin, PrincipalView):
    """One route: its page (or its table row for htmx), the inline edit row, save, delete."""

    def get_route(self, pk: int) -> Route:
        return get_object_or_404(self.scoped(Route).select_related("lb", "org"), pk=pk)

    def row(self, request, route: Route, status: int = 200) -> HttpResponse:
        route = Route.objects.prefetch_related("targets__pool").select_related("lb", "org").get(pk=route.pk)
        return render(request, self.template_for("route_detail.html", "partials/route_row.html"),
                      {"r": route, "lb": route.lb, "can_write": self.principal.can_write}, status=status)

    def get(self, request, pk: int):
        return self.row(request, self.get_route(pk))

    def delete(self, request, pk: int):
        route = self.get_route(pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change routes.", status=403)
        object_delete(principal=self.principal, obj=route)
        # 200 with no body: htmx swaps the row away (a 204 would leave it).
        return HttpResponse("")


class RouteEditView(RouteView):
    def edit_row(self, request, route: Route, *, values: Any = None, errors: dict | None = None,
                 status: int = 200) -> HttpResponse:
        pools = route_target_pools(self.scoped(Pool).filter(lb_id=route.lb_id).order_by("name"), route)
        weights = {t.pool_id: t.weight for t in route.targets.all()}
        if values is not None:
            weights = {p.pk: values.get(f"weight_{p.pk}", "") for p in pools}
        targets = [(p, weights.get(p.pk, "")) for p in pools]
        return render(request, "partials/route_edit_row.html", {
            "r": route, "targets": targets, "values": values, "errors": errors or {}}, status=status)

    def get(self, request, pk: int):
        route = self.get_route(pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change routes.", status=403)
        return self.edit_row(request, route)

    def post(self, request, pk: int):
        route = self.get_route(pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change routes.", status=403)
        pools = route_target_pools(self.scoped(Pool).filter(lb_id=route.lb_id), route)
        data = route_form_data(request.POST, route.lb, pools, route)
        serializer = RouteSerializer(instance=route, data=data, context={"request": request})
        if serializer.is_valid():
            try:
                route_save(principal=self.principal, route=route, data=serializer.validated_data)
                return self.row(request, route)
            except DomainError as exc:
                errors = errors_of(exc)
        else:
            errors = errors_of(serializer.errors)
        route = self.get_route(pk)  # route_save may have set fields before a rule refused them
        return self.edit_row(request, route, values=request.POST, errors=errors, status=422)


class MemberStateView(PrincipalView):
    """Drain / maint / ready and weight: the service also applies them on the nodes' runtime API."""

    def post(self, request, pk: int):
        member = self.get_scoped(Member, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change members.", status=403)
        data = {}
        if request.POST.get("admin_state", member.admin_state) != member.admin_state:
            data["admin_state"] = request.POST["admin_state"]
        if request.POST.get("weight", "").strip() not in ("", str(member.weight)):
            data["weight"] = request.POST["weight"].strip()
        member.health = member_health([member]).get(member.pk)
        context: dict[str, Any] = {"m": member, "can_write": True, "errors": {}}
        if data:
            serializer = MemberStateSerializer(data=data)
            if not serializer.is_valid():
                context.update(errors=errors_of(serializer.errors), values=request.POST)
                return render(request, "partials/member_row.html", context, status=422)
            member_set_state(principal=self.principal, member=member, **serializer.validated_data)
        return render(request, "partials/member_row.html", context)


class StaticIpsView(WorkspaceMixin, PrincipalView):
    """The workspace's static IP section: allocate an address for the LB's org (or one's own)."""

    def post(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot allocate addresses.", status=403)
        pool_id = request.POST.get("pool", "")
        pool = IpPool.objects.filter(pk=pool_id).first() if pool_id.isdigit() else None
        address = request.POST.get("address", "").strip() or None
        errors: dict[str, list[str]] = {}
        if pool is None:
            errors["pool"] = ["Choose an IP pool."]
        else:
            try:
                static_ip_allocate(principal=self.principal, pool=pool, org=self.ip_org(lb), address=address)
            except ValueError:
                errors["address"] = [f"'{address}' is not an IP address."]
            except DomainError as exc:
                errors = errors_of(exc)
        status = 422 if errors else 200
        return render(request, "partials/static_ips.html",
                      self.static_ip_context(lb, errors, request.POST if errors else None), status=status)


class StaticIpReleaseView(WorkspaceMixin, PrincipalView):
    def post(self, request, pk: int, ip: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        static_ip = self.get_scoped(StaticIP, pk=ip)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot release addresses.", status=403)
        errors: dict[str, list[str]] = {}
        try:
            static_ip_release(principal=self.principal, ip=static_ip)
        except DomainError as exc:
            errors = errors_of(exc)
        return render(request, "partials/static_ips.html", self.static_ip_context(lb, errors),
                      status=409 if errors else 200)


class DeployStatusPartial(PrincipalView):
    def get(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        fleets = list(fleet_selectors.lb_fleets(lb).select_related("region"))
        return render(request, "partials/deploy_status.html",
                      {"lb": lb, "deploy": fleet_selectors.deploy_state(lb, fleets, self.principal)})


class PoolHealthPartial(WorkspaceMixin, PrincipalView):
    """The health cells of one pool's members, swapped in place (out of band) every few seconds, so a
    drain counts its open sessions down to zero while the person watches."""

    def get(self, request, pk: int):
        pool = get_object_or_404(self.scoped(Pool).prefetch_related(
            Prefetch("members", queryset=Member.objects.select_related("region"))), pk=pk)
        return render(request, "partials/pool_health.html", {"pool": with_health([pool])[0]})
