"""Tokens page: create (secret shown once), list, revoke."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render

from apps.accounts.models import ApiToken, Role, Scope
from apps.accounts.services import token_create, token_revoke
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView


class TokenListView(PrincipalView):
    def _render(self, request, **extra):
        tokens = self.scoped(ApiToken).select_related("org").order_by("-created_at")
        return render(request, "accounts/tokens.html", {"tokens": tokens, "scopes": Scope.values,
                                                        "can_admin": self._can_admin(), **extra})

    def _can_admin(self) -> bool:
        return self.principal.can_write and self.principal.role_at_least(Role.ADMIN)

    def get(self, request):
        return self._render(request)

    def post(self, request):
        if not self._can_admin():
            return HttpResponse("Only org admins can create tokens.", status=403)
        name = request.POST.get("name", "").strip()[:100]
        scopes = request.POST.getlist("scopes")
        try:
            if not name:
                raise DomainError("invalid_name", "Give the token a name.", field="name")
            issued = token_create(org=self.principal.org, name=name, scopes=scopes, principal=self.principal)
        except DomainError as exc:
            return self._render(request, error=exc.detail)
        return self._render(request, secret=issued.secret, created=issued.token)


class TokenRevokeView(PrincipalView):
    def post(self, request, pk: int):
        token = self.get_scoped(ApiToken, pk=pk)
        if not (self.principal.can_write and self.principal.role_at_least(Role.ADMIN)):
            return HttpResponse("Only org admins can revoke tokens.", status=403)
        token_revoke(token=token, principal=self.principal)
        return render(request, "accounts/token_row.html", {"t": token, "can_admin": True})
