"""Capacity UI: define a test, start it, watch it (htmx polling), read the chart, apply, compare runs.

Thin: reads through visible_to / selectors, writes through the same services as the API.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import escape
from django_htmx.http import HttpResponseClientRedirect, HttpResponseClientRefresh

from apps.accounts.selectors import actor_name
from apps.balancers.models import Pool, Region
from apps.capacity import selectors, services
from apps.capacity.api.serializers import CapacityTestSerializer
from apps.capacity.models import CapacityRun, CapacityTest, Drill
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView, errors_of
from apps.fleets.selectors import unserved_static_ips

FORM_FIELDS = ("name", "listener", "hostname", "path", "mode", "steps", "step_duration_s", "slo_p99_ms",
               "slo_error_rate", "shards", "safety_factor", "pool", "region", "timeout_s", "max_connections")


def parse_steps(text: str) -> list[Any]:
    """'50, 100, 200' or '50:5, 100:5': values, optionally with their own duration in seconds."""
    steps: list[Any] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        value, _, duration = part.partition(":")
        try:
            steps.append([float(value), float(duration)] if duration else float(value))
        except ValueError:
            steps.append(part)  # the service answers with invalid_steps and the step's number
    return steps


class CapacityIndexView(PrincipalView):
    """Tests, recent runs (pick two to compare) and the form to define a test."""

    def _context(self, **extra: Any) -> dict[str, Any]:
        tests = self.scoped(CapacityTest).select_related("org", "listener__lb", "pool").order_by("name")
        runs = self.scoped(CapacityRun).select_related("test").order_by("-created_at", "-id")[:30]
        listeners = list(selectors.targetable_listeners(self.principal))
        unserved = unserved_static_ips(listeners)
        for listener in listeners:  # said in the target's label: a test against it would measure nothing
            listener.vip_unserved = listener.pk in unserved
        return {"tests": tests, "runs": runs, "listeners": listeners,
                "pools": self.scoped(Pool).select_related("lb"), "regions": Region.objects.all(),
                "can_write": self.principal.can_write, "values": {"steps": "50, 100, 200", "step_duration_s": 5,
                                                                  "slo_p99_ms": 200, "slo_error_rate": 0.01,
                                                                  "shards": 1, "safety_factor": 0.8, "path": "/",
                                                                  "timeout_s": 5}, **extra}

    def get(self, request):
        return render(request, "capacity/index.html", self._context())

    def post(self, request):
        if not self.principal.can_write:
            return HttpResponse("Your role cannot define capacity tests.", status=403)
        data: dict[str, Any] = {k: request.POST.get(k) for k in FORM_FIELDS if request.POST.get(k) not in (None, "")}
        data["steps"] = parse_steps(request.POST.get("steps", ""))
        serializer = CapacityTestSerializer(data=data, context={"request": request})
        errors: dict[str, list[str]]
        if serializer.is_valid():
            try:
                test = services.capacity_test_save(principal=self.principal, test=CapacityTest(),
                                                   data=dict(serializer.validated_data))
                return HttpResponseClientRedirect(reverse("capacity-test", args=[test.pk]))
            except DomainError as exc:
                errors = errors_of(exc)
        else:
            errors = errors_of(serializer.errors)
        context = self._context(errors=errors, values=request.POST)
        return TemplateResponse(request, "capacity/test_form.html", context, status=422)


class CapacityTestDetailView(PrincipalView):
    def get(self, request, pk: int):
        test = self.get_scoped(CapacityTest, pk=pk)
        runs = test.runs.order_by("-created_at", "-id")[:50]
        return render(request, "capacity/test_detail.html", {"test": test, "runs": runs,
                                                             "can_write": self.principal.can_write})


class CapacityTestStartView(PrincipalView):
    def post(self, request, pk: int):
        test = self.get_scoped(CapacityTest, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot start capacity tests.", status=403)
        try:
            run = services.capacity_run_start(principal=self.principal, test=test)
        except DomainError as exc:
            return HttpResponse(f'<p class="error" role="alert">{escape(exc.detail)} <code>{exc.code}</code></p>',
                                status=422)
        return HttpResponseClientRedirect(reverse("capacity-run", args=[run.pk]))


class CapacityRunDetailView(PrincipalView):
    def get(self, request, pk: int):
        run = get_object_or_404(self.scoped(CapacityRun).select_related(
            "test__org", "pool_region__pool", "pool_region__region"), pk=pk)
        steps = selectors.run_steps(run).order_by("index")
        return render(request, "capacity/run_detail.html", {
            "run": run, "test": run.test, "steps": steps, "shards": run.shard_rows.all(),
            "progress": selectors.run_progress(run), "can_write": self.principal.can_write})


class CapacityRunProgressView(PrincipalView):
    """The progress partial htmx polls every second while the run is active.

    The poller asks with ?active=1; once the run has finished it gets a refresh instead, so the
    page reloads once and shows the results and the chart.
    """

    def get(self, request, pk: int):
        run = self.get_scoped(CapacityRun, pk=pk)
        if request.GET.get("active") == "1" and not run.is_active and run.shards_done >= run.shards_total:
            return HttpResponseClientRefresh()
        return render(request, "capacity/progress.html", {"run": run, "progress": selectors.run_progress(run),
                                                          "can_write": self.principal.can_write})


class CapacityRunCancelView(PrincipalView):
    def post(self, request, pk: int):
        run = self.get_scoped(CapacityRun, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot cancel runs.", status=403)
        with contextlib.suppress(DomainError):  # finished meanwhile: the partial shows how
            services.capacity_run_cancel(principal=self.principal, run=run)
        run.refresh_from_db()
        return render(request, "capacity/progress.html", {"run": run, "progress": selectors.run_progress(run),
                                                          "can_write": True})


class CapacityRunApplyView(PrincipalView):
    """GET: what applying changes (before/after and the what-if), to confirm. POST: apply it."""

    def get(self, request, pk: int):
        run = self.get_scoped(CapacityRun, pk=pk)
        return render(request, "capacity/recommendation.html", {
            "run": run, "can_write": self.principal.can_write, "preview": selectors.apply_preview(run)})

    def post(self, request, pk: int):
        run = self.get_scoped(CapacityRun, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot change pool capacity.", status=403)
        error = None
        try:
            services.capacity_apply_recommendation(principal=self.principal, run=run)
        except DomainError as exc:
            error = exc.detail
        run.refresh_from_db()
        return render(request, "capacity/recommendation.html", {"run": run, "error": error, "can_write": True})


class CapacityRunChartView(PrincipalView):
    """Chart data as JSON (the page's script fetches it; CSP forbids inline data scripts)."""

    def get(self, request, pk: int):
        run = get_object_or_404(self.scoped(CapacityRun).select_related("test"), pk=pk)
        return JsonResponse(selectors.run_chart(run))


class CapacityCompareView(PrincipalView):
    """Two runs side by side: one chart with both latency curves, and their steps in one table."""

    def get(self, request):
        ids = [request.GET.get("a"), request.GET.get("b"), *request.GET.getlist("run")]
        ids = [int(i) for i in ids if i and i.isdigit()][:2]
        runs = list(self.scoped(CapacityRun).select_related("test").filter(pk__in=ids))
        runs.sort(key=lambda r: ids.index(r.pk))
        if len(runs) != 2:
            return render(request, "capacity/compare.html", {"runs": runs, "rows": [],
                                                             "error": "Pick two runs you can see to compare."},
                          status=404 if len(ids) == 2 else 400)
        left = list(selectors.run_steps(runs[0]).order_by("index"))
        right = list(selectors.run_steps(runs[1]).order_by("index"))
        rows = [(i, left[i] if i < len(left) else None, right[i] if i < len(right) else None)
                for i in range(max(len(left), len(right)))]
        return render(request, "capacity/compare.html", {"runs": runs, "rows": rows})


# --- failover drills -----------------------------------------------------------------------------


def _drill_number(request, name: str, label: str, *, default: float | None = None) -> float | None:
    text = (request.POST.get(name) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise DomainError("invalid_drill", f"{label} must be a number.", field=name) from None
    if not math.isfinite(value):
        raise DomainError("invalid_drill", f"{label} must be a number.", field=name)
    return value


class PoolDrillsView(PrincipalView):
    """The pool page's drill card (loaded by htmx from the overflow page): run one now, and the recent ones."""

    def _context(self, pool: Pool, **extra: Any) -> dict[str, Any]:
        return {"pool": pool, "regions": [pr.region.slug for pr in pool.regions.select_related("region")],
                "tests": self.scoped(CapacityTest).filter(org_id=pool.org_id).order_by("name"),
                "drills": pool.drills.select_related("region").order_by("-created_at", "-id")[:10],
                "can_write": self.principal.can_write,
                "values": {"share_pct": 100, "duration_s": 60, "slo_error_rate_pct": 1}, **extra}

    def get(self, request, pk: int):
        pool = self.get_scoped(Pool, pk=pk)
        return render(request, "capacity/pool_drills.html", self._context(pool))

    def post(self, request, pk: int):
        pool = self.get_scoped(Pool, pk=pk)
        try:
            test_id = request.POST.get("test") or ""
            test = None
            if test_id:
                test = self.scoped(CapacityTest).filter(pk=int(test_id) if test_id.isdigit() else 0).first()
                if test is None:
                    raise DomainError("not_found", "Capacity test not found.", field="test")
            share_pct = _drill_number(request, "share_pct", "Share drained", default=100.0)
            error_pct = _drill_number(request, "slo_error_rate_pct", "SLO error rate", default=1.0)
            drill = services.drill_start(
                principal=self.principal, pool=pool, region=(request.POST.get("region") or "")[:63],
                share=share_pct / 100.0, duration_s=_drill_number(request, "duration_s", "Duration", default=60.0),
                test=test, slo_p99_ms=_drill_number(request, "slo_p99_ms", "SLO p99"),
                slo_error_rate=error_pct / 100.0)
        except DomainError as exc:
            return TemplateResponse(request, "capacity/pool_drills.html",
                                    self._context(pool, error=exc, values=request.POST), status=422)
        return HttpResponseClientRedirect(reverse("drill", args=[drill.pk]))


class DrillDetailView(PrincipalView):
    """The drill's report: what moved where, how fast, what broke, with the charts (live while it runs)."""

    def get(self, request, pk: int):
        drill = get_object_or_404(self.scoped(Drill).select_related("pool__lb", "region", "test", "capacity_run"),
                                  pk=pk)
        took = drill.finished_at - drill.started_at if drill.finished_at and drill.started_at else None
        return render(request, "capacity/drill_detail.html", {
            "drill": drill, "rows": selectors.drill_rows(drill), "can_write": self.principal.can_write,
            "requested_by": actor_name(drill.requested_by),
            "took_s": took.total_seconds() if took is not None else None,
            "slo_error_pct": 100 * drill.slo_error_rate,
            "max_error_pct": 100 * float((drill.summary or {}).get("max_error_rate") or 0.0)})


class DrillProgressView(PrincipalView):
    """Polled every second while the drill runs; once it has finished, the page reloads once to the report."""

    def get(self, request, pk: int):
        drill = get_object_or_404(self.scoped(Drill).select_related("region"), pk=pk)
        if request.GET.get("active") == "1" and not drill.is_active and drill.finished_at is not None:
            return HttpResponseClientRefresh()
        return render(request, "capacity/drill_progress.html", {"drill": drill, "can_write": self.principal.can_write})


class DrillCancelView(PrincipalView):
    def post(self, request, pk: int):
        drill = get_object_or_404(self.scoped(Drill).select_related("region"), pk=pk)
        try:
            services.drill_cancel(principal=self.principal, drill=drill)
        except DomainError as exc:
            if exc.status == 403:
                return HttpResponse(escape(exc.detail), status=403)
        drill.refresh_from_db()
        return render(request, "capacity/drill_progress.html", {"drill": drill, "can_write": self.principal.can_write})


class DrillChartView(PrincipalView):
    def get(self, request, pk: int):
        drill = get_object_or_404(self.scoped(Drill).select_related("region"), pk=pk)
        return JsonResponse(selectors.drill_chart(drill))
