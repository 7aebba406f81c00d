"""The signals chart panel: loaded into the LB, route and pool pages, re-fetched with htmx."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render

from apps.core.errors import NotFoundError
from apps.core.ui import PrincipalView
from apps.signals import selectors
from apps.signals.api.views import chart_payload


class SignalsPanelView(PrincipalView):
    def get(self, request, scope: str, pk: int):
        range_name = request.GET.get("range", "5m")
        if range_name not in selectors.RANGES:
            range_name = "5m"
        try:
            payload = chart_payload(self.principal, scope, str(pk), range_name)
        except NotFoundError:
            raise Http404 from None
        return render(request, "signals/panel.html", {
            "scope": scope, "pk": pk, "range": range_name, "ranges": list(selectors.RANGES),
            "payload": payload, "totals": payload["totals"], "members": payload.get("members"),
            "panel_id": f"signals-{scope}-{pk}", "data_id": f"signals-{scope}-{pk}-data",
        })
