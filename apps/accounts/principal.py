"""Who is asking: a user in an org, or an API token of an org, with a role and scopes."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.accounts.models import ROLE_RANK, Organization, Role, Scope


@dataclass(frozen=True)
class Principal:
    org: Organization
    role: str
    user_id: int | None = None
    token_id: int | None = None
    scopes: frozenset[str] = field(default_factory=lambda: frozenset({Scope.READ, Scope.WRITE, Scope.DEPLOY}))

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
