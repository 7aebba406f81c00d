from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.fields import ActingForMixin
from apps.core.api.strict import StrictFieldsMixin


class StrictSerializer(ActingForMixin, StrictFieldsMixin, serializers.Serializer):
    """Base of request bodies that are not a model's (actions): unknown fields answer 400 by name, and
    references resolve in the scope of the `org` the body names (ActingForMixin)."""


@extend_schema_field({"anyOf": [{"type": "array", "items": {}}, {"type": "object"}]})
class FieldErrorsField(serializers.Field):
    """A field's messages (a list of strings), or a nested field's: per item (a list of objects, or an
    object keyed by index) or per sub-field (an object)."""

    def to_representation(self, value):
        return value


class EmptySerializer(serializers.Serializer):
    """Body of actions that take no input (approve, release, revoke)."""


class ErrorSerializer(serializers.Serializer):
    """Every API error: a stable machine code, a sentence for a person, per-field messages."""

    code = serializers.CharField(help_text="Stable machine code, e.g. `invalid`, `conflict`, `not_found`.")
    detail = serializers.CharField()
    fields = serializers.DictField(child=FieldErrorsField(),
                                   help_text="Messages per request field (nested fields: per item or sub-field); "
                                             "empty when the error is not a field's.")


class QueuedSerializer(serializers.Serializer):
    """Answer of actions that only queue work (202)."""

    queued = serializers.BooleanField()
