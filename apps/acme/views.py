"""Certificates page: every certificate of the org (uploaded or managed), expiry by colour, where used,
the last renewal attempt and its error in plain words, "renew now", and the CA's rate-limit budget."""

from __future__ import annotations

import re

from django.core.exceptions import PermissionDenied
from django.http import QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse

from apps.acme import selectors, services
from apps.acme.api.serializers import ManagedCertificateSerializer
from apps.acme.models import ManagedCertificate
from apps.core.errors import DomainError
from apps.core.service_forms import FormField, ServiceFormView
from apps.core.ui import PrincipalView
from apps.fleets.models import Certificate


class CertificateListView(PrincipalView):
    def get(self, request, error: str = "", status: int = 200):
        certs = self.scoped(Certificate).select_related("org").order_by("name")
        managed = list(self.scoped(ManagedCertificate).select_related("certificate"))
        return render(request, "acme/list.html", {
            "rows": selectors.certificate_rows(certs, managed),
            "budget": services.budget(org=self.principal.org),
            "can_write": self.principal.can_write, "error": error,
        }, status=status)


class CertificateRenewView(CertificateListView):
    def post(self, request, pk: int):
        managed = self.get_changeable(ManagedCertificate, pk=pk)  # 404 for another org's
        if not self.principal.can_write:
            raise PermissionDenied("Viewers cannot renew certificates.")
        try:
            services.managed_certificate_renew_now(principal=self.principal, managed=managed)
        except DomainError as exc:  # a name no longer claimed, or renewals asked for too often
            return self.get(request, error=f"{managed.name}: {exc.detail}", status=exc.status)
        return redirect("certificates")


class ManagedCertificateRequestView(ServiceFormView):
    """Ask for a certificate Spillway obtains from the ACME CA and renews by itself: the API's serializer
    and service (`POST /api/v1/managed-certificates/`), so the same claims rule and errors apply."""

    serializer_class = ManagedCertificateSerializer
    model = ManagedCertificate
    title = "Request a managed certificate"
    submit = "Request"
    intro = ("Spillway orders it from the ACME CA, deploys it to every node serving these names without a "
             "reload, and renews it before it expires. Each name needs an approved hostname claim of your "
             "organization; a wildcard (*.shop.example.com) needs a wildcard claim and dns-01.")
    fields = (
        FormField("name", "Name", placeholder="shop-example-com"),
        FormField("hostnames", "Hostnames", "textarea", placeholder="shop.example.com\nwww.shop.example.com",
                  help="One per line (or separated by commas or spaces); the first is the certificate's subject."),
        FormField("challenge", "Challenge", "select", choices=lambda view: ManagedCertificate.Challenge.choices,
                  help="http-01: the fleet answers the CA on every node. dns-01: a TXT record (needed for wildcards)."),
    )

    def form_data(self, post: QueryDict, obj):
        data = super().form_data(post, obj)
        if "hostnames" in data:  # the API takes a list; a person types lines
            data["hostnames"] = [h for h in re.split(r"[\s,]+", data["hostnames"]) if h]
        return data

    def save(self, obj, data):
        return services.managed_certificate_request(
            principal=self.principal, name=data["name"], hostnames=data["hostnames"],
            challenge=data.get("challenge", ManagedCertificate.Challenge.HTTP01), org=data.get("org"))

    def success_url(self, obj) -> str:
        return reverse("certificates")
