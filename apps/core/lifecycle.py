"""What happens to a member's authority when the membership ends.

A person acts in an org through three things: their session, their API tokens, and objects that keep
acting on their authority after the request that made them (a scheduled job, an event subscription).
When a membership is removed — through the API, the members page, or single sign-on dropping the last
group that maps to the org — all three end at once, in the same transaction as the removal:

- sessions: the principal is recomputed from memberships on every request, so the next request of a
  session in that org no longer acts there (it lands in another org the user has, or on the invitations
  page when none is left);
- tokens: every token the user holds in the org is revoked (with the tokens they minted), and a token
  whose owner is not a member is refused at authentication anyway (`principal_for_token`);
- owned objects: each app registers here, for every model that records who made it (`created_by`), what
  stops when its maker leaves (`register`); apps.accounts.services.member_offboard calls them. Jobs are
  paused, subscriptions disabled; whoever turns them on again takes them over.
  tests/accounts/test_lifecycle.py fails on a model with `created_by` that no app registered, so a new
  kind of owned object cannot be forgotten.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Owned:
    """A model whose rows act on their maker's authority, and what stops them when the maker leaves."""

    model: type
    # (org, actors of the leaving member, principal removing them) → how many rows it stopped.
    stop: Callable[[Any, set[str], Any], int] | None
    why_inert: str = ""  # for rows that act on nobody's authority (e.g. a test definition a person runs)


REGISTRY: dict[str, Owned] = {}


def register(model: type, *, stop: Callable[[Any, set[str], Any], int] | None = None, why_inert: str = "") -> None:
    if stop is None and not why_inert:
        raise ValueError(f"{model.__name__}: give `stop`, or say in `why_inert` why nothing needs stopping")
    REGISTRY[model._meta.label] = Owned(model, stop, why_inert)


@dataclass
class Offboarded:
    """What ending a membership stopped, for the audit log and the person who removed the member."""

    tokens_revoked: int = 0
    stopped: dict[str, int] = field(default_factory=dict)  # model label → rows stopped

    def as_dict(self) -> dict[str, Any]:
        return {"tokens_revoked": self.tokens_revoked, "stopped": self.stopped}


def stop_owned(*, org: Any, actors: set[str], principal: Any) -> dict[str, int]:
    stopped = {}
    for label, owned in sorted(REGISTRY.items()):
        if owned.stop is not None:
            count = owned.stop(org, actors, principal)
            if count:
                stopped[label] = count
    return stopped
