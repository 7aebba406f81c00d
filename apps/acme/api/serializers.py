from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from apps.accounts.models import Organization
from apps.acme import deploy
from apps.acme.models import ManagedCertificate
from apps.core.api.fields import (
    HostnameField,
    ScopedRelatedField,
    ScopedSlugRelatedField,
    SlugNameField,
    TenantModelSerializer,
)
from apps.fleets.models import Certificate


class ManagedCertificateSerializer(TenantModelSerializer):
    name = SlugNameField()
    org = ScopedSlugRelatedField(Organization, required=False)
    hostnames = serializers.ListField(child=HostnameField(), min_length=1, max_length=100)
    challenge = serializers.ChoiceField(choices=ManagedCertificate.Challenge.choices, required=False)
    # On create only: an uploaded certificate to take over (renewed in place, listeners keep using it).
    certificate = ScopedRelatedField(Certificate, required=False, allow_null=True)
    issuer = serializers.SerializerMethodField()
    not_after = serializers.SerializerMethodField()
    days_left = serializers.SerializerMethodField()
    where_used = serializers.SerializerMethodField()

    class Meta:
        model = ManagedCertificate
        fields = ["id", "org", "name", "hostnames", "challenge", "status", "certificate", "issuer", "not_after",
                  "days_left", "where_used", "last_attempt_at", "last_success_at", "last_error", "last_error_code",
                  "failures", "next_attempt_at", "created_at", "updated_at"]
        read_only_fields = ["status", "last_attempt_at", "last_success_at", "last_error",
                            "last_error_code", "failures", "next_attempt_at", "created_at", "updated_at"]
        validators: list = []  # (org, name) uniqueness is the service's answer (409 name_taken)
        create_only_fields = ("certificate",)

    def get_issuer(self, obj: ManagedCertificate) -> str:
        return obj.certificate.issuer if obj.certificate else ""

    def get_not_after(self, obj: ManagedCertificate) -> Any:
        return obj.certificate.not_after if obj.certificate else None

    def get_days_left(self, obj: ManagedCertificate) -> int | None:
        if not obj.certificate or not obj.certificate.not_after:
            return None
        return int((obj.certificate.not_after - timezone.now()).total_seconds() // 86400)

    def get_where_used(self, obj: ManagedCertificate) -> list[str]:
        return deploy.where_used(obj.certificate) if obj.certificate else []
