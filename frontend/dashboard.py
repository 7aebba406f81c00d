"""Dashboard: fleet health, failing checks, overflow per region, rollouts, audit, load balancers.

The page renders every panel once; each panel then polls its own partial (`/dashboard/<panel>/`)
every few seconds, so nothing reloads the page. Reads go through visible_to and the apps'
selectors; every panel runs a fixed number of queries and shows a bounded list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from django.db.models import Count, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import Http404
from django.shortcuts import render

from apps.audit.models import AuditEvent
from apps.balancers.models import LoadBalancer, Member, Route
from apps.core.ui import PrincipalView
from apps.fleets import selectors as fleet_selectors
from apps.fleets.selectors import member_health
from apps.signals import selectors as signal_selectors
from apps.traffic import selectors as traffic_selectors
from apps.traffic.views import bar_scale

# Sums over every pool: up to 1 h they read 10 s points (one row per pool, region and 10 s), so the
# live default is short; longer windows read 5 min points, and 7 days and more are per-pool pages.
WINDOWS: Final = (("15m", "15 min"), ("1h", "1 hour"), ("6h", "6 hours"), ("24h", "24 hours"))
DEFAULT_WINDOW: Final = "15m"
LB_LIMIT: Final = 20
ROLLOUT_LIMIT: Final = 8
AUDIT_LIMIT: Final = 8
CHECK_LIMIT: Final = 10
MEMBER_SCAN: Final = 500  # members whose health the panel reads (their states summed; the rest counted)
MEMBER_LIMIT: Final = 10
POLL: Final = "every 5s"


class DashboardMixin:
    def window(self) -> tuple[str, int]:
        text = self.request.GET.get("window", DEFAULT_WINDOW)
        if text not in dict(WINDOWS):
            text = DEFAULT_WINDOW
        return text, traffic_selectors.parse_window(text)

    def fleets_panel(self) -> dict[str, Any]:
        return fleet_selectors.fleet_overview(self.principal)

    def checks_panel(self) -> dict[str, Any]:
        return {"checks": fleet_selectors.failing_checks(self.principal, limit=CHECK_LIMIT),
                "reporting": fleet_selectors.nodes_reporting(self.principal)}

    def members_panel(self) -> dict[str, Any]:
        """Members by live state (up, down, draining with the sessions still open), problems listed first."""
        members = list(self.scoped(Member).select_related("region", "pool__lb").order_by("pk")[:MEMBER_SCAN])
        health = member_health(members)
        counts = {"up": 0, "down": 0, "drain": 0, "maint": 0, "unknown": 0}
        attention = []
        for m in members:
            m.health = health.get(m.pk)
            state = m.health.state if m.health else "unknown"
            counts[state] += 1
            if state in ("down", "drain") or (m.health and m.health.check):
                attention.append(m)
        rank = {"down": 0, "drain": 1}
        attention.sort(key=lambda m: (rank.get(m.health.state, 2), -m.health.sessions, m.name))
        return {"member_counts": counts, "member_total": len(members),
                "member_attention": attention[:MEMBER_LIMIT], "member_more": len(attention) > MEMBER_LIMIT}

    def overflow_panel(self) -> dict[str, Any]:
        window, window_s = self.window()
        overflow = traffic_selectors.region_overflow(self.principal, window_s)
        return {"overflow": overflow, "window": window, "windows": WINDOWS,
                "bars": bar_scale([dict(r) for r in overflow["regions"]])}

    def routes_panel(self) -> dict[str, Any]:
        return {"top_routes": signal_selectors.top_routes(self.principal),
                "top_candidates": signal_selectors.TOP_LATENCY_CANDIDATES}

    def rollouts_panel(self) -> dict[str, Any]:
        return {"rollouts": fleet_selectors.recent_rollouts(self.principal, limit=ROLLOUT_LIMIT)}

    def audit_panel(self) -> dict[str, Any]:
        return {"events": list(self.scoped(AuditEvent).select_related("org")[:AUDIT_LIMIT])}

    def lbs_panel(self) -> dict[str, Any]:
        # A customer's count covers its own routes only, also on a shared LB that carries others'.
        routes = (Route.objects.visible_to(self.principal).filter(lb=OuterRef("pk")).order_by()
                  .values("lb").annotate(n=Count("pk")).values("n"))
        lbs = self.scoped(LoadBalancer)
        rows = list(lbs.select_related("org", "fleet").prefetch_related("serving_fleets").annotate(
            route_count=Coalesce(Subquery(routes, output_field=IntegerField()), Value(0)),
        ).order_by("name")[:LB_LIMIT])
        for lb in rows:  # every fleet that serves it (its own and those serving it too), regions in words
            fleets = {f.pk: f for f in [*([lb.fleet] if lb.fleet else []), *lb.serving_fleets.all()]}
            lb.fleet_names = ", ".join(sorted(f.name for f in fleets.values()))
        return {"lbs": rows, "lb_total": lbs.count()}

    def panels(self) -> dict[str, Callable[[], dict[str, Any]]]:
        return {"fleets": self.fleets_panel, "checks": self.checks_panel, "members": self.members_panel,
                "overflow": self.overflow_panel, "routes": self.routes_panel,
                "rollouts": self.rollouts_panel, "audit": self.audit_panel, "lbs": self.lbs_panel}

    def common(self) -> dict[str, Any]:
        return {"is_operator": self.principal.is_operator, "poll": POLL}


class DashboardView(DashboardMixin, PrincipalView):
    def get(self, request):
        context = self.common()
        for build in self.panels().values():
            context.update(build())
        return render(request, "dashboard.html", context)


class DashboardPanelView(DashboardMixin, PrincipalView):
    """One panel alone: what the page's htmx polling swaps in."""

    def get(self, request, panel: str):
        build = self.panels().get(panel)
        if build is None:
            raise Http404("No such panel.")
        return render(request, f"dashboard/_{panel}.html", self.common() | build())
