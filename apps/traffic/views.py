"""Overflow UI: pools with their capacities; per pool a live per-region panel, a timeline and a what-if.

Thin: reads through visible_to / selectors, the what-if through the same service as the API.
"""

from __future__ import annotations

import math
from typing import Any

from django.shortcuts import render

from apps.balancers.models import Pool
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView
from apps.traffic import selectors, services
from apps.traffic.models import OverflowState

WINDOWS = (("5m", "5 min"), ("1h", "1 hour"), ("6h", "6 hours"), ("24h", "24 hours"), ("7d", "7 days"))


def bar_scale(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-region rows plus the scale every bar of the panel shares (req/s)."""
    scale = 0.0
    for row in rows:
        for key in ("capacity", "demand", "local", "out", "in"):
            value = row.get(key)
            if value is not None and math.isfinite(value):
                scale = max(scale, value)
        row["served"] = round((row.get("local") or 0.0) + (row.get("in") or 0.0), 3)
    return {"rows": rows, "scale": scale or 1.0}


class TrafficIndexView(PrincipalView):
    """Every pool: where it overflows now (the state its overflow events hold), and its capacity per region."""

    def get(self, request):
        pools = selectors.pool_overview(self.scoped(Pool))
        overflowing: dict[int, list] = {}
        for state in self.scoped(OverflowState).filter(overflowing=True).order_by("region"):
            overflowing.setdefault(state.pool_id, []).append(state)
        for row in pools:
            row["overflowing"] = overflowing.get(row["pool"].pk, [])
        return render(request, "traffic/index.html", {"pools": pools})


class PoolPanelMixin:
    def _window(self) -> tuple[str, int]:
        text = self.request.GET.get("window", "5m")
        try:
            return text, selectors.parse_window(text)
        except selectors.WindowError:
            return "5m", 300

    def _panel_context(self, pool: Pool) -> dict[str, Any]:
        window, window_s = self._window()
        seen = selectors.observed_overflow(pool, window_s)
        latest = seen["latest"]["regions"] if seen["latest"] else []
        current = {row["region"]: row for row in seen["regions"]}
        for row in latest:  # the latest bucket has no "now" capacity; show the current one beside it
            row.setdefault("capacity_now", current.get(row["region"], {}).get("capacity"))
        return {
            "pool": pool, "window": window, "windows": WINDOWS, "seen": seen,
            "latest": bar_scale(latest or [dict(r) for r in seen["regions"]]),
            "summary": bar_scale([dict(r) for r in seen["regions"]]),
            "series": {"time": seen["series"]["time"], "regions": seen["series"]["regions"],
                       "resolution_s": seen["resolution_s"]},
        }


class PoolTrafficView(PoolPanelMixin, PrincipalView):
    def get(self, request, pk: int):
        pool = self.get_scoped(Pool, pk=pk)
        context = self._panel_context(pool)
        context["form_regions"] = self._form_regions(pool, context["seen"])
        return render(request, "traffic/pool.html", context)

    @staticmethod
    def _form_regions(pool: Pool, seen: dict[str, Any]) -> list[dict[str, Any]]:
        demand = {r["region"]: r["demand"] for r in seen["regions"]}
        steering = seen["pool"]["steering"]
        return [
            {"region": c.region, "healthy_members": c.healthy_members,
             "max_rate_per_member": "" if c.max_rate_per_member is None else c.max_rate_per_member,
             "capacity_scaler": c.capacity_scaler, "demand": demand.get(c.region, 0.0),
             "dial": steering["dials"].get(c.region, 1.0), "failed_over": c.region in steering["failed_over"]}
            for c in selectors.pool_capacities(pool)
        ]


class PoolPanelView(PoolPanelMixin, PrincipalView):
    """The live part of the page: htmx polls it every few seconds."""

    def get(self, request, pk: int):
        pool = self.get_scoped(Pool, pk=pk)
        return render(request, "traffic/panel.html", self._panel_context(pool))


def _parse_number(text: str, field: str, *, integer: bool = False) -> float | int | None:
    text = text.strip()
    if text == "":
        return None
    try:
        return int(text) if integer else float(text)
    except ValueError:
        raise DomainError("invalid_number", f"{field}: '{text}' is not a number.", field=field) from None


class PoolWhatIfView(PrincipalView):
    """htmx form: the plan for the numbers typed in, beside today's; nothing is changed."""

    def post(self, request, pk: int):
        pool = self.get_scoped(Pool, pk=pk)
        regions = [c.region for c in selectors.pool_capacities(pool)]
        try:
            capacities, demand = [], {}
            for region in regions:
                entry: dict[str, Any] = {"region": region}
                for key, integer in (("healthy_members", True), ("max_rate_per_member", False),
                                     ("capacity_scaler", False)):
                    raw = request.POST.get(f"{key}_{region}", "")
                    value = _parse_number(raw, f"{key}_{region}", integer=integer)
                    if value is not None:
                        entry[key] = value
                    elif key == "max_rate_per_member" and raw.strip() == "" and f"{key}_{region}" in request.POST:
                        entry[key] = None  # an empty max rate means unlimited, as in the model
                capacities.append(entry)
                rate = _parse_number(request.POST.get(f"demand_{region}", ""), f"demand_{region}")
                if rate is not None:
                    demand[region] = rate
            dials = {}
            for region in regions:
                dial = _parse_number(request.POST.get(f"dial_{region}", ""), f"dial_{region}")
                if dial is not None and dial != 1.0:
                    dials[region] = dial
            data: dict[str, Any] = {"pool": pool.pk, "capacities": capacities, "demand": demand, "steering": {
                "dials": dials, "failed_over": [r for r in regions if request.POST.get(f"failed_over_{r}")]}}
            if request.POST.get("policy"):
                data["policy"] = request.POST["policy"]
            result = services.what_if(principal=self.principal, data=data)
        except DomainError as exc:
            return render(request, "traffic/whatif_result.html", {"error": exc})
        baseline = {r["region"]: r for r in (result["baseline"] or {}).get("regions", [])}
        enforced = {r["region"]: r for r in (result["enforced"] or {}).get("regions", [])}
        rows = []
        for row in result["plan"]["regions"]:
            rows.append({**row, "baseline": baseline.get(row["region"]), "enforced": enforced.get(row["region"])})
        return render(request, "traffic/whatif_result.html",
                      {"result": result, "bars": bar_scale(rows), "pool": pool})
