"""Cloud targets and applies through the API: DB -> CloudLB -> synthesized JSON, limits refused before
synthesis, credentials reference never returned, tenancy."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from apps.audit.models import AuditEvent
from apps.cloud import selectors, services
from apps.cloud.models import CloudApply
from deploy.model import CloudRoute, RouteTarget
from tests.cloud.cloudkit import demo_aws_lb, demo_gcp_lb, resources
from tests.cloud.dbdemo import build_db_lb, normalized

pytestmark = pytest.mark.django_db

SECRET_REF = "SPW_TEST_CLOUD_CREDS_REF"


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path


@pytest.mark.parametrize("demo", [demo_gcp_lb, demo_aws_lb], ids=["gcp", "aws"])
def test_the_database_lb_reads_back_as_the_cloud_model_it_describes(alice, demo) -> None:
    model = demo()
    lb, target = build_db_lb(alice.org, model)
    assert normalized(selectors.cloud_lb(lb, target)) == normalized(model)


def test_db_built_gcp_lb_synthesizes_routes_capacities_and_static_ip(alice, cdktf_worker, var_dir) -> None:
    model = demo_gcp_lb()
    lb, target = build_db_lb(alice.org, model)
    apply = CloudApply.objects.create(target=target, lb=lb)
    doc = services.synthesize_apply(apply)

    assert resources(doc, "google_compute_global_address")["demo-ip"]["address"] == "203.0.113.10"
    backends = resources(doc, "google_compute_backend_service")
    web = backends["demo-web"]["backend"]
    scalers = sorted(b["capacity_scaler"] for b in web)
    rates = sorted(b["max_rate_per_endpoint"] for b in web)
    assert scalers == [0.5, 1.0] and rates == [80.0, 120.0]
    assert all(b["balancing_mode"] == "RATE" for b in web)
    url_map = resources(doc, "google_compute_url_map")["demo-80"]
    priorities = sorted({rule["priority"] for m in url_map["path_matcher"] for rule in m["route_rules"]})
    assert priorities == [10, 20, 30, 40]
    on_disk = json.loads((var_dir / "cloud" / target.name / lb.name / "main.tf.json").read_text())
    assert on_disk["resource"] == doc["resource"]


def test_db_built_aws_lb_synthesizes_rules_target_groups_and_accelerator(alice, cdktf_worker, var_dir) -> None:
    lb, target = build_db_lb(alice.org, demo_aws_lb())
    doc = services.synthesize_apply(CloudApply.objects.create(target=target, lb=lb))

    rules = doc["resource"]["aws_lb_listener_rule"].values()
    assert sorted({r["priority"] for r in rules}) == [10, 20, 30, 40]
    groups = resources(doc, "aws_lb_target_group")
    assert {g["health_check"]["matcher"] for g in groups.values() if g["health_check"]["path"] == "/ready"} \
        >= {"204"}
    assert "aws_globalaccelerator_accelerator" in doc["resource"]
    # Drained member 10.0.0.3 (admin_state drain in the database) is not a target.
    targets = {a["target_id"] for a in doc["resource"]["aws_lb_target_group_attachment"].values()}
    assert "10.0.0.1" in targets and "10.0.0.3" not in targets


def test_more_rules_than_an_alb_allows_is_refused_before_synthesis(alice, var_dir, monkeypatch) -> None:
    many = tuple(CloudRoute(100 + i, (f"h{i}.example.com",), "prefix", "/", (RouteTarget("web", 100),))
                 for i in range(101))
    lb, target = build_db_lb(alice.org, replace(demo_aws_lb(), routes=many))

    import deploy.synth

    def no_synthesis(*args, **kwargs):
        raise AssertionError("synthesis must not start for a model over a provider limit")

    monkeypatch.setattr(deploy.synth, "synthesize", no_synthesis)
    response = alice.client.post("/api/v1/cloud-applies/", {"target": target.pk, "lb": lb.pk}, format="json")
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "provider_limit"
    assert "at most 100 rules" in body["detail"] or "100" in body["detail"]
    assert not CloudApply.objects.exists()

    # A run created before the model grew is refused by the worker, also before synthesis.
    small_lb, small_target = build_db_lb(alice.org, replace(demo_aws_lb(), routes=many[:3], static_ip="198.51.100.8"),
                                         target_name="aws-2", lb_name="demo2")
    apply = CloudApply.objects.create(target=small_target, lb=small_lb)
    Route = type(small_lb.routes.first())
    for i in range(3, 101):
        route = Route.objects.create(lb=small_lb, org=alice.org, hosts=[f"x{i}.example.com"], path="/",
                                     priority=1000 + i)
        route.targets.create(pool=small_lb.pools.get(name="web"), weight=100)
    assert services.run_plan(apply.pk) == "failed"
    apply.refresh_from_db()
    assert "100" in apply.error and "rules" in apply.error
    assert apply.synth_json is None
    assert not (var_dir / "cloud" / small_target.name / small_lb.name / "main.tf.json").exists()


def test_provider_mismatch_is_refused(alice) -> None:
    lb, target = build_db_lb(alice.org, demo_gcp_lb())
    lb.kind = "aws"
    lb.save()
    response = alice.client.post("/api/v1/cloud-applies/", {"target": target.pk, "lb": lb.pk}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "provider_mismatch"


def test_creating_an_apply_queues_a_plan(alice, django_capture_on_commit_callbacks, monkeypatch) -> None:
    lb, target = build_db_lb(alice.org, demo_gcp_lb())
    sent = []
    monkeypatch.setattr(services, "_enqueue", lambda name, pk: sent.append((name, pk)))
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post("/api/v1/cloud-applies/", {"target": target.pk, "lb": lb.pk}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "pending"
    assert sent == [("cloud.plan_task", response.json()["id"])]


def test_the_credentials_reference_is_never_returned_or_audited(alice, otto, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_REF, "s3cr3t-value-not-for-logs")
    offered = otto.client.post("/api/v1/cloud-credentials/", {
        "name": "acme-gcp", "provider": "gcp", "credentials_ref": SECRET_REF, "orgs": [alice.org.pk]}, format="json")
    assert offered.status_code == 201, offered.content
    payload = {"name": "prod-gcp", "provider": "gcp", "project_or_account": "spillway-demo",
               "regions": ["us-central1"], "networks": {"us-central1": {"network": "vpc", "zone": "us-central1-b"}},
               "credential": offered.json()["id"]}
    created = alice.client.post("/api/v1/cloud-targets/", payload, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["has_credentials"] is True
    pk = created.json()["id"]
    patched = alice.client.patch(f"/api/v1/cloud-targets/{pk}/", {"project_or_account": "other"}, format="json")
    assert patched.status_code == 200
    listed = alice.client.get("/api/v1/cloud-targets/")
    detail = alice.client.get(f"/api/v1/cloud-targets/{pk}/")
    audit = json.dumps(list(AuditEvent.objects.values("before", "after", "object_repr")))
    for text in (offered.content.decode(), created.content.decode(), patched.content.decode(),
                 listed.content.decode(), detail.content.decode(), audit,
                 otto.client.get("/api/v1/cloud-credentials/").content.decode()):
        assert SECRET_REF not in text
        assert "s3cr3t" not in text


def test_a_pasted_secret_is_refused_as_a_credentials_reference(otto) -> None:
    response = otto.client.post("/api/v1/cloud-targets/", {
        "name": "bad", "provider": "aws", "project_or_account": "1", "regions": ["us-east-1"],
        "credentials_ref": '{"type": "service_account", "private_key": "..."}'}, format="json")
    assert response.status_code == 400


def test_outsider_sees_404_and_viewer_gets_403(alice, vera, charlie) -> None:
    lb, target = build_db_lb(alice.org, demo_gcp_lb())
    apply = CloudApply.objects.create(target=target, lb=lb, status=CloudApply.Status.AWAITING_APPROVAL,
                                      synth_json={"resource": {}})
    assert charlie.client.get(f"/api/v1/cloud-targets/{target.pk}/").status_code == 404
    assert charlie.client.get(f"/api/v1/cloud-applies/{apply.pk}/").status_code == 404
    assert charlie.client.get(f"/api/v1/cloud-applies/{apply.pk}/synth/").status_code == 404
    assert charlie.client.post(f"/api/v1/cloud-applies/{apply.pk}/approve/").status_code in (403, 404)
    listed = charlie.client.get("/api/v1/cloud-applies/").json()
    assert (listed["results"] if isinstance(listed, dict) else listed) == []

    assert vera.client.get(f"/api/v1/cloud-applies/{apply.pk}/").status_code == 200
    assert vera.client.post(f"/api/v1/cloud-applies/{apply.pk}/approve/").status_code == 403
    assert vera.client.post("/api/v1/cloud-applies/", {"target": target.pk, "lb": lb.pk},
                            format="json").status_code == 403
    assert vera.client.patch(f"/api/v1/cloud-targets/{target.pk}/", {"name": "x"}, format="json").status_code == 403
    apply.refresh_from_db()
    assert apply.status == CloudApply.Status.AWAITING_APPROVAL and not apply.approved_by


def test_the_synthesized_json_downloads(alice) -> None:
    lb, target = build_db_lb(alice.org, demo_gcp_lb())
    apply = CloudApply.objects.create(target=target, lb=lb, synth_json={"resource": {"x": {}}})
    response = alice.client.get(f"/api/v1/cloud-applies/{apply.pk}/synth/")
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    assert json.loads(response.content) == {"resource": {"x": {}}}


@pytest.mark.parametrize("field,value", [("credentials_ref", "DATABASE_URL"), ("credentials_ref", "/etc/shadow"),
                                         ("state_backend", {"http": {"address": "http://169.254.169.254/"}})])
def test_a_tenant_cannot_point_a_target_at_the_workers_env_disk_or_a_backend(alice, field, value) -> None:
    """Hole: credentials_ref accepted any env var or path of the worker (and apply_unavailable told which
    exist); state_backend any URL. Now only operators set them; tenants pick an offered credential."""
    response = alice.client.post("/api/v1/cloud-targets/", {
        "name": "t", "provider": "gcp", "project_or_account": "p", "regions": ["us-east1"], field: value},
        format="json")
    assert response.status_code == 400 and response.json()["code"] == "operator_only"
    assert list(response.json()["fields"]) == [field]


def test_a_tenant_can_use_only_credentials_offered_to_it(alice, charlie, otto) -> None:
    base = {"provider": "gcp", "project_or_account": "p", "regions": ["us-east1"]}
    globex_only = otto.client.post("/api/v1/cloud-credentials/", {
        "name": "globex-gcp", "provider": "gcp", "credentials_ref": "GLOBEX_GCP", "orgs": [charlie.org.pk],
        "state_backend": {"gcs": {"bucket": "globex-state"}}}, format="json").json()
    shared = otto.client.post("/api/v1/cloud-credentials/", {
        "name": "everyone-gcp", "provider": "gcp", "credentials_ref": "SHARED_GCP", "for_all_orgs": True},
        format="json").json()

    foreign = alice.client.post("/api/v1/cloud-targets/", {"name": "a", "credential": globex_only["id"], **base},
                                format="json")
    missing = alice.client.post("/api/v1/cloud-targets/", {"name": "a", "credential": 987654, **base}, format="json")
    allowed = alice.client.post("/api/v1/cloud-targets/", {"name": "a", "credential": shared["id"], **base},
                                format="json")

    assert foreign.status_code == missing.status_code == 400
    assert foreign.json()["code"] == missing.json()["code"] == "does_not_exist"
    assert allowed.status_code == 201, allowed.content
    assert {c["name"] for c in alice.client.get("/api/v1/cloud-credentials/").json()["results"]} == {"everyone-gcp"}
    assert "credentials_ref" not in alice.client.get("/api/v1/cloud-credentials/").json()["results"][0]
    own = alice.client.post("/api/v1/cloud-credentials/", {"name": "x", "provider": "gcp", "credentials_ref": "HOME"},
                            format="json")
    assert own.status_code == 403


def test_a_duplicate_credential_name_is_a_409_naming_the_field(otto, alice) -> None:
    body = {"name": "shared-gcp", "provider": "gcp", "credentials_ref": "SHARED_GCP", "for_all_orgs": True}
    assert otto.client.post("/api/v1/cloud-credentials/", body, format="json").status_code == 201
    again = otto.client.post("/api/v1/cloud-credentials/", {**body, "credentials_ref": "OTHER"}, format="json")
    assert again.status_code == 409, again.content
    assert again.json()["code"] == "conflict" and list(again.json()["fields"]) == ["name"]
    assert "SHARED_GCP" not in again.content.decode() and "OTHER" not in again.content.decode()
    other = otto.client.post("/api/v1/cloud-credentials/", {**body, "name": "other-gcp"}, format="json").json()
    renamed = otto.client.patch(f"/api/v1/cloud-credentials/{other['id']}/", {"name": "shared-gcp"}, format="json")
    assert renamed.status_code == 409 and list(renamed.json()["fields"]) == ["name"]
    # A customer never gets as far as the database: credentials are the operator's.
    assert alice.client.post("/api/v1/cloud-credentials/", {**body, "name": "x"}, format="json").status_code == 403
