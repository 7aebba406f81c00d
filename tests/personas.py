"""A user of an org with a role, an API token and a client holding it (the suite's personas, tests/conftest.py), and
the same user in a browser session of Django's test client (`web`), for the server-rendered pages."""

from __future__ import annotations

from dataclasses import dataclass

from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.models import Organization
from apps.accounts.principal import Principal
from apps.accounts.services import token_create
from tests.factories import MembershipFactory, UserFactory


@dataclass
class Persona:
    user: object
    org: Organization
    role: str
    client: APIClient
    token: str

    @property
    def principal(self) -> Principal:
        """The persona as a service call sees it (what the API builds from its token's user and role)."""
        return Principal(org=self.org, role=self.role, user_id=self.user.pk)


def persona(username: str, org: Organization, role: str) -> Persona:
    user = UserFactory(username=username)
    MembershipFactory(user=user, org=org, role=role)
    scopes = ["read", "write", "deploy"]
    secret = token_create(org=org, name=f"{username}-token", scopes=scopes, user=user).secret
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return Persona(user=user, org=org, role=role, client=client, token=secret)


# The header an htmx request carries: `web(persona).post(url, data, **HTMX)` asks for the partial, as the page does.
HTMX = {"HTTP_HX_REQUEST": "true"}


def web(persona: Persona) -> Client:
    """A page client logged in as the persona (its session cookie, as a browser holds it)."""
    client = Client()
    client.force_login(persona.user)
    return client
