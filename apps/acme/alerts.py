"""Certificate expiry alerts: every certificate, uploaded or managed, close to its end without a renewal."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from apps.acme.models import ManagedCertificate
from apps.events.models import Event
from apps.events.services import event_emit
from apps.fleets.models import Certificate

EXPIRING_DAYS = 14


def expiring_alerts(now: dt.datetime | None = None) -> list[int]:
    """A `certificate.expiring` event, at most once a day each, for every certificate (uploaded or managed)
    with fewer than 14 days left: a managed one that renewed would have a later expiry, so still being
    here means no successful renewal. Returns the ids alerted."""
    now = now or timezone.now()
    alerted = []
    for cert in Certificate.objects.filter(not_after__lt=now + dt.timedelta(days=EXPIRING_DAYS)).select_related("org"):
        recent = Event.objects.filter(type="certificate.expiring", object_type="certificate",
                                      object_id=str(cert.pk), at__gte=now - dt.timedelta(days=1))
        if recent.exists():
            continue
        days = max(0, int((cert.not_after - now).total_seconds() // 86400))
        managed = ManagedCertificate.objects.filter(certificate=cert).first()
        event_emit("certificate.expiring", org=cert.org, obj=cert,
                   data={"days": days, "not_after": cert.not_after.isoformat(),
                         "last_error": managed.last_error if managed else "uploaded: renew by hand"})
        alerted.append(cert.pk)
    return alerted
