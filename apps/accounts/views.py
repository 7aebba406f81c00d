"""Tokens page: create (secret shown once), list, revoke."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

from apps.accounts.models import ApiToken, Membership, Role, Scope
from apps.accounts.services import (
    membership_add,
    membership_remove,
    membership_set_role,
    memberships_of,
    token_create,
    token_revoke,
)
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


class MembersView(PrincipalView):
    """Members of the current org: owners and admins add, change roles and remove (only owners touch owners)."""

    def _can_admin(self) -> bool:
        return self.principal.can_write and self.principal.role_at_least(Role.ADMIN)

    def _render(self, request, status: int = 200, **extra):
        members = self.scoped(Membership).filter(org=self.principal.org).select_related("user", "org")
        return render(request, "accounts/members.html", {"members": members, "roles": Role.values,
                                                         "can_admin": self._can_admin(), **extra}, status=status)

    def get(self, request):
        return self._render(request)

    def post(self, request):
        if not self._can_admin():
            return HttpResponse("Only org owners and admins manage members.", status=403)
        try:
            pk = request.POST.get("membership")
            if pk:
                membership = self.get_changeable(Membership, pk=int(pk) if pk.isdigit() else 0)
                if request.POST.get("remove"):
                    membership_remove(principal=self.principal, membership=membership)
                else:
                    membership_set_role(principal=self.principal, membership=membership,
                                        role=_role(request.POST.get("role")))
            else:
                membership_add(principal=self.principal, org=self.principal.org,
                               username=request.POST.get("username", "").strip()[:150],
                               role=_role(request.POST.get("role")))
        except DomainError as exc:
            return self._render(request, status=400, error=exc.detail)
        return self._render(request, saved=True)


def _role(value: str | None) -> str:
    if value not in Role.values:
        raise DomainError("invalid_role", f"Role must be one of {', '.join(Role.values)}.", field="role")
    return value


class SwitchOrgView(PrincipalView):
    """The org switcher: the session acts in another org the user is a member of."""

    def post(self, request):
        slug = request.POST.get("org", "")
        if not any(m.org.slug == slug for m in memberships_of(request.user)):
            return HttpResponse("You are not a member of that organization.", status=404)
        request.session["org"] = slug
        target = request.POST.get("next") or "/"
        return redirect(target if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}) else "/")
