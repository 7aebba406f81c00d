"""Reads for the certificates page and API: one row per certificate with what an operator needs to act."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from apps.acme import deploy
from apps.acme.models import ManagedCertificate
from apps.fleets.models import Certificate

WARN_DAYS = 30
ALERT_DAYS = 14  # < 14 days and no successful renewal: an event (issue 18)


def expiry_class(days_left: float | None) -> str:
    """Colour by days left: bad under 14 days (or expired), warn under 30, ok otherwise."""
    if days_left is None:
        return "warn"
    if days_left < ALERT_DAYS:
        return "bad"
    return "warn" if days_left < WARN_DAYS else "ok"


@dataclass(frozen=True)
class CertificateRow:
    cert: Certificate | None
    managed: ManagedCertificate | None
    name: str
    sans: list[str]
    issuer: str
    not_after: dt.datetime | None
    days_left: int | None
    expiry: str
    where_used: list[str]


def certificate_rows(certs: Any, managed: Any, now: dt.datetime | None = None) -> list[CertificateRow]:
    """Uploaded and managed certificates in one list (a managed one without a certificate yet included)."""
    now = now or timezone.now()
    by_cert = {m.certificate_id: m for m in managed if m.certificate_id}
    rows = []
    for cert in certs:
        days = None if cert.not_after is None else int((cert.not_after - now).total_seconds() // 86400)
        rows.append(CertificateRow(cert, by_cert.get(cert.pk), cert.name, list(cert.dns_names), cert.issuer,
                                   cert.not_after, days, expiry_class(days), deploy.where_used(cert)))
    for m in managed:
        if not m.certificate_id:
            rows.append(CertificateRow(None, m, m.name, list(m.hostnames), "", None, None, "warn", []))
    return sorted(rows, key=lambda r: r.name)
