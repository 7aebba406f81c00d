"""A user of an org with a role, an API token and a client holding it (the suite's personas, tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework.test import APIClient

from apps.accounts.models import Organization
from apps.accounts.services import token_create
from tests.factories import MembershipFactory, UserFactory


@dataclass
class Persona:
    user: object
    org: Organization
    role: str
    client: APIClient
    token: str


def persona(username: str, org: Organization, role: str) -> Persona:
    user = UserFactory(username=username)
    MembershipFactory(user=user, org=org, role=role)
    scopes = ["read", "write", "deploy"]
    secret = token_create(org=org, name=f"{username}-token", scopes=scopes, user=user).secret
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return Persona(user=user, org=org, role=role, client=client, token=secret)
