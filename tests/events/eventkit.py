"""A webhook subscription with the events tests' signing secret (their receiver fixture is conftest.py's)."""

from __future__ import annotations

from apps.core import crypto
from apps.events.models import Subscription

SECRET = "s3cret-signing-key-0123"


def subscribe(org, url: str, **extra) -> Subscription:
    return Subscription.objects.create(org=org, name=extra.pop("name", "hook"), url=url,
                                       secret_encrypted=crypto.encrypt(SECRET), **extra)
