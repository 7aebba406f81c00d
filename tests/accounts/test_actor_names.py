"""Who an actor string is, in words (apps.accounts.selectors), as the drill report and a revision's reason show it."""

from __future__ import annotations

from apps.accounts.selectors import actor_name, actor_names
from apps.accounts.services import token_create


def test_users_and_tokens_are_named_and_anything_else_is_left_as_it_is(alice, acme) -> None:
    own = token_create(org=acme, name="laptop", scopes=["read"], user=alice.user).token
    machine = token_create(org=acme, name="deploy-bot", scopes=["read"]).token
    names = actor_names({f"user:{alice.user.pk}", f"token:{own.pk}", f"token:{machine.pk}", "system",
                         "user:999999", "token:x"})
    assert names == {f"user:{alice.user.pk}": "alice", f"token:{own.pk}": "alice via API",
                     f"token:{machine.pk}": "deploy-bot via API"}
    assert actor_name("system") == "system" and actor_name("user:999999") == "user:999999"
    assert actor_name(f"user:{alice.user.pk}") == "alice"
