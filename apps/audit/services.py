"""Write an audit event in the same transaction as the change it records, and the plain audited
create/update/delete every app uses for objects without cross-row rules."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.forms.models import model_to_dict

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict, save_or_conflict
from apps.core.middleware import current_request_id


class AuditAction(StrEnum):
    """The generic verbs of an audited write; an event's action is `<model name>.<verb>`. Domain verbs
    (`static_ip.allocate`, `job.pause`) stay the services' own."""

    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


def audit_snapshot(obj: Any) -> dict[str, Any]:
    """What the audit log keeps of `obj`, as its model declares it:

    - `audit_fields`: the fields kept (a foreign key as its id); default every editable field;
    - `audit_exclude`: with the default, fields never kept (credential references);
    - `audit_extra()`: values derived for the log (whether a secret is set, related rows by name),
      never the secret itself.
    """
    model = type(obj)
    fields = getattr(model, "audit_fields", None)
    if fields is None:
        data = model_to_dict(obj, exclude=getattr(model, "audit_exclude", ()))
    else:
        data = {name: getattr(obj, model._meta.get_field(name).attname) for name in fields}
    extra = getattr(obj, "audit_extra", None)
    if extra is not None:
        data.update(extra())
    return data


def _plain(value: Any) -> Any:
    if value is None:
        return None
    # Round-trip through JSON so dates, Decimals and UUIDs are stored as text.
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def audit_record(*, principal, org, action: str, obj, before: dict | None = None,
                 after: dict | None = None) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=principal.actor if principal is not None else "system",
        actor_label=(principal.label if principal is not None else "system")[:200],
        org=org,
        action=action,
        object_type=obj._meta.model_name if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        before=_plain(before),
        after=_plain(after),
        request_id=current_request_id(),
    )


def org_of(obj) -> Any:
    """The organization an object belongs to: its own, its LB's or its pool's (None for shared ones)."""
    for path in ("org", "lb.org", "pool.org"):
        target = obj
        try:
            for part in path.split("."):
                target = getattr(target, part)
        except AttributeError:
            continue
        if target is not None:
            return target
    return None


def audited_save(*, principal, obj, action: AuditAction | str | None = None, data: dict[str, Any] | None = None,
                 after_save=None):
    """Create or update one object: set fields, save, audit (`audit_snapshot` before and after), then
    `after_save(obj)`, in one transaction. The action defaults to create or update.

    A unique constraint the save hits answers 409 `conflict` rather than a 500.
    """
    if action is None:
        action = AuditAction.UPDATE if obj.pk else AuditAction.CREATE
    with transaction.atomic():
        before = audit_snapshot(obj) if obj.pk else None
        for field, value in (data or {}).items():
            setattr(obj, field, value)
        save_or_conflict(obj, Conflict("conflict", f"This {obj._meta.verbose_name} conflicts with an existing one "
                                                   f"(a unique name, port or address is already taken)."))
        audit_record(principal=principal, org=org_of(obj), action=f"{obj._meta.model_name}.{action}",
                     obj=obj, before=before, after=audit_snapshot(obj))
        if after_save is not None:
            after_save(obj)
    return obj


def audited_delete(*, principal, obj, after_delete=None) -> None:
    """Delete one object with its audit event; still referenced answers 409 `in_use`."""
    with transaction.atomic():
        audit_record(principal=principal, org=org_of(obj), action=f"{obj._meta.model_name}.{AuditAction.DELETE}",
                     obj=obj, before=audit_snapshot(obj))
        try:
            with transaction.atomic():
                obj.delete()
        except IntegrityError as exc:
            raise Conflict("in_use", f"This {obj._meta.verbose_name} is still in use.") from exc
        if after_delete is not None:
            after_delete()
