"""Writes for accounts: tokens, organizations, memberships."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiToken, Membership, Organization, Role, Scope
from apps.accounts.principal import Principal
from apps.audit.services import audit_record
from apps.core.errors import DomainError

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
    parent = None
    if principal is not None and principal.token_id is not None:
        # A token minting a token: the child is bounded by its parent in every way, so a short-lived
        # or narrow token cannot launder itself into a permanent or wider one.
        parent = ApiToken.objects.get(pk=principal.token_id)
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


def token_authenticate(raw: str) -> ApiToken | None:
    parts = raw.split("_")
    if len(parts) < 3 or parts[0] != TOKEN_PREFIX:
        return None
    token = ApiToken.objects.usable().select_related("org", "user").filter(prefix=parts[1]).first()
    if token is None or not hmac.compare_digest(token.secret_hash, _hash(raw)):
        return None
    now = timezone.now()
    # Throttle the last-used write to once a minute: a busy pipeline must not turn
    # every API read into a database write.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def principal_for_token(token: ApiToken) -> Principal:
    role = Role.ADMIN
    if token.user_id is not None:
        membership = Membership.objects.filter(user_id=token.user_id, org_id=token.org_id).first()
        # A token never has more power than the user who owns it.
        role = membership.role if membership else Role.VIEWER
    return Principal(org=token.org, role=role, user_id=token.user_id, token_id=token.pk,
                     scopes=frozenset(token.scopes))


def principal_for_user(user, org_slug: str | None = None) -> Principal | None:
    if not user or not user.is_authenticated:
        return None
    memberships = Membership.objects.filter(user=user).select_related("org").order_by("org__kind", "org__slug")
    if org_slug:
        memberships = memberships.filter(org__slug=org_slug)
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


def user_create_with_membership(*, username: str, password: str, org: Organization, role: str):
    user_model = get_user_model()
    with transaction.atomic():
        user, _ = user_model.objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        Membership.objects.update_or_create(user=user, org=org, defaults={"role": role})
    return user
