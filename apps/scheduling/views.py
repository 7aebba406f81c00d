"""Jobs UI: list with next run and last status, create/edit with a live schedule preview, history, actions.

Thin: reads through visible_to, validates with the API serializer, writes through the services.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.template.response import TemplateResponse
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from apps.core.errors import DomainError
from apps.core.ui import PrincipalView, errors_of
from apps.scheduling import registry, selectors, services
from apps.scheduling.api.serializers import JobSerializer, SchedulePreviewSerializer, schedule_preview
from apps.scheduling.models import Job, JobRun
from apps.scheduling.params import options

FORM_FIELDS = ("name", "kind", "schedule_type", "cron", "timezone", "interval_s", "start_at", "run_at", "end_at",
               "misfire_policy", "misfire_grace_s", "concurrency_policy", "max_retries", "retry_backoff_s",
               "timeout_s", "webhook_url")
PREVIEW_FIELDS = ("schedule_type", "cron", "timezone", "interval_s", "start_at", "run_at", "end_at")
COMMON_ZONES = ("UTC", "Europe/Berlin", "Europe/London", "Europe/Paris", "America/New_York", "America/Chicago",
                "America/Los_Angeles", "America/Sao_Paulo", "Asia/Tokyo", "Asia/Singapore", "Asia/Kolkata",
                "Australia/Sydney")
HISTORY_LIMIT = 50


def _job_values(job: Job) -> dict[str, Any]:
    values = {f: getattr(job, f) for f in FORM_FIELDS}
    for field in ("start_at", "run_at", "end_at"):
        values[field] = values[field].strftime("%Y-%m-%dT%H:%M:%S") if values[field] else ""
    values["params"] = dict(job.params or {})
    values["interval_s"] = job.interval_s or ""
    return values


@dataclass
class _KindForm:
    """A job kind as the form draws it: its parameters with pickers and the values to show."""

    name: str
    label: str
    help: str
    form_params: list[dict[str, Any]]


def _params_from_post(post, kind_name: str) -> dict[str, Any]:
    """The chosen kind's parameter fields (`p.<kind>.<name>`) as typed params; blank optional ones left out."""
    kind = registry.REGISTRY.get(kind_name)
    params: dict[str, Any] = {}
    for param in kind.params if kind else ():
        raw = post.get(f"p.{kind_name}.{param.name}")
        if param.kind == "bool":
            params[param.name] = raw == "on"
            continue
        if raw is None or raw.strip() == "":
            continue
        raw = raw.strip()
        if param.kind in ("int", "ref"):
            params[param.name] = int(raw) if raw.lstrip("-").isdigit() else raw  # a name stays a name
        elif param.kind == "number":
            try:
                params[param.name] = float(raw)
            except ValueError:
                params[param.name] = raw  # the kind's validation names it
        else:
            params[param.name] = raw
    return params


class _JobsView(PrincipalView):
    def kind_forms(self, values: dict[str, Any]) -> list[_KindForm]:
        forms = []
        chosen = values.get("kind")
        current = values.get("params") if isinstance(values.get("params"), dict) else {}
        for kind in sorted(registry.REGISTRY.values(), key=lambda k: k.name):
            if kind.operator_only and not self.principal.is_operator:
                continue
            fields = []
            for param in kind.params:
                value = current.get(param.name, param.default) if kind.name == chosen else param.default
                fields.append({"name": param.name, "label": param.label, "kind": param.kind,
                               "choices": param.choices, "value": value,
                               "options": options(param, self.principal) if param.kind == "ref" else []})
            forms.append(_KindForm(kind.name, kind.label, kind.help, fields))
        return forms

    def form_context(self, **extra: Any) -> dict[str, Any]:
        return {"kinds": self.kind_forms(extra.get("values", {})), "zones": COMMON_ZONES,
                "schedule_types": Job.ScheduleType.choices, "misfire_policies": Job.MisfirePolicy.choices,
                "concurrency_policies": Job.ConcurrencyPolicy.choices, "can_write": self.principal.can_write,
                **extra}

    def refuse(self, what: str) -> HttpResponse:
        return HttpResponse(f"Your role cannot {what}.", status=403)


class JobListView(_JobsView):
    def get(self, request):
        q = request.GET.get("q", "").strip()
        jobs = selectors.job_list(principal=self.principal, q=q)
        template = self.template_for("scheduling/list.html", "scheduling/_table.html")
        return render(request, template, {"jobs": jobs, "q": q, "can_write": self.principal.can_write})


class JobFormView(_JobsView):
    """GET: the form (new or edit). POST: validate like the API, save through the service."""

    def get(self, request, pk: int | None = None):
        job = self.get_scoped(Job, pk=pk) if pk else None
        values = _job_values(job) if job else {"schedule_type": "cron", "cron": "0 2 * * *", "timezone": "UTC",
                                                 "kind": "noop", "params": {}, "misfire_policy": "run_once",
                                                 "misfire_grace_s": 60, "concurrency_policy": "forbid",
                                                 "max_retries": 0, "retry_backoff_s": 30, "timeout_s": 600}
        preview = schedule_preview_for(values)
        return render(request, "scheduling/form.html", self.form_context(job=job, values=values, preview=preview))

    def post(self, request, pk: int | None = None):
        job = self.get_scoped(Job, pk=pk) if pk else None
        if not self.principal.can_write:
            return self.refuse("change jobs")
        data: dict[str, Any] = {f: request.POST.get(f) for f in FORM_FIELDS if request.POST.get(f) is not None}
        for field in ("interval_s", "start_at", "run_at", "end_at"):
            if data.get(field) == "":
                data[field] = None
        errors: dict[str, list[str]] = {}
        data["params"] = _params_from_post(request.POST, request.POST.get("kind", ""))
        if request.POST.get("webhook_secret"):
            data["webhook_secret"] = request.POST["webhook_secret"]
        if job is None:
            data["enabled"] = request.POST.get("enabled") == "on"
        serializer = JobSerializer(instance=job, data=data, partial=job is not None, context={"request": request})
        if not errors and serializer.is_valid():
            validated = dict(serializer.validated_data)
            secret = validated.pop("webhook_secret", None)
            try:
                saved = services.job_save(principal=self.principal, job=job or Job(), data=validated,
                                          webhook_secret=secret)
                return HttpResponseClientRedirect(reverse("job", args=[saved.pk]))
            except DomainError as exc:
                errors = errors_of(exc)
        elif not errors:
            errors = errors_of(serializer.errors)
        values = {**{f: request.POST.get(f, "") for f in FORM_FIELDS}, "params": data["params"]}
        context = self.form_context(job=job, values=values, errors=errors, preview=schedule_preview_for(values))
        return TemplateResponse(request, "scheduling/_form.html", context, status=422)


def schedule_preview_for(values: dict[str, Any]) -> dict[str, Any]:
    serializer = SchedulePreviewSerializer(data={k: v for k, v in values.items()
                                                 if k in PREVIEW_FIELDS and v not in (None, "")})
    if not serializer.is_valid():
        first = next(iter(serializer.errors.items()))
        return {"code": "invalid", "detail": f"{first[0]}: {first[1][0]}"}
    result = schedule_preview(serializer.validated_data)
    result.setdefault("timezone", serializer.validated_data.get("timezone") or "UTC")
    if "next_fire_times" in result:
        result["times"] = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in result["next_fire_times"]]
    return result


class SchedulePreviewView(_JobsView):
    """The htmx partial under the schedule fields: description and next five times, as you type."""

    def get(self, request):
        values = {k: request.GET.get(k, "") for k in PREVIEW_FIELDS}
        return render(request, "scheduling/_preview.html", {"preview": schedule_preview_for(values)})


class JobDetailView(_JobsView):
    def get(self, request, pk: int):
        job = self.get_scoped(Job, pk=pk)
        runs = selectors.job_history(job=job, limit=HISTORY_LIMIT)
        return render(request, "scheduling/detail.html", {
            "job": job, "description": job.description(), "times": selectors.job_upcoming(job=job), "runs": runs,
            "params": _params_shown(job), "can_write": self.principal.can_write})


class JobHistoryView(_JobsView):
    """The run history partial; the detail page polls it."""

    def get(self, request, pk: int):
        job = self.get_scoped(Job, pk=pk)
        runs = selectors.job_history(job=job, limit=HISTORY_LIMIT)
        return render(request, "scheduling/_history.html", {"job": job, "runs": runs,
                                                            "can_write": self.principal.can_write})


class JobActionView(_JobsView):
    """POST run / pause / resume / delete. From the list a row comes back; from the detail page, a redirect."""

    action = ""

    def post(self, request, pk: int):
        job = self.get_scoped(Job, pk=pk)
        if not self.principal.can_write:
            return self.refuse(f"{self.action} jobs")
        try:
            if self.action == "run":
                services.job_run_now(principal=self.principal, job=job)
            elif self.action == "pause":
                job = services.job_pause(principal=self.principal, job=job)
            elif self.action == "resume":
                job = services.job_resume(principal=self.principal, job=job)
            elif self.action == "delete":
                services.job_delete(principal=self.principal, job=job)
                return HttpResponseClientRedirect(reverse("jobs"))
        except DomainError as exc:
            return HttpResponse(f"{exc.detail}", status=exc.status)
        if request.POST.get("from") == "list":
            job.refresh_from_db()
            return render(request, "scheduling/_row.html", {"job": job, "can_write": True})
        return HttpResponseClientRedirect(reverse("job", args=[job.pk]))


class RunCancelView(_JobsView):
    def post(self, request, pk: int):
        run = self.get_scoped(JobRun, pk=pk)
        if not self.principal.can_write:
            return self.refuse("cancel runs")
        with contextlib.suppress(DomainError):  # finished meanwhile: the refreshed history shows how
            services.run_cancel(principal=self.principal, run=run)
        return HttpResponseClientRedirect(reverse("job", args=[run.job_id]))


def _params_shown(job: Job) -> list[tuple[str, Any]]:
    """The job's parameters as the form names them, references by name (never an id)."""
    kind = registry.REGISTRY.get(job.kind)
    named = registry.params_for_export(job.kind, job.params or {})
    labels = {p.name: p.label for p in (kind.params if kind else ())}
    return [(labels.get(key, key), _shown(value)) for key, value in named.items()]


def _shown(value: Any) -> Any:
    """A value as a person reads it: yes/no, not Python's True/False; lists joined."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(str(_shown(v)) for v in value) or "none"
    return value
