"""Who is asking: a user in an org, or an API token of an org, with a role and scopes."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from apps.accounts.models import ROLE_RANK, Organization, Role, Scope


@dataclass(frozen=True)
class Principal:
    org: Organization
    role: str
    user_id: int | None = None
    token_id: int | None = None
    scopes: frozenset[str] = field(default_factory=lambda: frozenset({Scope.READ, Scope.WRITE, Scope.DEPLOY}))
    # The token's name when the caller has it at hand (authentication read the token): `name` needs no query.
    token_name: str | None = field(default=None, compare=False)

    @property
    def org_id(self) -> int:
        return self.org.pk

    @property
    def is_operator(self) -> bool:
        return self.org.is_operator

    def role_at_least(self, role: str) -> bool:
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role(role)]

    @property
    def can_write(self) -> bool:
        return self.role_at_least(Role.EDITOR) and Scope.WRITE in self.scopes

    @property
    def can_deploy(self) -> bool:
        return self.role_at_least(Role.EDITOR) and (Scope.DEPLOY in self.scopes or Scope.WRITE in self.scopes)

    @property
    def actor(self) -> str:
        if self.token_id is not None:
            return f"token:{self.token_id}"
        return f"user:{self.user_id}"

    @cached_property
    def name(self) -> str:
        """Who, in words: the username, or "token <name>" for an API token (one query, cached)."""
        if self.token_id is not None:
            from apps.accounts.models import ApiToken

            token_name = self.token_name or (
                ApiToken.objects.filter(pk=self.token_id).values_list("name", flat=True).first())
            return f"token {token_name}" if token_name else f"token {self.token_id}"
        if self.user_id is not None:
            from django.contrib.auth import get_user_model

            username = get_user_model().objects.filter(pk=self.user_id).values_list("username", flat=True).first()
            if username:
                return username
        return self.actor

    @property
    def label(self) -> str:
        """How the audit log and rollouts name this actor: "alice (acme)", "token ci-deploy (acme)"."""
        return f"{self.name} ({self.org.slug})"
