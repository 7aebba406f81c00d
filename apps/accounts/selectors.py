"""Reads of accounts other apps show: who an actor string ("user:3", "token:7") is, in words."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from apps.accounts.models import ApiToken


def actor_names(actors: set[str]) -> dict[str, str]:
    """actor -> its username ("<username or token name> via API" for a token), from one query per kind present.
    Actors that are neither ("system", "job:…", a deleted user) are left out: callers show them as they are."""
    users = {int(a[5:]) for a in actors if a.startswith("user:") and a[5:].isdigit()}
    tokens = {int(a[6:]) for a in actors if a.startswith("token:") and a[6:].isdigit()}
    out: dict[str, str] = {}
    if users:
        names = dict(get_user_model().objects.filter(pk__in=users).values_list("pk", "username"))
        out = {f"user:{pk}": name for pk, name in names.items()}
    if tokens:
        for pk, name, username in ApiToken.objects.filter(pk__in=tokens).values_list("pk", "name", "user__username"):
            out[f"token:{pk}"] = f"{username or name} via API"
    return out


def actor_name(actor: str) -> str:
    """One actor in words, or the actor string itself when it names no user or token."""
    return actor_names({actor}).get(actor, actor)
