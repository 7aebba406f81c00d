"""The tenancy contract every API endpoint must keep (NetBox's API test mixins, Spillway's rules).

A test class names its endpoint, how to make an object owned by acme, and a valid
create payload; it inherits: anonymous 401, viewer write 403, outsider 404 on detail,
outsider's list and count without acme's objects, and owner create/read/update/delete.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.django_db
class TenancyContract:
    url: str = ""
    # Fields to PATCH in the update test: {field: value}.
    update: dict[str, Any] = {}
    deletable: bool = True
    # Objects the API does not create by POST to the list (runs, revisions, audit events, rollouts).
    creatable: bool = True
    # Shared infrastructure (regions, IP pools) is readable by everyone: no outsider 404.
    tenant_owned: bool = True
    writer = "alice"

    def make(self, request) -> Any:  # returns an object owned by acme
        raise NotImplementedError

    def payload(self, request) -> dict[str, Any]:
        raise NotImplementedError

    def detail(self, obj) -> str:
        return f"{self.url}{obj.pk}/"

    def test_anonymous_gets_401(self, request, anon):
        obj = self.make(request)
        assert anon.get(self.url).status_code == 401
        response = anon.get(self.detail(obj))
        assert response.status_code == 401
        assert response.json()["code"] == "not_authenticated"

    def test_viewer_cannot_write(self, request, vera):
        obj = self.make(request)
        response = vera.client.post(self.url, self.payload(request), format="json")
        assert response.status_code in ((403,) if self.creatable else (403, 405)), response.content
        assert response.json()["code"] in ("permission_denied", "method_not_allowed")
        if self.update:
            assert vera.client.patch(self.detail(obj), self.update, format="json").status_code == 403

    def test_outsider_gets_404_and_sees_nothing(self, request, charlie):
        obj = self.make(request)
        if not self.tenant_owned:
            # Shared infrastructure (regions, distances, IP pools): every org reads it, only operators change it.
            assert charlie.client.get(self.detail(obj)).status_code == 200
            assert obj.pk in [row["id"] for row in charlie.client.get(self.url).json()["results"]]
            if self.update:
                refused = charlie.client.patch(self.detail(obj), self.update, format="json")
                assert refused.status_code == 403, refused.content
            if self.deletable:
                assert charlie.client.delete(self.detail(obj)).status_code == 403
            return
        response = charlie.client.get(self.detail(obj))
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
        listing = charlie.client.get(self.url).json()
        assert obj.pk not in [row["id"] for row in listing["results"]]
        assert listing["count"] == len(listing["results"])
        if self.update:
            assert charlie.client.patch(self.detail(obj), self.update, format="json").status_code == 404
        if self.deletable:
            assert charlie.client.delete(self.detail(obj)).status_code == 404

    def test_owner_crud(self, request):
        client = request.getfixturevalue(self.writer).client
        if not self.creatable:
            obj = self.make(request)
            fetched = client.get(self.detail(obj))
            assert fetched.status_code == 200 and fetched["ETag"]
            assert obj.pk in [row["id"] for row in client.get(self.url).json()["results"]]
            return
        created = client.post(self.url, self.payload(request), format="json")
        assert created.status_code == 201, created.content
        body = created.json()
        fetched = client.get(f"{self.url}{body['id']}/")
        assert fetched.status_code == 200
        assert fetched["ETag"]
        assert body["id"] in [row["id"] for row in client.get(self.url).json()["results"]]
        if self.update:
            patched = client.patch(f"{self.url}{body['id']}/", self.update, format="json")
            assert patched.status_code == 200, patched.content
            for key, value in self.update.items():
                assert patched.json()[key] == value
        if self.deletable:
            assert client.delete(f"{self.url}{body['id']}/").status_code == 204
            assert client.get(f"{self.url}{body['id']}/").status_code == 404
