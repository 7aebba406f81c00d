"""UI shell: dashboard, load balancers, routes. Thin: reads through visible_to, writes through services."""

from __future__ import annotations

from django.db.models import Count, Prefetch
from django.http import HttpResponse
from django.shortcuts import render
from django.template.response import TemplateResponse
from django_htmx.http import HttpResponseClientRedirect

from apps.balancers.api.serializers import RouteSerializer
from apps.balancers.models import LoadBalancer, Member, Pool, Route
from apps.balancers.services import member_set_state, route_save
from apps.core.errors import DomainError
from frontend.base import PrincipalView


class DashboardView(PrincipalView):
    def get(self, request):
        lbs = (self.scoped(LoadBalancer).select_related("org", "fleet")
               .annotate(route_count=Count("routes", distinct=True)))
        return render(request, "dashboard.html", {"lbs": lbs})


class LoadBalancerListView(PrincipalView):
    def get(self, request):
        lbs = self.scoped(LoadBalancer).select_related("org", "fleet").order_by("name")
        q = request.GET.get("q", "").strip()
        if q:
            lbs = lbs.filter(name__icontains=q)
        return render(request, self.template_for("lb_list.html", "partials/lb_table.html"), {"lbs": lbs, "q": q})


class LoadBalancerDetailView(PrincipalView):
    def get(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        # Inside a shared LB a customer still sees only its own routes and pools.
        routes = self.scoped(Route).filter(lb=lb).prefetch_related("targets__pool").select_related("org")
        pools = (self.scoped(Pool).filter(lb=lb).select_related("org")
                 .prefetch_related("regions__region",
                                   Prefetch("members", queryset=Member.objects.select_related("region"))))
        listeners = lb.listeners.select_related("static_ip", "default_pool") if (
            self.principal.is_operator or lb.org_id == self.principal.org_id) else []
        return render(request, "lb_detail.html", {
            "lb": lb, "routes": routes, "pools": pools, "listeners": listeners,
            "can_write": self.principal.can_write,
        })


class RouteCreateView(PrincipalView):
    """htmx form: errors come back next to their fields; success reloads the workspace."""

    def post(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        data = {
            "lb": lb.pk,
            "hosts": [h for h in request.POST.get("hosts", "").split(",") if h != ""],
            "path_match": request.POST.get("path_match", "prefix"),
            "path": request.POST.get("path", "/"),
            "priority": request.POST.get("priority"),
            "targets": [{"pool": request.POST.get("pool"), "weight": 100}] if request.POST.get("pool") else [],
        }
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change routes.", status=403)
        serializer = RouteSerializer(data=data, context={"request": request})
        errors: dict = {}
        if serializer.is_valid():
            try:
                route_save(principal=self.principal, route=Route(), data=serializer.validated_data)
                return HttpResponseClientRedirect(f"/load-balancers/{lb.pk}/")
            except DomainError as exc:
                errors = {exc.field or "non_field_errors": [exc.detail]}
        else:
            errors = {k: [str(e) for e in (v if isinstance(v, list) else [v])] for k, v in serializer.errors.items()}
        pools = self.scoped(Pool).filter(lb=lb)
        return TemplateResponse(request, "partials/route_form.html",
                                {"lb": lb, "pools": pools, "errors": errors, "values": request.POST}, status=422)


class MemberStateView(PrincipalView):
    def post(self, request, pk: int):
        member = self.get_scoped(Member, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change members.", status=403)
        state = request.POST.get("admin_state")
        if state not in Member.AdminState.values:
            return HttpResponse("Unknown state.", status=400)
        member_set_state(principal=self.principal, member=member, admin_state=state)
        return render(request, "partials/member_row.html", {"m": member, "can_write": True})


def error_404(request, exception=None):
    return render(request, "404.html", status=404)


def error_500(request):
    return render(request, "500.html", status=500)
