"""The OpenAPI document tells the truth: what exists, what each operation answers, which headers count."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

ERROR_REF = "#/components/schemas/Error"


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict:
    from rest_framework.test import APIClient

    with django_db_blocker.unblock():
        response = APIClient().get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def _op(schema: dict, method: str, path: str) -> dict:
    return schema["paths"][path][method]


def test_the_schema_says_how_to_authenticate(schema) -> None:
    """Bearer tokens and the session cookie, described by apps/accounts/schema.py (loaded with the API's URLs)."""
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {"type": "http", "scheme": "bearer",
                                     "description": "Org-scoped API token (spw_...)."}
    assert schemes["cookieAuth"] == {"type": "apiKey", "in": "cookie", "name": "sessionid"}
    assert {"bearerAuth": []} in _op(schema, "get", "/api/v1/load-balancers/")["security"]


def test_operations_that_always_answer_405_are_not_documented(schema) -> None:
    assert "post" not in schema["paths"]["/api/v1/capacity-runs/"]
    assert "post" not in schema["paths"]["/api/v1/job-runs/"]


@pytest.mark.parametrize("path", ["/api/v1/capacity-runs/", "/api/v1/job-runs/"])
def test_allow_offers_only_what_the_schema_documents(otto, schema, path) -> None:
    """OPTIONS and a refused POST name the same methods as the schema (schemathesis ST205): POST was
    routed to a handler that always answered 405 while Allow offered it."""
    documented = {m.upper() for m in schema["paths"][path] if m != "parameters"}
    allow = {m.strip() for m in otto.client.options(path)["Allow"].split(",")}
    assert allow - {"HEAD", "OPTIONS"} == documented == {"GET"}
    refused = otto.client.post(path, {}, format="json")
    assert refused.status_code == 405 and "POST" not in refused["Allow"]
    if "capacity" in path:  # and says where runs do start
        assert "/api/v1/capacity-tests/{id}/start/" in refused.json()["detail"]
    assert otto.client.post(path.replace("runs/", "runs/1/") + "cancel/").status_code != 405  # actions stay


@pytest.mark.parametrize(("method", "path", "code", "body"), [
    ("post", "/api/v1/capacity-tests/{id}/start/", "201", "CapacityRun"),
    ("post", "/api/v1/jobs/{id}/run/", "202", "JobRun"),
    ("post", "/api/v1/fleets/{id}/reconcile/", "202", "Queued"),
    ("post", "/api/v1/rollouts/{id}/rollback/", "201", "Rollout"),
    ("post", "/api/v1/static-ips/allocate/", "201", "StaticIP"),
    ("post", "/api/v1/cloud-applies/{id}/approve/", "202", "CloudApply"),
])
def test_actions_document_the_status_and_body_they_answer(schema, method, path, code, body) -> None:
    responses = _op(schema, method, path)["responses"]
    assert "200" not in responses, sorted(responses)
    assert responses[code]["content"]["application/json"]["schema"]["$ref"] == f"#/components/schemas/{body}"


def test_every_operation_documents_its_errors_with_the_error_body(schema) -> None:
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"code", "detail", "fields"}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if method == "parameters":
                continue
            expected = {"400", "401", "403"} | ({"404"} if "{" in path else set())
            if method in ("post", "put", "patch", "delete"):
                expected.add("409")
            missing = expected - set(op["responses"])
            assert not missing, (method, path, missing)
            for code in expected:
                assert op["responses"][code]["content"]["application/json"]["schema"]["$ref"] == ERROR_REF


def test_conditional_and_idempotent_writes_document_their_headers(schema) -> None:
    def headers(op: dict) -> set[str]:
        return {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}

    for method in ("put", "patch", "delete"):
        op = _op(schema, method, "/api/v1/load-balancers/{id}/")
        assert "If-Match" in headers(op) and "412" in op["responses"], method
    create = _op(schema, "post", "/api/v1/load-balancers/")
    assert "Idempotency-Key" in headers(create) and "422" in create["responses"]
    assert "Idempotency-Key" in headers(_op(schema, "post", "/api/v1/static-ips/allocate/"))
    assert "ETag" in _op(schema, "get", "/api/v1/load-balancers/{id}/")["responses"]["200"]["headers"]
    assert "If-Match" not in headers(_op(schema, "get", "/api/v1/load-balancers/{id}/"))


def test_request_bodies_are_json_only(schema) -> None:
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if isinstance(op, dict) and "requestBody" in op:
                assert set(op["requestBody"]["content"]) == {"application/json"}, (method, path)


@pytest.mark.parametrize(("path", "required", "codes", "body"), [
    ("/api/v1/load-balancers/{id}/applied/", {"revision"}, {"200", "202"}, "Applied"),
    ("/api/v1/jobs/preview/", {"schedule_type"}, {"200"}, "SchedulePreviewResult"),
])
def test_query_endpoints_document_required_parameters_and_their_answer(schema, path, required, codes, body) -> None:
    op = _op(schema, "get", path)
    query = {p["name"]: p for p in op["parameters"] if p["in"] == "query"}
    assert {name for name, p in query.items() if p.get("required")} == required
    for code in codes:
        assert op["responses"][code]["content"]["application/json"]["schema"]["$ref"] == f"#/components/schemas/{body}"


def test_what_the_web_server_and_own_preconditions_answer_is_documented(schema) -> None:
    # Found by make bench-fuzz: a long query string is refused by gunicorn (414, plain text) on any operation.
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if method in ("get", "post", "put", "patch", "delete"):
                assert "414" in op["responses"] and "content" not in op["responses"]["414"], (method, path)
    apply = _op(schema, "post", "/api/v1/apply/")["responses"]
    assert {"412", "428"} <= set(apply)  # If-Match stale / missing
    assert set(_op(schema, "get", "/api/v1/export/")["responses"]["200"]["content"]) == {
        "application/json", "application/yaml"}


def test_nested_field_errors_answer_the_documented_error_body(alice, acme) -> None:
    """A route's `targets` item naming a missing pool: DRF's nested errors ({"targets": [{"pool": [...]}]})
    are what the Error schema says (make bench-fuzz found them refused by the old `fields` schema)."""
    from apps.balancers.models import LoadBalancer
    from tests.openapi_check import assert_matches_schema

    lb = LoadBalancer.objects.create(org=acme, name="web")
    response = alice.client.post("/api/v1/routes/", {"lb": lb.pk, "hosts": ["acme.example.com"], "path": "/",
                                                     "targets": [{"pool": 999999, "weight": 1}]}, format="json")
    assert response.status_code == 400, response.content
    assert isinstance(response.json()["fields"]["targets"], list | dict)
    assert_matches_schema("post", "/api/v1/routes/", response)


def test_an_export_format_outside_the_list_is_a_400(alice) -> None:
    response = alice.client.get("/api/v1/export/", {"output": "xml"})
    assert response.status_code == 400 and response.json()["fields"] == {"output": ["Not json or yaml."]}
    assert alice.client.get("/api/v1/export/", {"output": "yaml"})["Content-Type"] == "application/yaml"


def test_the_yaml_export_is_documented_as_the_same_document(schema) -> None:
    # make bench-fuzz: schemathesis reads the YAML body and validated it against `type: string` before.
    content = _op(schema, "get", "/api/v1/export/")["responses"]["200"]["content"]
    assert content["application/yaml"]["schema"] == content["application/json"]["schema"]


def test_every_schema_and_operation_has_a_description_for_integrators(schema) -> None:
    """62 schemas carried a developer note naming a test file, 36 operations the mixin's "Plain objects: ...",
    51 had none."""
    components = schema["components"]["schemas"]
    operations = [(f"{m} {p}", op) for p, ops in schema["paths"].items() for m, op in ops.items()
                  if isinstance(op, dict) and "operationId" in op]
    for where, text in [*((n, c.get("description")) for n, c in components.items()),
                        *((w, op.get("description")) for w, op in operations)]:
        assert text and text.strip(), f"{where} has no description"
        assert "tests/" not in text and "Plain objects" not in text and "Base of" not in text, (where, text)
