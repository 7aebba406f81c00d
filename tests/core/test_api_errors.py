"""Bad input found by fuzzing the API: each answers a coded JSON error, never a 500 or an HTML page."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from apps.balancers.models import HostnameClaim
from apps.fleets.models import Certificate
from tests.factories import HostnameClaimFactory, LoadBalancerFactory, RegionFactory, RouteFactory
from tests.fleets.fleetkit import self_signed

pytestmark = pytest.mark.django_db


def _coded(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert set(body) >= {"code", "detail", "fields"}, body
    if code is not None:
        assert body["code"] == code, body
    return body


def test_duplicate_org_slug_on_create_and_rename_is_a_409_naming_the_field(otto, acme, globex) -> None:
    created = otto.client.post("/api/v1/organizations/", {"slug": "acme", "name": "Acme again"}, format="json")
    assert _coded(created, 409, "conflict")["fields"] == {"slug": ["An object with this value already exists."]}
    renamed = otto.client.patch(f"/api/v1/organizations/{globex.pk}/", {"slug": "acme"}, format="json")
    _coded(renamed, 409, "conflict")
    assert otto.client.get(f"/api/v1/organizations/{globex.pk}/").json()["slug"] == "globex"


def test_duplicate_fleet_name_on_create_and_rename_is_a_409(otto) -> None:
    RegionFactory(slug="us-east")
    body = {"name": "eu", "region": "us-east"}
    assert otto.client.post("/api/v1/fleets/", body, format="json").status_code == 201
    other = otto.client.post("/api/v1/fleets/", {**body, "name": "us"}, format="json").json()
    _coded(otto.client.post("/api/v1/fleets/", body, format="json"), 409, "conflict")
    _coded(otto.client.patch(f"/api/v1/fleets/{other['id']}/", {"name": "eu"}, format="json"), 409, "conflict")


def test_static_ip_filter_with_a_non_address_is_a_400(alice) -> None:
    body = _coded(alice.client.get("/api/v1/static-ips/", {"address": "not-an-ip"}), 400)
    assert "address" in body["fields"]


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00+16:00", "2026-01-01T00:00:00-23:59",
                                   "2026-01-01T00:00:00+99:99"])
def test_datetime_filters_with_offsets_out_of_range_are_a_400(alice, value: str) -> None:
    body = _coded(alice.client.get("/api/v1/audit-events/", {"since": value}), 400)
    assert "since" in body["fields"]
    assert alice.client.get("/api/v1/audit-events/", {"since": "2026-01-01T00:00:00+15:59"}).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/organizations/?slug=a%00b", "/api/v1/certificates/?name=x%00",
                                  "/api/v1/audit-events/?action=a%00", "/api/v1/regions/?slug=%00"])
def test_nul_bytes_in_query_parameters_are_a_400(otto, path: str) -> None:
    _coded(otto.client.get(path), 400, "null_characters_not_allowed")


def test_nul_bytes_anywhere_in_a_json_body_are_a_400_naming_the_field(alice, otto) -> None:
    nul = "null_characters_not_allowed"
    RegionFactory(slug="us-east")
    # `region` is a slug-related field: its value went straight into a query.
    body = _coded(otto.client.post("/api/v1/fleets/", {"name": "eu", "region": "us\x00east"}, format="json"),
                  400, nul)
    assert list(body["fields"]) == ["region"]
    cert = {"name": "x", "org": "ac\x00me", "cert_pem": "a", "key_pem": "b"}
    assert list(_coded(alice.client.post("/api/v1/certificates/", cert, format="json"), 400, nul)["fields"]) == ["org"]
    # Deep inside a nested value, or in a key, too.
    nested = _coded(alice.client.post("/api/v1/routes/", {"targets": [{"pool": "\x00"}]}, format="json"), 400, nul)
    assert list(nested["fields"]) == ["targets"]
    _coded(alice.client.post("/api/v1/hostname-claims/", {"hostname\x00": "a.example"}, format="json"), 400, nul)


def test_deeply_nested_json_is_a_400(alice) -> None:
    depth = 100_000
    body = "[" * depth + "]" * depth
    response = alice.client.post("/api/v1/hostname-claims/", body, content_type="application/json")
    _coded(response, 400, "parse_error")
    # Deep but parseable nesting is refused before any serializer recurses into it.
    body = json.dumps({"hostname": json.loads("[" * 500 + "]" * 500)})
    _coded(alice.client.post("/api/v1/hostname-claims/", body, content_type="application/json"), 400,
           "parse_error")


def test_patching_a_certificate_without_pem_fields_renames_it(alice) -> None:
    cert_pem, key_pem = self_signed(days=10)
    created = alice.client.post("/api/v1/certificates/", {"name": "shop", "cert_pem": cert_pem,
                                                          "key_pem": key_pem}, format="json").json()
    renamed = alice.client.patch(f"/api/v1/certificates/{created['id']}/", {"name": "shop2"}, format="json")
    assert renamed.status_code == 200, renamed.json()
    assert renamed.json()["name"] == "shop2"
    assert renamed.json()["fingerprint_sha256"] == created["fingerprint_sha256"]
    # A PATCH with a new leaf keeps the stored key: a leaf for another key is refused.
    other_cert, _ = self_signed(days=20)
    mismatch = alice.client.patch(f"/api/v1/certificates/{created['id']}/", {"cert_pem": other_cert},
                                  format="json")
    _coded(mismatch, 400, "key_mismatch")
    assert Certificate.objects.get(pk=created["id"]).fingerprint_sha256 == created["fingerprint_sha256"]


def test_reapproving_a_rejected_claim_runs_the_overlap_check(acme, globex, otto) -> None:
    HostnameClaimFactory(org=acme, hostname="shop.example.com")
    rejected = HostnameClaimFactory(org=globex, hostname="*.example.com", status=HostnameClaim.Status.REJECTED)
    response = otto.client.post(f"/api/v1/hostname-claims/{rejected.pk}/approve/")
    _coded(response, 409, "claim_overlap")
    rejected.refresh_from_db()
    assert rejected.status == HostnameClaim.Status.REJECTED


def test_deleting_a_claim_a_route_serves_is_a_409_in_use(acme, alice) -> None:
    claim = HostnameClaimFactory(org=acme, hostname="shop.acme.example")
    RouteFactory(lb=LoadBalancerFactory(org=acme), hosts=["shop.acme.example"])
    _coded(alice.client.delete(f"/api/v1/hostname-claims/{claim.pk}/"), 409, "in_use")
    assert HostnameClaim.objects.filter(pk=claim.pk).exists()
    unused = HostnameClaimFactory(org=acme, hostname="other.acme.example")
    assert alice.client.delete(f"/api/v1/hostname-claims/{unused.pk}/").status_code == 204


@pytest.mark.urls("tests.core.boom_urls")
@pytest.mark.parametrize("debug", [False, True])
def test_an_unhandled_exception_in_the_api_answers_the_json_error_shape(alice, settings, debug: bool) -> None:
    settings.DEBUG = debug
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.token}")
    body = _coded(client.get("/api/v1/boom/"), 500, "server_error")
    assert "kaboom" not in json.dumps(body)  # no internals in the answer


@pytest.mark.urls("tests.core.boom_urls")
def test_errors_outside_drf_views_answer_json_under_api_and_html_elsewhere(alice, settings) -> None:
    settings.DEBUG = False
    client = APIClient(raise_request_exception=False)
    _coded(client.get("/api/v1/plain-boom/"), 500, "server_error")
    _coded(client.get("/api/v1/no-such-endpoint/"), 404, "not_found")
    assert client.get("/no-such-page/")["Content-Type"].startswith("text/html")


def test_an_idempotency_key_freed_by_a_concurrent_failure_is_a_409_not_a_500(alice, monkeypatch) -> None:
    from django.db import IntegrityError

    from apps.core.models import IdempotencyRecord

    def lost_race(**kwargs):  # the key existed at insert time; its failed request deleted it since
        raise IntegrityError("duplicate key value violates unique constraint")

    monkeypatch.setattr(IdempotencyRecord.objects, "create", lost_race)
    response = alice.client.post("/api/v1/hostname-claims/", {"hostname": "race.acme.example"}, format="json",
                                 HTTP_IDEMPOTENCY_KEY="k-1")
    _coded(response, 409, "idempotency_in_progress")
