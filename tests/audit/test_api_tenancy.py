"""The tenancy contract (tests/api_contract.py) on the audit log (read-only by construction)."""

from __future__ import annotations

from apps.audit.models import AuditEvent
from tests.api_contract import TenancyContract


class TestAuditEvents(TenancyContract):
    url = "/api/v1/audit-events/"
    deletable = False

    def make(self, request):
        return AuditEvent.objects.create(actor="user:1", org=request.getfixturevalue("acme"), action="x.create",
                                         object_type="x", object_id="1")

    def payload(self, request):
        return {"action": "forged"}

    def test_owner_crud(self, request, alice):
        # The audit log is append-only: listing works, writing does not exist.
        event = self.make(request)
        assert event.pk in [row["id"] for row in alice.client.get(self.url).json()["results"]]
        assert alice.client.post(self.url, {"action": "forged"}, format="json").status_code == 405
        assert alice.client.delete(f"{self.url}{event.pk}/").status_code == 405
