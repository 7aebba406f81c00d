"""Cloud UI: targets and runs, one run's plan diff and output, approval, synthesized JSON download."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import redirect, render

from apps.audit.models import AuditEvent
from apps.cloud import services
from apps.cloud.api.views import synth_download
from apps.cloud.models import CloudApply, CloudTarget
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView


def _label_people(applies: list[CloudApply]) -> list[CloudApply]:
    """Who started/approved each run as people talk ("alice (acme)", "token ci-deploy (acme)"): the run
    stores the principal's id ("user:1"), its audit rows the words."""
    words = {(e.object_id, e.action): e.actor_label for e in AuditEvent.objects.filter(
        object_type="cloudapply", object_id__in=[str(a.pk) for a in applies],
        action__in=("cloudapply.create", "cloudapply.approve")).exclude(actor_label="")}
    for apply in applies:
        apply.created_by_label = words.get((str(apply.pk), "cloudapply.create"), apply.created_by)
        apply.approved_by_label = words.get((str(apply.pk), "cloudapply.approve"), apply.approved_by)
    return applies


class CloudListView(PrincipalView):
    def get(self, request):
        targets = list(self.scoped(CloudTarget).order_by("name"))
        rows = [(t, services.apply_unavailable_reason(t)) for t in targets]
        applies = _label_people(list(self.scoped(CloudApply).select_related("target", "lb")[:50]))
        return render(request, "cloud/list.html", {"targets": rows, "applies": applies})


class CloudApplyView(PrincipalView):
    def get(self, request, pk: int, refused: str = ""):
        apply = _label_people([self.get_scoped(CloudApply, pk=pk)])[0]
        return render(request, "cloud/apply.html", {
            "apply": apply,
            "progress": apply_progress(apply),
            "refused": refused,
            "unavailable": services.apply_unavailable_reason(apply.target),
            "can_approve": self.principal.can_deploy and apply.status in services.APPROVABLE,
        }, status=409 if refused else 200)

    def post(self, request, pk: int):
        apply = self.get_scoped(CloudApply, pk=pk)
        try:
            services.approve(principal=self.principal, apply=apply)
        except DomainError as exc:
            return self.get(request, pk, refused=exc.detail)
        return redirect("cloud-apply", pk=apply.pk)


# A run's stages in order; planned (no change) and awaiting_approval end the plan half, applying and
# applied the apply half. A failed run's bar stays in the half it failed in.
_STAGES = ["pending", "synthesized", "planning", "awaiting_approval", "applying", "applied"]
_STAGE_OF = {"planned": "awaiting_approval"}
_ACTIVE = {"pending", "synthesized", "planning", "applying"}
_LABELS = {
    "pending": "queued: synthesizing next", "synthesized": "synthesized: planning next",
    "planning": "terraform plan running", "planned": "plan done: nothing to change",
    "awaiting_approval": "plan done: waiting for a deployer's approval", "applying": "terraform apply running",
    "applied": "applied", "failed": "failed",
}


def apply_progress(apply: CloudApply) -> dict:
    """Where a run stands for the progress bar: step of total, words, and whether it still moves."""
    stage = _STAGE_OF.get(apply.status, apply.status)
    if apply.status == CloudApply.Status.FAILED:
        stage = "applying" if apply.approved_by else "planning"  # the half it failed in
    step = _STAGES.index(stage) + 1 if stage in _STAGES else 1
    if apply.status == CloudApply.Status.PLANNED:
        step = len(_STAGES)  # nothing to apply: the run is complete
    return {"step": step, "total": len(_STAGES), "label": _LABELS.get(apply.status, apply.status),
            "active": apply.status in _ACTIVE}


class CloudApplyStatusView(PrincipalView):
    """htmx: the run's progress, polled while it moves; the page reloads once it stops moving so the
    plan and apply output it produced are shown."""

    def get(self, request, pk: int):
        apply = self.get_scoped(CloudApply, pk=pk)
        progress = apply_progress(apply)
        response = render(request, "cloud/_apply_status.html", {"apply": apply, "progress": progress})
        if request.GET.get("was") and request.GET["was"] != apply.status and not progress["active"]:
            response["HX-Refresh"] = "true"
        return response


class CloudSynthView(PrincipalView):
    def get(self, request, pk: int) -> HttpResponse:
        apply = self.get_scoped(CloudApply, pk=pk)
        if apply.synth_json is None:
            return HttpResponse("Nothing synthesized yet for this run.", status=409, content_type="text/plain")
        return synth_download(apply)
