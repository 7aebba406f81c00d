"""The tenancy contract (tests/api_contract.py) on the accounts endpoints."""

from __future__ import annotations

from apps.accounts.models import Role
from apps.accounts.services import token_create
from tests.api_contract import TenancyContract
from tests.factories import MembershipFactory, UserFactory


class TestTokens(TenancyContract):
    url = "/api/v1/tokens/"
    deletable = False  # revocation keeps the row (revoked_at) for the audit trail

    def make(self, request):
        return token_create(org=request.getfixturevalue("acme"), name="deploy", scopes=["deploy"]).token

    def payload(self, request):
        return {"name": "ci", "scopes": ["read"]}


class TestOrganizations(TenancyContract):
    url = "/api/v1/organizations/"
    update = {"name": "Acme Incorporated"}
    writer = "otto"
    deletable = False

    def make(self, request):
        return request.getfixturevalue("acme")

    def payload(self, request):
        return {"slug": "newco", "name": "NewCo", "kind": "customer"}


class TestMemberships(TenancyContract):
    url = "/api/v1/memberships/"
    update = {"role": "editor"}
    creatable = False  # people join by accepting an invitation

    def make(self, request):
        return MembershipFactory(user=UserFactory(), org=request.getfixturevalue("acme"), role=Role.VIEWER)

    def payload(self, request):
        return {"username": UserFactory().username, "role": "viewer"}


class TestInvitations(TenancyContract):
    url = "/api/v1/invitations/"
    deletable = False  # revoked, kept for the audit trail

    def make(self, request):
        from django.utils import timezone

        from apps.accounts.models import Invitation

        return Invitation.objects.create(org=request.getfixturevalue("acme"), username="someone", role=Role.VIEWER,
                                         expires_at=timezone.now() + timezone.timedelta(days=1))

    def payload(self, request):
        return {"username": "newcomer", "role": "viewer"}
