"""Accounts pages: tokens, members and invitations, the invited person's invitations, quotas, the org switcher."""

from __future__ import annotations

from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import View

from apps.accounts.models import ApiToken, Invitation, Membership, Organization, Role, Scope
from apps.accounts.services import (
    invitation_accept,
    invitation_create,
    invitation_decline,
    invitation_revoke,
    membership_remove,
    membership_set_role,
    memberships_of,
    org_set_quotas,
    token_create,
    token_revoke,
)
from apps.core import quotas
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
    """Members of the current org: owners and admins invite, change roles and remove (only owners touch owners).
    Removing someone says what it stopped (their tokens, jobs and subscriptions in the org)."""

    def _can_admin(self) -> bool:
        return self.principal.can_write and self.principal.role_at_least(Role.ADMIN)

    def _render(self, request, status: int = 200, **extra):
        members = self.scoped(Membership).filter(org=self.principal.org).select_related("user", "org")
        invitations = self.scoped(Invitation).filter(org=self.principal.org, status=Invitation.Status.PENDING)
        return render(request, "accounts/members.html", {"members": members, "roles": Role.values,
                                                         "invitations": invitations,
                                                         "can_admin": self._can_admin(), **extra}, status=status)

    def get(self, request):
        return self._render(request)

    def post(self, request):
        if not self._can_admin():
            return HttpResponse("Only org owners and admins manage members.", status=403)
        saved = "Saved."
        try:
            pk = request.POST.get("membership")
            revoke = request.POST.get("revoke_invitation", "")
            if pk:
                membership = self.get_changeable(Membership, pk=int(pk) if pk.isdigit() else 0)
                if request.POST.get("remove"):
                    name = membership.user.get_username()
                    done = membership_remove(principal=self.principal, membership=membership)
                    saved = _offboard_words(name, done)
                else:
                    membership_set_role(principal=self.principal, membership=membership,
                                        role=_role(request.POST.get("role")))
            elif revoke:
                invitation = self.get_changeable(Invitation, pk=int(revoke) if revoke.isdigit() else 0)
                invitation_revoke(principal=self.principal, invitation=invitation)
                saved = f"The invitation of {invitation.username} was revoked."
            else:
                invitation = invitation_create(principal=self.principal, org=self.principal.org,
                                               username=request.POST.get("username", "").strip()[:150],
                                               role=_role(request.POST.get("role")))
                saved = (f"{invitation.username} is invited as {invitation.role}; they join when they accept "
                         "(on their Invitations page, after they sign in).")
        except DomainError as exc:
            return self._render(request, status=400, error=exc.detail)
        return self._render(request, saved=saved)


def _offboard_words(name: str, done) -> str:
    parts = [f"{name} was removed"]
    if done.tokens_revoked:
        parts.append(f"{done.tokens_revoked} API token{'s' if done.tokens_revoked != 1 else ''} revoked")
    labels = {"scheduling.Job": ("job", "paused"), "events.Subscription": ("event subscription", "disabled")}
    for label, count in done.stopped.items():
        noun, verb = labels.get(label, (label, "stopped"))
        parts.append(f"{count} {noun}{'s' if count != 1 else ''} they made {verb}")
    return "; ".join(parts) + "."


class InvitationsView(LoginRequiredMixin, View):
    """The invitations addressed to the signed-in person: accept (join with the offered role) or decline.
    Open to someone in no org yet (a new account lands here: apps.core.ui.PrincipalView)."""

    def _render(self, request, status: int = 200, **extra):
        pending = Invitation.objects.for_user(request.user.pk).filter(
            status=Invitation.Status.PENDING).select_related("org")
        return render(request, "accounts/invitations.html",
                      {"invitations": pending, "no_org": getattr(request, "principal", None) is None, **extra},
                      status=status)

    def get(self, request):
        return self._render(request)

    def post(self, request):
        pk = request.POST.get("invitation", "")
        invitation = Invitation.objects.for_user(request.user.pk).filter(
            pk=int(pk) if pk.isdigit() else 0).select_related("org").first()
        if invitation is None:
            return HttpResponse("No such invitation.", status=404)
        try:
            if request.POST.get("answer") == "accept":
                invitation_accept(user=request.user, invitation=invitation)
                request.session["org"] = invitation.org.slug  # they accepted to act there: go there now
                return redirect("/")
            invitation_decline(user=request.user, invitation=invitation)
        except DomainError as exc:
            return self._render(request, status=400, error=exc.detail)
        return self._render(request, saved=f"You declined the invitation to {invitation.org.slug}.")


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


class QuotasView(PrincipalView):
    """What an org may hold and do, and what it uses now (apps.core.quotas). Operators pick any org (?org=) and
    change its limits; everyone else sees their own org's."""

    def _org(self, request):
        slug = request.GET.get("org") or request.POST.get("org")
        if slug and self.principal.is_operator:
            return self.get_scoped(Organization, slug=slug)
        return self.principal.org

    def _render(self, request, org, status: int = 200, **extra):
        orgs = self.scoped(Organization).order_by("slug") if self.principal.is_operator else []
        return render(request, "accounts/quotas.html", {"org": org, "rows": quotas.usage(org), "orgs": orgs,
                                                        "can_edit": self.principal.is_operator
                                                        and self.principal.can_write and not org.is_operator,
                                                        **extra}, status=status)

    def get(self, request):
        return self._render(request, self._org(request))

    def post(self, request):
        org = self._org(request)
        if not (self.principal.is_operator and self.principal.can_write):
            return HttpResponse("Only an operator sets quotas.", status=403)
        overrides = dict(org.quotas or {})
        try:
            for quota in quotas.QUOTAS.values():
                raw = request.POST.get(f"quota_{quota.name}", "").strip()
                if raw == "":
                    overrides.pop(quota.name, None)  # back to the default
                elif raw.isdigit():
                    overrides[quota.name] = int(raw)
                else:
                    raise DomainError("invalid_quota", f"{quota.label}: give a whole number, or leave it empty for "
                                      "the default.", field=quota.name)
            org = org_set_quotas(principal=self.principal, org=org, overrides=overrides)
        except (DomainError, ValueError) as exc:
            return self._render(request, org, status=400, error=getattr(exc, "detail", str(exc)))
        return self._render(request, org, saved=f"Quotas of {org.slug} saved.")
