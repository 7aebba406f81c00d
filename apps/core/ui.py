"""Base for UI views: a principal is required, and objects come only through restrict(principal, action).

The same rule as the API's base viewset (apps.core.tenancy): `scoped(Model)` reads, `get_scoped` finds
one object (404 for missing and foreign alike), `get_changeable` finds one the principal may change
(404 when it may not even see it, 403 when it sees but may not change it, e.g. a shared LB).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.views import View

from apps.core.errors import DomainError
from apps.core.tenancy import Action, restricted


class PrincipalView(LoginRequiredMixin, View):
    """`request.principal` comes from apps.accounts.middleware.PrincipalMiddleware (the session's user)."""

    def dispatch(self, request, *args, **kwargs):
        if request.user.is_authenticated and getattr(request, "principal", None) is None:
            # In no organization (new, or removed from the last one): the one page that can change that.
            return redirect(settings.NO_ORG_URL)
        return super().dispatch(request, *args, **kwargs)

    @property
    def principal(self):
        return self.request.principal

    def scoped(self, model, action: Action | str = Action.VIEW):
        return restricted(model, self.principal, action)

    def get_scoped(self, model, **lookup):
        return get_object_or_404(self.scoped(model), **lookup)

    def get_changeable(self, model, **lookup):
        obj = self.get_scoped(model, **lookup)
        if not self.scoped(model, Action.CHANGE).filter(pk=obj.pk).exists():
            raise PermissionDenied("You can see this object but not change it.")
        return obj

    def template_for(self, full: str, partial: str) -> str:
        """One view, two renders: the page, or only its partial for an htmx request."""
        return partial if getattr(self.request, "htmx", False) and not self.request.htmx.boosted else full


def errors_of(source: Any) -> dict[str, list[str]]:
    """Errors by form field, as plain sentences, from what a UI view gets back from the shared serializers
    and services: a DomainError, or a serializer's `.errors` (nested lists/dicts, e.g. per route target).
    Dotted field names become underscores so templates can look them up."""
    if isinstance(source, DomainError):
        return {(source.field or "non_field_errors").replace(".", "_"): [source.detail]}
    return {str(name).replace(".", "_"): _sentences(value) for name, value in source.items()}


def _sentences(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [msg for v in value.values() for msg in _sentences(v)]
    if isinstance(value, list):
        return [msg for v in value for msg in _sentences(v)]
    return [str(value)]
