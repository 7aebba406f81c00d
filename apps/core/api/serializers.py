from rest_framework import serializers


class EmptySerializer(serializers.Serializer):
    """Body of actions that take no input (approve, release, revoke)."""
