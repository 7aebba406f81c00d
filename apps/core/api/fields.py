"""Serializer fields and validators shared by every app's API.

String fields that will ever reach a proxy config are validated here, at the edge,
with the strict allowlists in apps.core.validators (the renderer checks them again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from apps.core import validators as v


def allowlisted(check: Callable[[Any], Any]) -> Callable[[Any], None]:
    def run(value: Any) -> None:
        try:
            check(value)
        except v.InvalidValue as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from exc

    return run


validate_hostname = allowlisted(v.validate_hostname)
validate_path = allowlisted(v.validate_path)
validate_slug = allowlisted(v.validate_slug)
validate_redirect_url = allowlisted(v.validate_redirect_url)
validate_ip = allowlisted(v.validate_ip)


class SlugNameField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 63)
        super().__init__(validators=[validate_slug], **kwargs)


class HostnameField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 253)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_hostname], **kwargs)


class PathField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 1024)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_path], **kwargs)


class RedirectUrlField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 2048)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_redirect_url], **kwargs)


class ScopedRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key the principal can see; another tenant's id reads as 'does not exist'."""

    def __init__(self, model, **kwargs: Any) -> None:
        self.model = model
        kwargs.setdefault("queryset", model.objects.all())
        super().__init__(**kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        principal = getattr(request, "principal", None)
        if principal is None:
            return self.model.objects.none()
        return self.model.objects.visible_to(principal)


class ScopedSlugRelatedField(serializers.SlugRelatedField):
    def __init__(self, model, slug_field: str = "slug", **kwargs: Any) -> None:
        self.model = model
        kwargs.setdefault("queryset", model.objects.all())
        super().__init__(slug_field=slug_field, **kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        principal = getattr(request, "principal", None)
        if principal is None:
            return self.model.objects.none()
        manager = self.model.objects
        return manager.visible_to(principal) if hasattr(manager, "visible_to") else manager.all()
