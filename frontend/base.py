"""Base for UI views: a principal is required, and objects come only through visible_to()."""

from __future__ import annotations

from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.views import View

from apps.accounts.services import principal_for_user


class PrincipalView(LoginRequiredMixin, View):
    def dispatch(self, request, *args, **kwargs):
        if request.user.is_authenticated:
            request.principal = principal_for_user(request.user, request.session.get("org"))
            if request.principal is None:
                raise Http404("Your account belongs to no organization.")
        return super().dispatch(request, *args, **kwargs)

    @property
    def principal(self):
        return self.request.principal

    def scoped(self, model):
        return model.objects.visible_to(self.principal)

    def get_scoped(self, model, **lookup):
        return get_object_or_404(self.scoped(model), **lookup)

    def template_for(self, full: str, partial: str) -> str:
        """One view, two renders: the page, or only its partial for an htmx request."""
        return partial if getattr(self.request, "htmx", False) and not self.request.htmx.boosted else full
