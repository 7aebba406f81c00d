"""Certificates page: every certificate of the org (uploaded or managed), expiry by colour, where used,
the last renewal attempt and its error in plain words, "renew now", and the CA's rate-limit budget."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render

from apps.acme import selectors, services
from apps.acme.models import ManagedCertificate
from apps.core.ui import PrincipalView
from apps.fleets.models import Certificate


class CertificateListView(PrincipalView):
    def get(self, request):
        certs = self.scoped(Certificate).select_related("org").order_by("name")
        managed = list(self.scoped(ManagedCertificate).select_related("certificate"))
        return render(request, "acme/list.html", {
            "rows": selectors.certificate_rows(certs, managed),
            "budget": services.budget(org=self.principal.org),
            "can_write": self.principal.can_write,
        })


class CertificateRenewView(PrincipalView):
    def post(self, request, pk: int):
        managed = self.get_changeable(ManagedCertificate, pk=pk)  # 404 for another org's
        if not self.principal.can_write:
            raise PermissionDenied("Viewers cannot renew certificates.")
        services.managed_certificate_renew_now(principal=self.principal, managed=managed)
        return redirect("certificates")
