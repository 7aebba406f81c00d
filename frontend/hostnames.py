"""Hostname claims: a customer lists its own and requests new ones (pending until an operator
approves); operators see every organization's, pending first, and approve or reject them."""

from __future__ import annotations

from typing import Any

from django.db.models import Case, IntegerField, Value, When
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render

from apps.balancers import hostnames
from apps.balancers.api.serializers import HostnameClaimSerializer
from apps.balancers.models import HostnameClaim, Route
from apps.balancers.services import hostname_claim_create, hostname_claim_decide, hostname_claim_warnings
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView, errors_of

STATUS_FILTERS = ("pending", "approved", "rejected")


class HostnamesView(PrincipalView):
    def context(self, *, errors: dict | None = None, values: Any = None, created: HostnameClaim | None = None) -> dict:
        status = self.request.GET.get("status", "")
        claims = self.scoped(HostnameClaim).select_related("org").annotate(
            pending_first=Case(When(status=HostnameClaim.Status.PENDING, then=Value(0)), default=Value(1),
                               output_field=IntegerField())).order_by("pending_first", "hostname")
        if status in STATUS_FILTERS:
            claims = claims.filter(status=status)
        if self.principal.is_operator:  # what to know before approving (never shown to the claiming tenant)
            claims = list(claims)
            for claim in claims:
                claim.review_warnings = hostname_claim_warnings(claim)
        return {
            "claims": claims, "status": status, "statuses": STATUS_FILTERS,
            "pending_count": self.scoped(HostnameClaim).filter(status=HostnameClaim.Status.PENDING).count(),
            "is_operator": self.principal.is_operator, "can_write": self.principal.can_write,
            "errors": errors or {}, "values": values or {}, "created": created,
        }

    def get(self, request):
        return render(request, self.template_for("hostnames/list.html", "hostnames/_panel.html"), self.context())

    def post(self, request):
        if not self.principal.can_write:
            return HttpResponse("Your role cannot request hostnames.", status=403)
        serializer = HostnameClaimSerializer(data={"hostname": request.POST.get("hostname", "")},
                                             context={"request": request})
        if not serializer.is_valid():
            return render(request, "hostnames/_panel.html",
                          self.context(errors=errors_of(serializer.errors), values=request.POST), status=422)
        try:
            claim = hostname_claim_create(principal=self.principal, org=self.principal.org,
                                          hostname=serializer.validated_data["hostname"])
        except DomainError as exc:
            return render(request, "hostnames/_panel.html",
                          self.context(errors=errors_of(exc), values=request.POST), status=422)
        return render(request, "hostnames/_panel.html", self.context(created=claim))


class HostnameDetailView(PrincipalView):
    """One claim and the caller's routes that use it."""

    def get(self, request, pk: int):
        claim = get_object_or_404(self.scoped(HostnameClaim).select_related("org"), pk=pk)
        routes = [r for r in self.scoped(Route).filter(org=claim.org).select_related("lb").order_by("lb__name",
                                                                                                     "priority")
                  if any(hostnames.covers(claim.hostname, h) for h in r.hosts)]
        return render(request, "hostnames/detail.html", {"claim": claim, "routes": routes,
                                                         "is_operator": self.principal.is_operator})


class HostnameDecideView(HostnamesView):
    """Approve or reject (operators only; for anyone else the URL does not exist). Answers with the
    whole panel, so the pending count and the status filter stay right."""

    def get(self, request, pk: int, verb: str):
        raise Http404("Not found.")

    def post(self, request, pk: int, verb: str):
        if not self.principal.is_operator or verb not in ("approve", "reject"):
            raise Http404("Not found.")
        claim = self.get_scoped(HostnameClaim, pk=pk)
        if not self.principal.can_write:
            return HttpResponse("Your role cannot decide hostname claims.", status=403)
        hostname_claim_decide(principal=self.principal, claim=claim, approve=verb == "approve")
        return render(request, "hostnames/_panel.html", self.context())
