"""Write an audit event in the same transaction as the change it records."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from apps.audit.models import AuditEvent
from apps.core.middleware import current_request_id


def _plain(value: Any) -> Any:
    if value is None:
        return None
    # Round-trip through JSON so dates, Decimals and UUIDs are stored as text.
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def audit_record(*, principal, org, action: str, obj, before: dict | None = None,
                 after: dict | None = None) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=principal.actor if principal is not None else "system",
        org=org,
        action=action,
        object_type=obj._meta.model_name if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        before=_plain(before),
        after=_plain(after),
        request_id=current_request_id(),
    )
