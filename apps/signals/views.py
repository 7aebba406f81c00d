"""The signals chart panel: loaded into the LB, route and pool pages, re-fetched with htmx."""

from __future__ import annotations

from datetime import UTC, datetime

from django.http import Http404
from django.shortcuts import render

from apps.core.errors import DomainError, NotFoundError
from apps.core.ui import PrincipalView
from apps.signals import impact, selectors
from apps.signals.api.views import chart_payload

REFRESH_S = {"5m": 5, "1h": 30, "24h": 300, "7d": 900}


class SignalsPanelView(PrincipalView):
    def get(self, request, scope: str, pk: int):
        range_name = request.GET.get("range", "5m")
        if range_name not in selectors.RANGES:
            range_name = "5m"
        try:
            payload = chart_payload(self.principal, scope, str(pk), range_name)
        except DomainError:  # no such object for them, or no such scope: the same answer
            raise Http404 from None
        return render(request, "signals/panel.html", {
            "scope": scope, "pk": pk, "range": range_name, "ranges": list(selectors.RANGES),
            "payload": payload, "totals": payload["totals"], "members": payload.get("members"),
            "panel_id": f"signals-{scope}-{pk}", "data_id": f"signals-{scope}-{pk}-data",
            # As often as a point can change: a 7-day chart re-read every 5 s cost the database for nothing.
            "refresh_s": REFRESH_S[range_name],
        })


class ChangeImpactPageView(PrincipalView):
    """A change's page: who did what, the 5 minutes before against the 5 after, and the flag."""

    def get(self, request, pk: int):
        payload = impact.change_payload(self.principal, pk)
        if payload is None:
            raise Http404
        chart = payload["impact"]["chart"] if payload["impact"] else None
        return render(request, "signals/change.html", {
            "payload": payload, "change": payload["change"], "impact": payload["impact"], "chart": chart,
            "object_url": _object_url(payload), "data_id": f"change-{pk}-data", "min_requests": impact.MIN_REQUESTS,
            "at": datetime.fromtimestamp(payload["change"]["at"], UTC)})


def _object_url(payload: dict) -> str:
    from django.urls import reverse

    scope, pk = payload.get("scope"), payload.get("target_id")
    names = {"lb": "lb-detail", "route": "route-detail", "pool": "traffic-pool"}
    return reverse(names[scope], args=[pk]) if scope in names else ""


class SampledRequestsPageView(PrincipalView):
    """The sampled requests behind a chart, filtered by route/status/region/node and time (a chart's click)."""

    def get(self, request):
        from apps.signals.api.views import requests_payload

        params = request.GET
        try:
            payload = requests_payload(self.principal, params)
            error = ""
        except NotFoundError:
            raise Http404 from None
        except DomainError as exc:
            payload, error = {"requests": []}, exc.detail
        for row in payload["requests"]:
            row["at_dt"] = datetime.fromtimestamp(row["at"], UTC)
            row["times"] = " / ".join(str(row[k]) if row[k] >= 0 else "—"  # -1: never reached that stage
                                      for k in ("t_queue_ms", "t_connect_ms", "t_upstream_ms", "t_total_ms"))
        window = [datetime.fromtimestamp(float(params[k]), UTC) if not error and params.get(k) else None
                  for k in ("since", "until")]
        return render(request, "signals/requests.html", {
            "payload": payload, "rows": payload["requests"], "error": error, "params": params,
            "since": window[0], "until": window[1], "is_operator": self.principal.is_operator,
            "statuses": ["", "failed", "5xx", "4xx", "3xx", "2xx"]})
