"""The ACME tests' fleet addresses and small helpers (their fixtures are tests/acme/conftest.py's)."""

from __future__ import annotations

from apps.accounts.principal import Principal
from apps.balancers.models import HostnameClaim

US_NODES = ["127.18.1.1", "127.18.1.2"]
EU_NODES = ["127.18.2.1"]


def approve(org, hostname: str) -> HostnameClaim:
    return HostnameClaim.objects.create(org=org, hostname=hostname, status=HostnameClaim.Status.APPROVED)


def principal_of(persona) -> Principal:
    return persona.principal
