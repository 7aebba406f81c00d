"""Load balancer list (workspace: workspace.py, dashboard: dashboard.py). Reads via visible_to, writes via services."""

from __future__ import annotations

from django.shortcuts import render

from apps.balancers.models import LoadBalancer
from apps.core.ui import PrincipalView


class LoadBalancerListView(PrincipalView):
    def get(self, request):
        lbs = self.scoped(LoadBalancer).select_related("org", "fleet").order_by("name")
        q = request.GET.get("q", "").strip()
        if q:
            lbs = lbs.filter(name__icontains=q)
        return render(request, self.template_for("lb_list.html", "partials/lb_table.html"), {"lbs": lbs, "q": q})


def error_404(request, exception=None):
    return render(request, "404.html", status=404)


def error_500(request):
    return render(request, "500.html", status=500)
