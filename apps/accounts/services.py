"""Writes for accounts: tokens, organizations, memberships."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Case, OuterRef, QuerySet, Subquery, When
from django.utils import timezone

from apps.accounts.models import ApiToken, Invitation, Membership, Organization, Role, Scope, SsoIdentity
from apps.accounts.principal import Principal
from apps.audit.services import AuditAction, audit_record, audited_delete, audited_save
from apps.core import lifecycle, quotas
from apps.core.errors import DomainError
from apps.core.prepared import TIME_PROBES, PreparedQuery

TOKEN_PREFIX = "spw"  # noqa: S105  (a public marker, not a secret)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # shown once, never stored


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_create(
    *,
    org: Organization,
    name: str,
    scopes: list[str],
    user=None,
    expires_at: datetime | None = None,
    principal: Principal | None = None,
) -> IssuedToken:
    bad = sorted(set(scopes) - set(Scope.values))
    if bad or not scopes:
        raise DomainError("invalid_scopes", f"Scopes must be a non-empty subset of {Scope.values}; got {scopes}.",
                          field="scopes")
    if expires_at is not None and expires_at <= timezone.now():
        raise DomainError("invalid_expiry", "Expiry must be in the future.", field="expires_at")
    with transaction.atomic():
        return _token_create(org=org, name=name, scopes=scopes, user=user, expires_at=expires_at,
                             principal=principal)


def _token_create(*, org, name, scopes, user, expires_at, principal) -> IssuedToken:
    parent = None
    if principal is not None and principal.token_id is not None:
        # A token minting a token: the child is bounded by its parent in every way, so a short-lived
        # or narrow token cannot launder itself into a permanent or wider one. The parent's row is locked
        # so a revocation running at the same time either sees this child or makes this create fail.
        parent = ApiToken.objects.select_for_update().filter(pk=principal.token_id).first()
        if parent is None or parent.revoked_at is not None:
            raise DomainError("token_revoked", "The token making this request was revoked.", status=401)
        wider = sorted(set(scopes) - set(principal.scopes))
        if wider:
            raise DomainError("scope_exceeds_parent", f"This token cannot grant scopes it does not have: {wider}.",
                              field="scopes", status=403)
        if parent.expires_at is not None:
            if expires_at is not None and expires_at > parent.expires_at:
                raise DomainError("expiry_exceeds_parent",
                                  "A token cannot outlive the token that creates it; choose an earlier expiry.",
                                  field="expires_at")
            expires_at = expires_at or parent.expires_at
        user = parent.user
    elif principal is not None and user is None:
        user = principal.user_id and get_user_model().objects.filter(pk=principal.user_id).first()
    # 256 bits from the OS CSPRNG; the prefix is separate randomness used only for lookup.
    prefix = secrets.token_hex(6)
    secret = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        token = ApiToken.objects.create(
            org=org, user=user or None, parent=parent, name=name, prefix=prefix, secret_hash=_hash(secret),
            scopes=sorted(set(scopes)), expires_at=expires_at,
        )
        audit_record(principal=principal, org=org, action="token.create", obj=token,
                     after={"name": name, "scopes": token.scopes, "prefix": prefix,
                            "parent": parent.prefix if parent else None})
    return IssuedToken(token=token, secret=secret)


def token_revoke(*, token: ApiToken, principal: Principal | None) -> ApiToken:
    """Revoke the token and every token it minted, and theirs (a child never outlives its parent)."""
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token.pk)  # waits for a child being minted
        now = timezone.now()
        pending = [token]
        while pending:
            current = pending.pop()
            if current.revoked_at is None:
                current.revoked_at = now
                current.save(update_fields=["revoked_at"])
                audit_record(principal=principal, org=current.org, action="token.revoke", obj=current,
                             after={"revoked_at": now.isoformat()})
            pending.extend(current.children.filter(revoked_at__isnull=True))
    return token


def _token_by_prefix(prefix: str, now: datetime) -> QuerySet:
    # The owner's role in the token's org comes in the same query (principal_for_token): one round trip for every
    # API call instead of two.
    role = _owner_role(OuterRef("user_id"), OuterRef("org_id"))
    return (ApiToken.objects.usable(now).select_related("org", "user").filter(prefix=prefix)
            .annotate(owner_role=Subquery(role[:1])).order_by("pk")[:1])


# Every API call runs it: compiled once (`make bench-prepared`: ~1.5-2 ms of CPU a call otherwise, ~0.3 prepared).
_TOKEN_BY_PREFIX = PreparedQuery(_token_by_prefix, probes={
    "prefix": ("probe-a", "probe-b"),
    "now": TIME_PROBES,
})


def token_authenticate(raw: str) -> ApiToken | None:
    parts = raw.split("_")
    if len(parts) < 3 or parts[0] != TOKEN_PREFIX:
        return None
    now = timezone.now()
    token = _TOKEN_BY_PREFIX.first(prefix=parts[1], now=now)
    if token is None or not hmac.compare_digest(token.secret_hash, _hash(raw)):
        return None
    # Throttle the last-used write to once a minute: a busy pipeline must not turn
    # every API read into a database write.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def principal_for_token(token: ApiToken) -> Principal | None:
    """Who a token acts as, or None: a person's token works only while they are an active member of its org
    (removal revokes it too, apps.core.lifecycle; this is the second lock)."""
    role = Role.ADMIN
    if token.user_id is not None:
        # A token never has more power than the user who owns it. token_authenticate read the role with the token,
        # for this request only (a token object kept longer must not be passed here); any other token is looked up.
        role = (token.owner_role if hasattr(token, "owner_role")
                else _owner_role(token.user_id, token.org_id).first())
        if role is None:
            return None
    return Principal(org=token.org, role=role, user_id=token.user_id, token_id=token.pk,
                     scopes=frozenset(token.scopes), token_name=token.name)


def _owner_role(user_id: int | OuterRef, org_id: int | OuterRef) -> QuerySet:
    """The user's role in the org while their account is active: one row or none ((user, org) is unique, so no
    ordering: Membership's own would join two tables into every API call's query)."""
    return (Membership.objects.filter(user_id=user_id, org_id=org_id, user__is_active=True)
            .order_by().values_list("role", flat=True))


def principal_for_user(user, org_slug: str | None = None) -> Principal | None:
    """The session's principal: in the chosen org while the user is a member there, else in the org they
    would sign in to (a removed member's session lands in an org they still have; none: signed out)."""
    if not user or not user.is_authenticated:
        return None
    # Without a chosen org: an operator membership first, then the oldest. Never by name or invitation time:
    # that must not move the user's next sign-in into an inviter's org.
    memberships = Membership.objects.filter(user=user).select_related("org").order_by(
        Case(When(org__kind=Organization.Kind.OPERATOR, then=0), default=1), "created_at", "pk")
    membership = None
    if org_slug:
        membership = memberships.filter(org__slug=org_slug).first()
    if membership is None:
        membership = memberships.first()
    if membership is None:
        return None
    return Principal(org=membership.org, role=membership.role, user_id=user.pk)


def org_create(*, slug: str, name: str, kind: str, principal: Principal | None = None) -> Organization:
    with transaction.atomic():
        org = Organization.objects.create(slug=slug, name=name, kind=kind)
        audit_record(principal=principal, org=org, action="organization.create", obj=org,
                     after={"slug": slug, "kind": kind})
    return org


def org_set_quotas(*, principal: Principal, org: Organization, overrides: dict[str, int]) -> Organization:
    """An operator sets an org's quota overrides (names and defaults: apps.core.quotas); an empty one removes it."""
    if not principal.is_operator:
        raise DomainError("operator_only", "Only an operator sets quotas.", status=403)
    return audited_save(principal=principal, obj=org, data={"quotas": quotas.validate_overrides(overrides)})


def user_create_with_membership(*, username: str, password: str, org: Organization, role: str):
    user_model = get_user_model()
    with transaction.atomic():
        user, _ = user_model.objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        Membership.objects.update_or_create(user=user, org=org, defaults={"role": role})
    return user


# --- memberships ----------------------------------------------------------------------------------------


def _check_role_change(principal: Principal, *, old: str | None, new: str | None) -> None:
    """Admins manage editors and viewers (and other admins); only owners grant, change or remove owner."""
    if Role.OWNER in (old, new) and not (principal.is_operator or principal.role_at_least(Role.OWNER)):
        raise DomainError("owner_required", "Only an owner can grant, change or remove the owner role.",
                          field="role", status=403)


def _check_not_last_owner(m: Membership) -> None:
    if m.role == Role.OWNER and not Membership.objects.filter(org=m.org, role=Role.OWNER).exclude(pk=m.pk).exists():
        raise DomainError("last_owner", "An organization keeps at least one owner; make someone else owner first.",
                          field="role", status=409)


INVITATION_TTL_S = 14 * 86400


def invitation_create(*, principal: Principal, org: Organization, username: str, role: str) -> Invitation:
    """Invite `username` into `org` with `role`. The same answer whether or not such a user exists: the user
    sees it at their next sign-in (or when their account is made) and accepts or declines it there."""
    username = username.strip()
    if not username or len(username) > 150 or any(c.isspace() or not c.isprintable() for c in username):
        raise DomainError("invalid_username", "Give the username of the person to invite.", field="username")
    _check_role_change(principal, old=None, new=role)
    if Membership.objects.filter(org=org, user__username=username).exists():
        raise DomainError("already_member", f"{username} is already a member of {org.slug}.", field="username",
                          status=409)
    with transaction.atomic():
        Organization.objects.select_for_update().filter(pk=org.pk).first()  # one count per org at a time
        invitation = Invitation.objects.filter(org=org, status=Invitation.Status.PENDING, username=username).first()
        if invitation is None:
            quotas.check_count(org, "invitations")
        data = {"role": role, "invited_by": principal.label[:200],
                "expires_at": timezone.now() + timezone.timedelta(seconds=INVITATION_TTL_S)}
        return audited_save(principal=principal, obj=invitation or Invitation(org=org, username=username), data=data)


def _pending(invitation: Invitation) -> Invitation:
    invitation = Invitation.objects.select_for_update().select_related("org").get(pk=invitation.pk)
    if invitation.status != Invitation.Status.PENDING or invitation.expired:
        raise DomainError("invitation_closed", "This invitation was already answered, revoked or has expired; ask "
                          "for a new one.", status=409)
    return invitation


def invitation_accept(*, user, invitation: Invitation) -> Membership:
    """The invited person (only them: their own username) takes the offered role. They may belong to no org
    yet, so the audit names them as the new member of the inviting org."""
    with transaction.atomic():
        invitation = _pending(invitation)
        if not user.is_active or invitation.username != user.get_username():
            raise DomainError("not_found", "Not found.", status=404)
        membership, _ = Membership.objects.get_or_create(user=user, org=invitation.org,
                                                         defaults={"role": invitation.role})
        principal = Principal(org=invitation.org, role=membership.role, user_id=user.pk)
        audited_save(principal=principal, obj=invitation, data={"status": Invitation.Status.ACCEPTED,
                                                                "decided_at": timezone.now()})
        audit_record(principal=principal, org=invitation.org, action="membership.create", obj=membership,
                     after={"user": user.get_username(), "role": membership.role, "invitation": invitation.pk})
    return membership


def invitation_decline(*, user, invitation: Invitation) -> Invitation:
    with transaction.atomic():
        invitation = _pending(invitation)
        if invitation.username != user.get_username():
            raise DomainError("not_found", "Not found.", status=404)
        principal = Principal(org=invitation.org, role=Role.VIEWER, user_id=user.pk)
        return audited_save(principal=principal, obj=invitation, data={"status": Invitation.Status.DECLINED,
                                                                       "decided_at": timezone.now()})


def invitation_revoke(*, principal: Principal, invitation: Invitation) -> Invitation:
    with transaction.atomic():
        invitation = _pending(invitation)
        _check_role_change(principal, old=None, new=invitation.role)
        return audited_save(principal=principal, obj=invitation, data={"status": Invitation.Status.REVOKED,
                                                                       "decided_at": timezone.now()})


def membership_set_role(*, principal: Principal, membership: Membership, role: str) -> Membership:
    with transaction.atomic():
        membership = Membership.objects.select_for_update().select_related("user", "org").get(pk=membership.pk)
        if role == membership.role:
            return membership
        _check_role_change(principal, old=membership.role, new=role)
        _check_not_last_owner(membership)
        return audited_save(principal=principal, obj=membership, action=AuditAction.UPDATE, data={"role": role})


def membership_remove(*, principal: Principal | None, membership: Membership,
                      checked: bool = True) -> lifecycle.Offboarded:
    """End a membership and, in the same transaction, the member's authority in the org (apps.core.lifecycle):
    their tokens there are revoked and what they own that acts for them stops. `checked=False` only for
    single sign-on, where the IdP's claims are the authority."""
    with transaction.atomic():
        membership = Membership.objects.select_for_update().select_related("user", "org").get(pk=membership.pk)
        if checked:
            _check_role_change(principal, old=membership.role, new=None)
            _check_not_last_owner(membership)
        audited_delete(principal=principal, obj=membership)
        return member_offboard(principal=principal, user=membership.user, org=membership.org)


def member_offboard(*, principal: Principal | None, user, org: Organization) -> lifecycle.Offboarded:
    """Revoke the user's tokens in `org` and stop what acts there on their authority (call with the membership
    gone, inside the transaction that removed it)."""
    tokens = ApiToken.objects.filter(org=org, user=user).values_list("pk", flat=True)
    actors = {f"user:{user.pk}", *(f"token:{pk}" for pk in tokens)}  # every actor they were in the org
    done = lifecycle.Offboarded()
    live = list(ApiToken.objects.filter(org=org, user=user, revoked_at__isnull=True))
    for token in live:  # each with the tokens it minted (a child already revoked is left as it is)
        token_revoke(token=token, principal=principal)
    done.tokens_revoked = len(live)
    done.stopped = lifecycle.stop_owned(org=org, actors=actors, principal=principal)
    audit_record(principal=principal, org=org, action="membership.offboard", obj=user,
                 after={"user": user.get_username(), **done.as_dict()})
    return done


def memberships_of(user) -> list[Membership]:
    """The orgs a signed-in user can switch between."""
    return list(Membership.objects.filter(user=user).select_related("org").order_by("org__kind", "org__slug"))


# --- single sign-on (apps.accounts.sso) -------------------------------------------------------------------


class SsoNoOrg(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _free_username(base: str) -> str:
    user_model = get_user_model()
    base = (base.strip() or "sso-user")[:140]
    if not user_model.objects.filter(username=base).exists():
        return base
    for n in range(2, 1000):
        if not user_model.objects.filter(username=f"{base}-{n}").exists():
            return f"{base}-{n}"
    return f"{base}-{secrets.token_hex(4)}"


def sso_user_sync(*, issuer: str, subject: str, username: str, email: str, grants: dict[str, str],
                  managed_orgs: set[str]):
    """The user behind an IdP subject, made on first sign-in, with memberships as the IdP's claims say.

    Orgs named in the mapping (`managed_orgs`) follow the claims at every sign-in (granted, role changed or
    removed, a removal ending the member's tokens and owned objects there as any removal does); memberships in
    other orgs, added by hand, are left alone. When the claims grant no existing org the sign-in is refused
    (SsoNoOrg), after the memberships the IdP no longer grants are removed: deprovisioning at the IdP ends
    access here too, not only the next sign-in.
    """
    orgs = {o.slug: o for o in Organization.objects.filter(slug__in=grants)}
    user_model = get_user_model()
    with transaction.atomic():
        identity = SsoIdentity.objects.select_for_update().select_related("user").filter(
            issuer=issuer, subject=subject).first()
        if identity is None and not orgs:
            raise SsoNoOrg(_no_org_message(username))
        if identity is None:
            user = user_model(username=_free_username(_clean_username(username)), email=email)
            user.set_unusable_password()  # a password can never open this account
            user.save()
            identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
            audit_record(principal=None, org=next(iter(orgs.values())), action="user.sso_create", obj=user,
                         after={"username": user.username, "issuer": issuer, "subject": subject})
        user = identity.user
        if email and user.email != email:
            user.email = email
            user.save(update_fields=["email"])
        identity.last_login_at = timezone.now()
        identity.save(update_fields=["last_login_at"])
        current = {m.org.slug: m for m in Membership.objects.filter(user=user).select_related("org")}
        for slug, org in orgs.items():
            m = current.get(slug)
            if m is None or m.role != grants[slug]:
                before = {"role": m.role} if m else None
                Membership.objects.update_or_create(user=user, org=org, defaults={"role": grants[slug]})
                audit_record(principal=None, org=org, action="membership.sso_sync", obj=user,
                             before=before, after={"user": user.username, "role": grants[slug]})
        for slug, m in current.items():
            if slug in managed_orgs and slug not in orgs:
                audit_record(principal=None, org=m.org, action="membership.sso_sync", obj=user,
                             before={"role": m.role}, after=None)
                membership_remove(principal=None, membership=m, checked=False)
    if not orgs:  # committed above: the removals stand although nobody signs in
        raise SsoNoOrg(_no_org_message(username))
    return user


def _no_org_message(username: str) -> str:
    return (f"Your single sign-on account ({_clean_username(username)}) is not in any group that Spillway maps to "
            "an organization, so it cannot sign in. Ask your Spillway operator to map one of your groups.")


def _clean_username(raw: str) -> str:
    """A username from the IdP as Spillway stores it: Django's username characters only (letters, digits and
    @.+-_), NFKC-normalized, invisible and control characters dropped; "sso-user" when nothing is left."""
    import re
    import unicodedata

    text = unicodedata.normalize("NFKC", str(raw or ""))
    text = "".join(c for c in text if unicodedata.category(c)[0] not in ("C", "Z") or c == " ")
    text = re.sub(r"[^\w.@+-]", "", text.replace(" ", "-"))
    return text[:140] or "sso-user"
