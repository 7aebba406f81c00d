"""The plan/apply runner against the real `terraform` binary of this machine (offline: `init` cannot reach
the registry, so a real run must end failed with that error and nothing applied). Celery is eager here: the
task functions are called directly; the terraform subprocess is the real part."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from apps.cloud import services, tasks, terraform_cli
from apps.cloud.models import CloudApply
from tests.cloud.cloudkit import demo_gcp_lb
from tests.cloud.dbdemo import build_db_lb
from tests.personas import web

pytestmark = pytest.mark.django_db

REF = "SPW_TEST_RUNNER_CREDS"
SECRET = "s3cr3t-runner-value-77"
TERRAFORM = shutil.which("terraform") or shutil.which("tofu")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="no terraform/tofu binary on this machine")


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.TERRAFORM_BIN = ""
    return tmp_path



@needs_terraform
def test_offline_init_fails_the_run_with_its_error_and_nothing_is_applied(alice, cdktf_worker, var_dir,
                                                                           monkeypatch) -> None:
    monkeypatch.setenv(REF, SECRET)
    lb, target = build_db_lb(alice.org, demo_gcp_lb(), credentials_ref=REF)
    assert services.apply_unavailable_reason(target) is None
    apply = services.create_apply(principal=alice_principal(alice), target=target, lb=lb)

    assert tasks.plan_task(apply.pk) == "failed"
    apply.refresh_from_db()
    assert apply.status == CloudApply.Status.FAILED
    assert apply.error.startswith("terraform init failed")
    # terraform's own words for the missing network, as shown to the user.
    assert "registry.terraform.io" in apply.error or "Failed to query" in apply.error
    assert "$ terraform init" in apply.plan_output or "$ tofu init" in apply.plan_output
    assert apply.synth_json is not None and apply.apply_output == "" and apply.approved_by == ""
    assert not (var_dir / "cloud" / target.name / lb.name / services.PLAN_FILE).exists()

    # A failed plan cannot be approved, and re-running the task is a no-op.
    refused = alice.client.post(f"/api/v1/cloud-applies/{apply.pk}/approve/")
    assert refused.status_code == 409 and refused.json()["code"] == "not_approvable"
    assert tasks.apply_task(apply.pk) == "failed"
    assert tasks.plan_task(apply.pk) == "failed"
    apply.refresh_from_db()
    assert apply.status == CloudApply.Status.FAILED

    page = web(alice).get(f"/cloud/applies/{apply.pk}/").content.decode()
    assert "terraform init failed" in page
    stored = " ".join([json.dumps(apply.synth_json), apply.plan_output, apply.error, apply.diff,
                       alice.client.get(f"/api/v1/cloud-applies/{apply.pk}/").content.decode(), page,
                       (var_dir / "cloud" / target.name / lb.name / "main.tf.json").read_text()])
    assert REF not in stored and SECRET not in stored


def alice_principal(persona):
    from apps.accounts.principal import Principal

    return Principal(org=persona.org, role="owner", user_id=persona.user.pk)


@needs_terraform
def test_captured_terraform_output_is_scrubbed_of_the_reference_and_its_value(tmp_path, monkeypatch,
                                                                               settings) -> None:
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv(REF, SECRET)
    # A config with no provider plans offline; its output echoes both strings, as a provider error might.
    (tmp_path / "main.tf.json").write_text(json.dumps(
        {"output": {"leak": {"value": f"ref={REF} value={SECRET}"}}}))
    result = terraform_cli.run(TERRAFORM, ["plan", "-input=false", "-no-color"], cwd=tmp_path, provider="gcp",
                        ref=REF, timeout_s=60)
    assert result.returncode == 0, result.output
    assert "Changes to Outputs" in result.output
    assert terraform_cli.SCRUBBED in result.output
    assert REF not in result.output and SECRET not in result.output


def test_the_reference_resolves_into_the_providers_standard_variable(tmp_path, monkeypatch) -> None:
    creds = tmp_path / "gcp.json"
    creds.write_text("{}")
    env = terraform_cli.credentials_env("gcp", str(creds))
    assert env == {"GOOGLE_APPLICATION_CREDENTIALS": str(creds)}
    monkeypatch.setenv(REF, SECRET)
    assert terraform_cli.credentials_env("gcp", REF) == {"GOOGLE_CREDENTIALS": SECRET}
    assert terraform_cli.credentials_env("aws", str(creds)) == {"AWS_SHARED_CREDENTIALS_FILE": str(creds)}


def test_without_a_binary_the_page_says_why_and_offers_the_json(alice, var_dir, monkeypatch) -> None:
    monkeypatch.setenv(REF, SECRET)
    monkeypatch.setenv("PATH", str(var_dir))  # neither terraform nor tofu on PATH
    lb, target = build_db_lb(alice.org, demo_gcp_lb(), credentials_ref=REF)
    apply = CloudApply.objects.create(target=target, lb=lb, status=CloudApply.Status.SYNTHESIZED,
                                      synth_json={"resource": {"google_compute_global_address": {}}})
    reason = "No terraform binary: TERRAFORM_BIN is empty and neither terraform nor tofu is on PATH."
    assert services.apply_unavailable_reason(target) == reason
    page = web(alice).get(f"/cloud/applies/{apply.pk}/").content.decode()
    assert reason in page
    assert f"/cloud/applies/{apply.pk}/main.tf.json" in page
    download = web(alice).get(f"/cloud/applies/{apply.pk}/main.tf.json")
    assert download.status_code == 200 and "google_compute_global_address" in download.content.decode()
    listing = web(alice).get("/cloud/").content.decode()
    assert reason in listing and REF not in listing and SECRET not in listing


def test_without_credentials_the_reason_never_names_the_reference(alice, var_dir, monkeypatch) -> None:
    monkeypatch.delenv(REF, raising=False)
    _lb, target = build_db_lb(alice.org, demo_gcp_lb(), credentials_ref=REF)
    reason = services.apply_unavailable_reason(target)
    if TERRAFORM is None:
        pytest.skip("no terraform binary: the binary reason comes first")
    assert reason is not None and reason.startswith("No credentials:") and REF not in reason
    target.credentials_ref = ""
    assert services.apply_unavailable_reason(target) == "No credentials: the cloud target has no credentials reference."
    target.credentials_ref = str(Path(var_dir) / "missing.json")
    assert "does not exist" in services.apply_unavailable_reason(target)


def test_the_ui_is_scoped_to_the_org(alice, charlie) -> None:
    lb, target = build_db_lb(alice.org, demo_gcp_lb())
    apply = CloudApply.objects.create(target=target, lb=lb, synth_json={})
    assert web(charlie).get(f"/cloud/applies/{apply.pk}/").status_code == 404
    assert web(charlie).get(f"/cloud/applies/{apply.pk}/main.tf.json").status_code == 404
    assert target.name not in web(charlie).get("/cloud/").content.decode()


def test_the_run_page_shows_progress_polls_while_it_moves_and_reloads_when_it_stops(alice, charlie) -> None:
    lb, target = build_db_lb(alice.org, demo_gcp_lb())
    apply = services.create_apply(principal=alice_principal(alice), target=target, lb=lb)
    CloudApply.objects.filter(pk=apply.pk).update(status=CloudApply.Status.PLANNING)
    client = web(alice)
    status_url = f"/cloud/applies/{apply.pk}/status/"

    page = client.get(f"/cloud/applies/{apply.pk}/").content.decode()
    assert 'value="3"' in page and "terraform plan running" in page
    assert f'hx-get="{status_url}?was=planning"' in page and 'hx-trigger="every 2s"' in page

    still = client.get(status_url, {"was": "planning"})
    assert still.status_code == 200 and "HX-Refresh" not in still.headers

    CloudApply.objects.filter(pk=apply.pk).update(status=CloudApply.Status.AWAITING_APPROVAL)
    stopped = client.get(status_url, {"was": "planning"})
    body = stopped.content.decode()
    assert stopped.headers["HX-Refresh"] == "true", "the page reloads to show the plan it produced"
    assert "waiting for a deployer" in body and "hx-trigger" not in body and 'value="4"' in body

    CloudApply.objects.filter(pk=apply.pk).update(status=CloudApply.Status.FAILED, approved_by="user:1")
    assert 'value="5"' in client.get(status_url).content.decode(), "failed while applying: bar stays there"
    assert web(charlie).get(status_url).status_code == 404
