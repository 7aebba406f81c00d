"""Strict writes: a field the serializer does not accept is an error naming it, never silently dropped.

DRF ignores unknown keys and read-only fields in a request body. A typo (`capacity_scalr`) or a field
a client believes it can set (`regions` on a pool update, `created_at`) would then answer 2xx and change
nothing. Mixed into the base serializer, so every write of the API (and of the UI forms that validate
through API serializers) refuses them with 400 and the field's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

UNKNOWN = "Unknown field."
READ_ONLY = "This field is read-only."


class StrictFieldsMixin:
    """Refuse unknown fields, and read-only ones sent with a value other than the one the object has.

    A body read with GET and sent back unchanged (a PUT of the representation) still passes: its read-only
    values equal what the object has. Serializers that accept extra keys on purpose list them in
    `Meta.extra_accepted_fields`.
    """

    def strict_field_errors(self, data: Any) -> dict[str, list[serializers.ErrorDetail]]:
        if not isinstance(data, Mapping):
            return {}
        meta = getattr(self, "Meta", None)
        accepted = set(getattr(meta, "extra_accepted_fields", ()))
        errors: dict[str, list[serializers.ErrorDetail]] = {}
        fields = self.fields  # type: ignore[attr-defined]
        for name in data:
            if name in accepted:
                continue
            field = fields.get(name)
            if field is None:
                errors[name] = [serializers.ErrorDetail(UNKNOWN, code="unknown_field")]
            elif field.read_only and not self._read_only_unchanged(field, data[name]):
                errors[name] = [serializers.ErrorDetail(READ_ONLY, code="read_only_field")]
        return errors

    def _read_only_unchanged(self, field: serializers.Field, value: Any) -> bool:
        instance = getattr(self, "instance", None)
        if instance is None or isinstance(instance, list | tuple):
            return False
        try:
            attribute = field.get_attribute(instance)
            current = None if attribute is None else field.to_representation(attribute)
        except Exception:
            return False
        return _same(current, value)

    def to_internal_value(self, data):
        errors = self.strict_field_errors(data)
        if errors:
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)  # type: ignore[misc]


def _same(current: Any, sent: Any) -> bool:
    # JSON round trip: ids may come back as strings from a form, floats as ints.
    if current == sent:
        return True
    if isinstance(current, list | dict) or isinstance(sent, list | dict):
        return False
    return current is not None and sent is not None and str(current) == str(sent)
