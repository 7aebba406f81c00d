"""Organizations, memberships and API tokens."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.core.tenancy import RestrictedQuerySet


class OrganizationQuerySet(RestrictedQuerySet):
    def visible_to(self, principal) -> OrganizationQuerySet:
        if principal.is_operator:
            return self
        return self.filter(pk=principal.org_id)

    def writable_by(self, principal) -> OrganizationQuerySet:
        # Org settings include the capacity-test caps: operators set them, not the org itself.
        return self if principal.is_operator else self.none()


class Organization(models.Model):
    class Kind(models.TextChoices):
        OPERATOR = "operator"
        CUSTOMER = "customer"

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CUSTOMER)
    # Per-org caps for capacity tests: a control plane must not become an attack tool.
    max_test_rate = models.PositiveIntegerField(default=2000)
    max_test_duration_s = models.PositiveIntegerField(default=600)
    max_test_concurrency = models.PositiveIntegerField(default=200)
    # Private/loopback CIDRs this org's pool members may use (set by operators; see apps.core.netpolicy).
    member_networks = models.JSONField(default=list, blank=True)
    # Operator-set overrides of the per-org quotas ({name: limit}; apps.core.quotas has the names and defaults).
    quotas = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OrganizationQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_operator(self) -> bool:
        return self.kind == self.Kind.OPERATOR


class Role(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    EDITOR = "editor"
    VIEWER = "viewer"


ROLE_RANK = {Role.VIEWER: 0, Role.EDITOR: 1, Role.ADMIN: 2, Role.OWNER: 3}


class MembershipQuerySet(RestrictedQuerySet):
    """Members of the caller's org (operators: every org's); owners and admins change them."""

    def visible_to(self, principal) -> MembershipQuerySet:
        if principal.is_operator:
            return self
        return self.filter(org_id=principal.org_id)

    def writable_by(self, principal) -> MembershipQuerySet:
        if not principal.role_at_least(Role.ADMIN):
            return self.none()
        return self.visible_to(principal)


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    # What the audit log keeps (apps.audit.services.audit_snapshot): who, where, which role, by name.
    audit_fields = ("role",)

    objects = MembershipQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "org"], name="membership_unique_user_org")]
        ordering = ["org__slug", "user__username"]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.org_id}:{self.role}"

    def audit_extra(self) -> dict:
        return {"user": self.user.get_username(), "org": self.org.slug}


class InvitationQuerySet(RestrictedQuerySet):
    """An org's invitations (its admins manage them), and the ones addressed to the caller (to accept)."""

    def for_user(self, user_id: int | None) -> InvitationQuerySet:
        """The invitations addressed to a person (by their username), whatever org they act in, or none."""
        from django.contrib.auth import get_user_model

        if user_id is None:
            return self.none()
        me = get_user_model().objects.filter(pk=user_id, is_active=True).values("username")
        return self.filter(username__in=me)

    def addressed_to(self, principal) -> InvitationQuerySet:
        return self.for_user(principal.user_id)

    def visible_to(self, principal) -> InvitationQuerySet:
        if principal.is_operator:
            return self
        return self.filter(org_id=principal.org_id) | self.addressed_to(principal)

    def writable_by(self, principal) -> InvitationQuerySet:
        if not principal.role_at_least(Role.ADMIN):
            return self.none()
        return self if principal.is_operator else self.filter(org_id=principal.org_id)


class Invitation(models.Model):
    """An offer of a role in an org, made by its admins, that becomes a membership only when the invited user
    accepts it. Made for any username, existing or not, and answered the same way: no oracle of who exists."""

    class Status(models.TextChoices):
        PENDING = "pending"
        ACCEPTED = "accepted"
        DECLINED = "declined"
        REVOKED = "revoked"

    TENANT_PATH = "org"

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    invited_by = models.CharField(max_length=200, blank=True, default="")  # the inviter, in words
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    audit_fields = ("username", "role", "status")

    objects = InvitationQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "username"], condition=models.Q(status="pending"),
                                               name="invitation_one_pending_per_user")]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.username} → {self.org_id} as {self.role}"

    @property
    def expired(self) -> bool:
        return self.expires_at <= timezone.now()


class Scope(models.TextChoices):
    READ = "read"
    WRITE = "write"
    DEPLOY = "deploy"


class ApiTokenQuerySet(RestrictedQuerySet):
    def visible_to(self, principal) -> ApiTokenQuerySet:
        if principal.is_operator and principal.role_at_least(Role.ADMIN):
            return self
        return self.filter(org_id=principal.org_id)

    def usable(self, now: datetime | None = None) -> ApiTokenQuerySet:
        now = timezone.now() if now is None else now
        live = models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        return self.filter(revoked_at__isnull=True).filter(live)


class ApiToken(models.Model):
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    # The token that minted this one, if a token did: a child never outlives, outranks or outlasts
    # the revocation of its parent (apps.accounts.services.token_create / token_revoke).
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    name = models.CharField(max_length=100)
    # The prefix is public (shown in lists, used for lookup); only a SHA-256 of the
    # whole secret is stored, so a database leak yields no usable token.
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class SsoIdentity(models.Model):
    """A user made (just in time) by single sign-on, tied to the IdP's stable subject, never to an email.

    Linking by `sub` and not by email or username means an IdP account cannot take over a local account
    that happens to share its address or name.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    last_login_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique_subject")]

    def __str__(self) -> str:
        return f"{self.subject}@{self.issuer}"
