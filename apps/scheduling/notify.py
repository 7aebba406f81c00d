"""Failure notification: the signed webhook for a run that failed or timed out."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from apps.core import crypto, webhooks
from apps.scheduling import registry
from apps.scheduling.models import JobRun

log = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0
EVENT = "job_run.failed"


@dataclass(frozen=True)
class Outcome:
    status: str
    retry: bool = False


def webhook_payload(run: JobRun) -> dict[str, Any]:
    job = run.job
    return {
        "event": EVENT,
        "sent_at": timezone.now().isoformat(),
        "org": job.org.slug,
        "job": {"id": job.pk, "name": job.name, "kind": job.kind},
        "run": {
            "id": run.pk, "scheduled_for": run.scheduled_for.isoformat(), "trigger": run.trigger,
            "status": run.status, "attempt": run.attempt, "max_attempts": run.max_attempts,
            "started_at": run.started_at.isoformat() if run.started_at else None,
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "duration_ms": run.duration_ms, "error": run.error[:2000], "worker": run.worker,
        },
    }


def webhook_send(run_id: int) -> Outcome:
    """POST the signed payload once; say whether it is worth retrying. Records the result on the run."""
    run = JobRun.objects.select_related("job", "job__org").filter(pk=run_id).first()
    if run is None or not run.job.webhook_url:
        return Outcome("no_webhook")
    job = run.job
    try:
        secret = crypto.decrypt(job.webhook_secret_encrypted)
        reply = webhooks.deliver(job.webhook_url, secret=secret, event=EVENT, payload=webhook_payload(run),
                                 timeout_s=WEBHOOK_TIMEOUT_S, policy=registry.url_policy(job.org))
    except webhooks.UnsafeUrl as exc:
        outcome = Outcome(f"refused: {exc.message}")
    except ValueError as exc:  # the secret cannot be decrypted
        outcome = Outcome(f"failed: {exc}")
    except OSError as exc:
        outcome = Outcome(f"failed: {type(exc).__name__}: {exc}", retry=True)
    else:
        ok = 200 <= reply.status < 300
        outcome = Outcome(f"{'delivered' if ok else 'rejected'}: HTTP {reply.status}",
                          retry=reply.status >= 500)
    JobRun.objects.filter(pk=run.pk).update(webhook_status=outcome.status[:200])
    if not outcome.status.startswith("delivered"):
        log.warning("webhook for job %s run %s: %s", job.pk, run.pk, outcome.status)
    return outcome
