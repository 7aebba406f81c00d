"""Cloud UI: targets and runs, one run's plan diff and output, approval, synthesized JSON download."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import redirect, render

from apps.cloud import services
from apps.cloud.api.views import synth_download
from apps.cloud.models import CloudApply, CloudTarget
from apps.core.errors import DomainError
from frontend.base import PrincipalView


class CloudListView(PrincipalView):
    def get(self, request):
        targets = list(self.scoped(CloudTarget).order_by("name"))
        rows = [(t, services.apply_unavailable_reason(t)) for t in targets]
        applies = self.scoped(CloudApply).select_related("target", "lb")[:50]
        return render(request, "cloud/list.html", {"targets": rows, "applies": applies})


class CloudApplyView(PrincipalView):
    def get(self, request, pk: int, refused: str = ""):
        apply = self.get_scoped(CloudApply, pk=pk)
        return render(request, "cloud/apply.html", {
            "apply": apply,
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


class CloudSynthView(PrincipalView):
    def get(self, request, pk: int) -> HttpResponse:
        apply = self.get_scoped(CloudApply, pk=pk)
        if apply.synth_json is None:
            return HttpResponse("Nothing synthesized yet for this run.", status=409, content_type="text/plain")
        return synth_download(apply)
