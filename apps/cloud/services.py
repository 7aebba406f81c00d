"""Cloud targets and applies: limits before synthesis, synthesis in the worker, plan, approval, apply.

Status flow of a CloudApply: pending -> synthesized -> planning -> awaiting_approval (plan has changes) or
planned (no change) -> applying -> applied; any step may end in failed. Only an approved plan is applied,
and only the saved plan file of that run, so what was reviewed is what is applied.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.balancers.models import LoadBalancer
from apps.cloud import terraform_cli
from apps.cloud.models import CloudApply, CloudCredential, CloudTarget
from apps.cloud.selectors import cloud_lb
from apps.core.errors import Conflict, DomainError, save_or_conflict
from deploy.limits import check_limits

log = logging.getLogger(__name__)

PLAN_FILE = "plan.tfplan"
MAIN_FILE = "main.tf.json"
# Only these may be (re)planned: a running or applied run keeps its plan.
PLANNABLE = {CloudApply.Status.PENDING, CloudApply.Status.SYNTHESIZED}
APPROVABLE = {CloudApply.Status.AWAITING_APPROVAL}


# --- targets --------------------------------------------------------------------------------------------

def save_target(*, principal: Principal, target: CloudTarget, data: dict[str, Any]) -> CloudTarget:
    with transaction.atomic():
        creating = target.pk is None
        before = None if creating else audit_snapshot(target)
        if creating and not principal.is_operator:
            data = {**data, "org": principal.org}
        elif creating:
            data = {"org": principal.org, **data}
        for field, value in data.items():
            setattr(target, field, value)
        save_or_conflict(target, Conflict("conflict", "A cloud target with this name already exists.", field="name"))
        audit_record(principal=principal, org=target.org, action=f"cloudtarget.{'create' if creating else 'update'}",
                     obj=target, before=before, after=audit_snapshot(target))
    return target


def delete_target(*, principal: Principal, target: CloudTarget) -> None:
    with transaction.atomic():
        audit_record(principal=principal, org=target.org, action="cloudtarget.delete", obj=target,
                     before=audit_snapshot(target))
        target.delete()


def save_credential(*, principal: Principal, credential: CloudCredential, data: dict[str, Any]) -> CloudCredential:
    data = dict(data)
    orgs = data.pop("orgs", None)
    with transaction.atomic():
        creating = credential.pk is None
        before = None if creating else audit_snapshot(credential)
        for field, value in data.items():
            setattr(credential, field, value)
        credential.save()  # a duplicate name: the API's exception handler answers 409 naming `name`
        if orgs is not None:
            credential.orgs.set(orgs)
        audit_record(principal=principal, org=None,
                     action=f"cloudcredential.{'create' if creating else 'update'}", obj=credential,
                     before=before, after=audit_snapshot(credential))
    return credential


def delete_credential(*, principal: Principal, credential: CloudCredential) -> None:
    with transaction.atomic():
        if credential.targets.exists():
            raise Conflict("in_use", "Cloud targets still use this credential; move them first.")
        audit_record(principal=principal, org=None, action="cloudcredential.delete", obj=credential,
                     before=audit_snapshot(credential))
        credential.delete()


def apply_unavailable_reason(target: CloudTarget) -> str | None:
    return terraform_cli.apply_unavailable_reason(target.effective_credentials_ref)


# --- applies --------------------------------------------------------------------------------------------

def check_provider_limits(lb: LoadBalancer, target: CloudTarget) -> None:
    """Refuse, before any synthesis, a model the provider would refuse; the message names every limit."""
    model = cloud_lb(lb, target)
    violations = check_limits(model)
    if violations:
        raise DomainError("provider_limit", " ".join(v.message for v in violations), status=422)


def create_apply(*, principal: Principal, target: CloudTarget, lb: LoadBalancer,
                 drift_check: bool = False) -> CloudApply:
    if lb.kind != target.provider:
        raise DomainError("provider_mismatch", f"Load balancer {lb.name} is of kind {lb.kind}; target "
                          f"{target.name} is {target.provider}.", field="lb")
    if lb.org_id != target.org_id:
        raise DomainError("org_mismatch", "The load balancer and the cloud target belong to different "
                          "organizations.", field="target")
    check_provider_limits(lb, target)
    with transaction.atomic():
        apply = CloudApply.objects.create(target=target, lb=lb, lb_revision=lb.revision, drift_check=drift_check,
                                          created_by=principal.actor if principal else "system")
        audit_record(principal=principal, org=target.org, action="cloudapply.create", obj=apply,
                     after={"target": target.pk, "lb": lb.pk, "lb_revision": lb.revision})
        transaction.on_commit(lambda: _enqueue("cloud.plan_task", apply.pk))
    return apply


def synthesize_apply(apply: CloudApply) -> dict[str, Any]:
    """Synthesize the apply's LB (limits first) and write main.tf.json to the target's working dir."""
    from deploy.limits import LimitError
    from deploy.synth import synthesize

    target, lb = apply.target, apply.lb
    model = cloud_lb(lb, target)
    violations = check_limits(model)
    if violations:
        raise DomainError("provider_limit", " ".join(v.message for v in violations), status=422)
    work = terraform_cli.workdir(target.name, lb.name)
    try:
        doc = synthesize(model, work / "cdktf.out")
    except LimitError as exc:  # same check inside synthesize; kept for a model changed in between
        raise DomainError("provider_limit", str(exc), status=422) from exc
    if target.effective_state_backend:
        # {"gcs": {"bucket": ...}} or {"s3": {...}}: replaces cdktf's local backend.
        doc.setdefault("terraform", {})["backend"] = target.effective_state_backend
    else:
        # cdktf writes a local backend path relative to its own stack dir; state lives next to main.tf.json.
        doc.setdefault("terraform", {})["backend"] = {"local": {"path": "terraform.tfstate"}}
    text = terraform_cli.scrub(json.dumps(doc, indent=2, sort_keys=True),
                               terraform_cli.secrets_of(target.effective_credentials_ref))
    (work / MAIN_FILE).write_text(text)
    return json.loads(text)


def approve(*, principal: Principal, apply: CloudApply) -> CloudApply:
    if not principal.can_deploy:
        raise DomainError("forbidden", "Applying needs an editor with the deploy scope.", status=403)
    with transaction.atomic():
        locked = CloudApply.objects.select_for_update().get(pk=apply.pk)
        if locked.status not in APPROVABLE:
            raise Conflict("not_approvable", f"This run is {locked.status}; only a plan awaiting approval "
                           "can be approved.")
        reason = apply_unavailable_reason(locked.target)
        if reason:
            raise Conflict("apply_unavailable", reason)
        locked.status = CloudApply.Status.APPLYING
        locked.approved_by, locked.approved_at = principal.actor, timezone.now()
        locked.save(update_fields=["status", "approved_by", "approved_at", "updated_at"])
        audit_record(principal=principal, org=locked.target.org, action="cloudapply.approve", obj=locked)
        transaction.on_commit(lambda: _enqueue("cloud.apply_task", locked.pk))
    return locked


def run_plan(apply_id: int) -> str:
    """Synthesize and plan one run; the run ends planned, awaiting_approval or failed. Idempotent."""
    with transaction.atomic():
        apply = CloudApply.objects.select_for_update().select_related("target", "lb").filter(pk=apply_id).first()
        if apply is None or apply.status not in PLANNABLE:
            return apply.status if apply else "missing"
        apply.status = CloudApply.Status.PLANNING
        apply.save(update_fields=["status", "updated_at"])
    target = apply.target
    try:
        apply.synth_json = synthesize_apply(apply)
    except DomainError as exc:
        return _fail(apply, exc.detail)
    except Exception as exc:  # cdktf/jsii failures arrive as many types; the run must still end
        log.exception("cloud synthesis failed for apply %s", apply_id)
        secrets = terraform_cli.secrets_of(target.effective_credentials_ref)
        return _fail(apply, f"Synthesis failed: {terraform_cli.scrub(str(exc), secrets)}")
    apply.save(update_fields=["synth_json", "updated_at"])
    reason = apply_unavailable_reason(target)
    if reason:
        return _fail(apply, f"Plan unavailable: {reason} The synthesized JSON can be downloaded.")
    binary = terraform_cli.terraform_bin()
    assert binary is not None
    work = terraform_cli.workdir(target.name, apply.lb.name)
    common = {"cwd": work, "provider": target.provider, "ref": target.effective_credentials_ref}
    init = terraform_cli.run(binary, ["init", "-input=false", "-no-color"], timeout_s=terraform_cli.INIT_TIMEOUT_S,
                             **common)
    apply.plan_output = _section(init)
    if init.returncode != 0:
        return _fail(apply, f"terraform init failed (exit {init.returncode}): {_last_error(init.output)}")
    plan = terraform_cli.run(binary, ["plan", "-input=false", "-no-color", "-detailed-exitcode", f"-out={PLAN_FILE}"],
                             timeout_s=terraform_cli.PLAN_TIMEOUT_S, **common)
    apply.plan_output += _section(plan)
    if plan.returncode not in (0, 2):
        return _fail(apply, f"terraform plan failed (exit {plan.returncode}): {_last_error(plan.output)}")
    apply.diff = terraform_cli.plan_diff(plan.output)
    apply.status = CloudApply.Status.AWAITING_APPROVAL if plan.returncode == 2 else CloudApply.Status.PLANNED
    apply.finished_at = timezone.now() if apply.status == CloudApply.Status.PLANNED else None
    apply.save(update_fields=["plan_output", "diff", "status", "finished_at", "updated_at"])
    return apply.status


def run_apply(apply_id: int) -> str:
    """Apply the approved saved plan of one run. Idempotent: only a run in `applying` is worked on."""
    apply = CloudApply.objects.select_related("target", "lb").filter(pk=apply_id).first()
    if apply is None or apply.status != CloudApply.Status.APPLYING or not apply.approved_by:
        return apply.status if apply else "missing"
    target = apply.target
    reason = apply_unavailable_reason(target)
    if reason:
        return _fail(apply, f"Apply unavailable: {reason}")
    work = terraform_cli.workdir(target.name, apply.lb.name)
    if not (work / PLAN_FILE).is_file():
        return _fail(apply, "The saved plan of this run is gone from the working directory; plan again.")
    binary = terraform_cli.terraform_bin()
    assert binary is not None
    result = terraform_cli.run(binary, ["apply", "-input=false", "-no-color", "-auto-approve", PLAN_FILE],
                               cwd=work, provider=target.provider, ref=target.effective_credentials_ref,
                               timeout_s=terraform_cli.APPLY_TIMEOUT_S)
    apply.apply_output = _section(result)
    if result.returncode != 0:
        return _fail(apply, f"terraform apply failed (exit {result.returncode}): {_last_error(result.output)}")
    apply.status, apply.finished_at = CloudApply.Status.APPLIED, timezone.now()
    apply.save(update_fields=["apply_output", "status", "finished_at", "updated_at"])
    return apply.status


def _fail(apply: CloudApply, error: str) -> str:
    apply.status, apply.error, apply.finished_at = CloudApply.Status.FAILED, error[:10_000], timezone.now()
    apply.save()
    return apply.status


def _section(result: terraform_cli.RunResult) -> str:
    return f"$ {' '.join(result.argv)}\n{result.output}\n[exit {result.returncode}]\n"


def _last_error(output: str) -> str:
    """The first `Error:` paragraph terraform printed, else the output's last lines."""
    lines = output.strip().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("Error:") or line.strip().startswith("│ Error:"):
            return " ".join(x.strip(" │╷╵") for x in lines[i:i + 6] if x.strip(" │╷╵"))
    return " ".join(lines[-3:])


def _enqueue(name: str, apply_id: int) -> None:
    from celery import current_app

    current_app.send_task(name, args=[apply_id])


def plan_drift() -> int:
    """Start a drift plan for every LB whose last run on its target was applied; returns how many started.

    A drift plan that ends awaiting_approval means the cloud differs from the model (someone changed it
    outside Spillway, or the model changed since); it waits for the same approval as any other plan.
    """
    started = 0
    latest: dict[tuple[int, int], CloudApply] = {}
    for apply in CloudApply.objects.select_related("target", "lb").order_by("created_at", "pk"):
        latest[(apply.target_id, apply.lb_id)] = apply
    for apply in latest.values():
        if apply.status != CloudApply.Status.APPLIED or apply_unavailable_reason(apply.target):
            continue
        try:
            create_apply(principal=None, target=apply.target, lb=apply.lb, drift_check=True)  # type: ignore[arg-type]
        except DomainError as exc:
            log.warning("drift plan of %s skipped: %s", apply.lb.name, exc.code)
            continue
        started += 1
    return started
