from rest_framework import serializers


class EmptySerializer(serializers.Serializer):
    """Body of actions that take no input (approve, release, revoke)."""


class ErrorSerializer(serializers.Serializer):
    """Every API error: a stable machine code, a sentence for a person, per-field messages."""

    code = serializers.CharField(help_text="Stable machine code, e.g. `invalid`, `conflict`, `not_found`.")
    detail = serializers.CharField()
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()),
                                   help_text="Messages per request field; empty when the error is not a field's.")


class QueuedSerializer(serializers.Serializer):
    """Answer of actions that only queue work (202)."""

    queued = serializers.BooleanField()
