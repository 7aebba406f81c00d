"""Writes for ACME: request a managed certificate, issue/renew it, deploy it, schedule the next try.

Issuance (`managed_certificates_issue`, run by Celery tasks that take ids) works on a batch of due
certificates: claim the rows (one order at a time per certificate), check the rate-limit budget,
open the orders with the CA concurrently, publish every HTTP-01 answer of the batch on every node
through the runtime API in one call per node (or the DNS-01 records through the DNS provider), let
the CA validate, store each chain + encrypted key in its managed `fleets.Certificate` (same row, same
file name on the nodes, so a renewal is a hot `set/commit ssl cert`), render and push each fleet
using them once for the whole batch (fleets in parallel), and prove it with a TLS handshake per node
showing each new serial. A failure keeps the previous certificate serving and is stored in plain
words with a backoff; the other orders of the batch go on."""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.acme import client, deploy
from apps.acme.budget import admit, budget
from apps.acme.client import AcmeFailure, Challenge
from apps.acme.models import AcmeAccount, AcmeOrder, ManagedCertificate
from apps.audit.services import audit_record
from apps.balancers.hostnames import covers
from apps.balancers.models import HostnameClaim, Listener
from apps.balancers.services import lb_touch
from apps.core import crypto, quotas
from apps.core.enqueue import enqueue
from apps.core.errors import Conflict, DomainError
from apps.core.validators import InvalidValue, validate_hostname
from apps.events.models import Event
from apps.events.services import event_emit
from apps.fleets import services as fleet_services
from apps.fleets.models import Certificate

logger = logging.getLogger(__name__)

RENEW_AT_FRACTION = 2 / 3  # of the lifetime, as Let's Encrypt advises for clients without ARI
JITTER_FRACTION = 1 / 30  # renewals spread over ~3% of the lifetime before the 2/3 mark
BACKOFF_BASE_S = 60.0
BACKOFF_MAX_S = 6 * 3600.0
MAX_HOSTNAMES = 100
RUNNING_ORDER_STALE_S = 600.0
DEPLOY_VERIFY_TIMEOUT_S = 30.0


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


# --- request ---------------------------------------------------------------------------------------


def _clean_hostnames(raw: object) -> list[str]:
    if not isinstance(raw, list) or not raw or len(raw) > MAX_HOSTNAMES:
        raise DomainError("invalid_hostnames", f"Give 1 to {MAX_HOSTNAMES} hostnames as a list.", field="hostnames")
    names = []
    for value in raw:
        try:
            names.append(validate_hostname(value, allow_wildcard=True))
        except InvalidValue as exc:
            raise DomainError(exc.code, exc.message, field="hostnames") from exc
    return sorted(set(names), key=names.index)


def check_hostnames_claimed(*, org, hostnames: list[str]) -> None:
    """Every name needs an approved claim of `org` covering it; another org's claim answers exactly like
    no claim (the requester learns nothing about who owns a name)."""
    claims = list(HostnameClaim.objects.filter(org=org, status=HostnameClaim.Status.APPROVED)
                  .values_list("hostname", flat=True))
    for host in hostnames:
        if not any(covers(claim, host) for claim in claims):
            raise DomainError("hostname_not_claimed",
                              f"'{host}' is not covered by an approved hostname claim of your organization.",
                              field="hostnames", status=422)


def managed_certificate_request(*, principal: Principal, name: str, hostnames: object,
                                challenge: str = ManagedCertificate.Challenge.HTTP01,
                                org=None, certificate: Certificate | None = None) -> ManagedCertificate:
    """Ask for a certificate Spillway obtains and renews by itself; issued soon by a task.

    `certificate`: an uploaded certificate of the org to take over. Its content is replaced in place
    once issued, so listeners already using it switch through `set/commit ssl cert` with no reload
    (a new certificate row would need a listener change, hence a reload, to be served)."""
    org = org if (org is not None and principal.is_operator) else principal.org
    names = _clean_hostnames(hostnames)
    if challenge not in ManagedCertificate.Challenge.values:
        raise DomainError("invalid_challenge", "Challenge must be http-01 or dns-01.", field="challenge")
    if challenge == ManagedCertificate.Challenge.HTTP01 and any(h.startswith("*.") for h in names):
        raise DomainError("wildcard_needs_dns", "A wildcard certificate can only be validated with dns-01.",
                          field="challenge")
    check_hostnames_claimed(org=org, hostnames=names)
    if certificate is not None and certificate.org_id != org.pk:
        # the same words as a missing one: another org's certificate is not there for this requester
        raise DomainError("does_not_exist", f'Invalid pk "{certificate.pk}" - object does not exist.',
                          field="certificate")
    with transaction.atomic():
        others = Certificate.objects.filter(org=org, name=name)
        if certificate is not None:
            others = others.exclude(pk=certificate.pk)
        if ManagedCertificate.objects.filter(org=org, name=name).exists() or others.exists():
            raise Conflict("name_taken", f"A certificate named '{name}' already exists.", field="name")
        if certificate is not None and ManagedCertificate.objects.filter(certificate=certificate).exists():
            raise Conflict("already_managed", "That certificate is already managed.", field="certificate")
        managed = ManagedCertificate.objects.create(org=org, name=name, hostnames=names, challenge=challenge,
                                                    certificate=certificate, next_attempt_at=timezone.now())
        audit_record(principal=principal, org=org, action="acme.request", obj=managed,
                     after={"hostnames": names, "challenge": challenge,
                            "certificate": certificate.pk if certificate is not None else None})
        transaction.on_commit(lambda: _enqueue(managed.pk))
    return managed


def managed_certificate_update(*, principal: Principal, managed: ManagedCertificate,
                               hostnames: object) -> ManagedCertificate:
    """A changed domain list: the new certificate is issued while the old one keeps serving, and replaces
    it only once issued (no gap, unlike replacing the certificate first)."""
    names = _clean_hostnames(hostnames)
    check_hostnames_claimed(org=managed.org, hostnames=names)
    with transaction.atomic():
        before = list(managed.hostnames)
        ManagedCertificate.objects.filter(pk=managed.pk).update(hostnames=names, next_attempt_at=timezone.now(),
                                                                failures=0)
        audit_record(principal=principal, org=managed.org, action="acme.update", obj=managed,
                     before={"hostnames": before}, after={"hostnames": names})
        transaction.on_commit(lambda: _enqueue(managed.pk))
    managed.refresh_from_db()
    return managed


def managed_certificate_renew_now(*, principal: Principal, managed: ManagedCertificate) -> None:
    """Order again now. The claims it relied on are checked again (a name the org no longer holds is not
    renewed), and a person may ask only so often (quota renewals_per_hour: each order costs the CA's limits)."""
    check_hostnames_claimed(org=managed.org, hostnames=list(managed.hostnames))
    quotas.check_rate(managed.org, "renewals_per_hour")
    ManagedCertificate.objects.filter(pk=managed.pk).update(next_attempt_at=timezone.now(), failures=0)
    audit_record(principal=principal, org=managed.org, action="acme.renew_now", obj=managed)
    transaction.on_commit(lambda: _enqueue(managed.pk))


def managed_certificate_delete(*, principal: Principal, managed: ManagedCertificate) -> None:
    """Stop managing it; the certificate it issued stays (listeners may use it) as an ordinary one."""
    with transaction.atomic():
        audit_record(principal=principal, org=managed.org, action="acme.delete", obj=managed,
                     before={"hostnames": managed.hostnames})
        managed.delete()


def _enqueue(managed_id: int) -> None:
    enqueue("acme.issue_certificate_task", managed_id)


# --- schedule --------------------------------------------------------------------------------------


def renewal_time(not_before: dt.datetime, not_after: dt.datetime, rng: random.Random | None = None) -> dt.datetime:
    """Two-thirds into the lifetime, minus a random jitter of up to 1/30 of it (so many certificates issued
    together do not all renew in the same minute)."""
    lifetime = (not_after - not_before).total_seconds()
    jitter = (rng or random).uniform(0, lifetime * JITTER_FRACTION)
    return not_before + dt.timedelta(seconds=lifetime * RENEW_AT_FRACTION - jitter)


def backoff_s(failures: int, rng: random.Random | None = None) -> float:
    """Exponential from 1 minute, capped at 6 hours, with +-20% jitter."""
    base = min(BACKOFF_BASE_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)
    return base * (rng or random).uniform(0.8, 1.2)


def due(now: dt.datetime | None = None) -> list[int]:
    """Managed certificates whose (re)issue is due and that no order is working on now."""
    now = now or timezone.now()
    running = AcmeOrder.objects.filter(status=AcmeOrder.Status.RUNNING,
                                       started_at__gte=now - dt.timedelta(seconds=RUNNING_ORDER_STALE_S))
    return list(ManagedCertificate.objects.filter(next_attempt_at__lte=now)
                .exclude(pk__in=running.values("managed_id")).order_by("next_attempt_at")
                .values_list("pk", flat=True))


# --- issue -----------------------------------------------------------------------------------------

ISSUE_CONCURRENCY = 16  # orders talking to the CA at once (threads: the CA and the nodes do the waiting)


class FleetHttp01Solver:
    """HTTP-01 answers on every node of every region at once (runtime map entries, no reload)."""

    kind = "http-01"

    def present(self, challenges: list[Challenge]) -> None:
        results = fleet_services.acme_challenges_set(add={c.name: c.value for c in challenges})
        failed = {node: err for node, err in results.items() if err}
        if results and len(failed) == len(results):
            raise AcmeFailure("challenge_publish_failed", "No node took the HTTP-01 answer: "
                              + "; ".join(f"{k}: {v}" for k, v in sorted(failed.items())))
        for node, err in failed.items():
            logger.warning("acme: HTTP-01 answer not published on %s: %s", node, err)

    def cleanup(self, challenges: list[Challenge]) -> None:
        fleet_services.acme_challenges_set(add={}, remove=[c.name for c in challenges])


def _solver(kind: str):
    if kind == ManagedCertificate.Challenge.DNS01:
        from apps.acme.dns import configured_provider

        return configured_provider()
    return FleetHttp01Solver()


def _account(org) -> AcmeAccount:
    directory = _setting("ACME_DIRECTORY_URL", "")
    if not directory:
        raise AcmeFailure("not_configured", "No ACME CA is configured (ACME_DIRECTORY_URL).")
    account, _ = AcmeAccount.objects.get_or_create(
        org=org, directory_url=directory,
        defaults={"key_encrypted": crypto.encrypt(client.new_private_key_pem())})
    return account


def _claim(managed_ids: list[int], force: bool, now: dt.datetime) -> list[tuple[ManagedCertificate, AcmeOrder]]:
    """Lock the rows, skip those not due or with an order running (one at a time per certificate), open
    an order record for each of the others. One transaction for the whole batch: a commit per
    certificate costs more than the rest of this together."""
    claimed = []
    with transaction.atomic():
        rows = list(ManagedCertificate.objects.select_for_update(of=("self",)).filter(pk__in=managed_ids)
                    .select_related("org", "certificate").order_by("pk"))
        busy = set(AcmeOrder.objects.filter(managed__in=rows, status=AcmeOrder.Status.RUNNING,
                                            started_at__gte=now - dt.timedelta(seconds=RUNNING_ORDER_STALE_S))
                   .values_list("managed_id", flat=True))
        for managed in rows:
            if managed.pk in busy:
                continue
            if not force and (managed.next_attempt_at is None or managed.next_attempt_at > now):
                continue
            order = AcmeOrder.objects.create(org=managed.org, managed=managed, hostnames=managed.hostnames)
            claimed.append((managed, order))
        ManagedCertificate.objects.filter(pk__in=[m.pk for m, _ in claimed]).update(last_attempt_at=now)
    return claimed


@dataclass
class _Job:
    """One managed certificate's order on its way through a batch."""

    managed: ManagedCertificate
    order: AcmeOrder
    started: float
    account: AcmeAccount | None = None
    account_key_pem: str = ""
    pending: client.Pending | None = None
    issued: client.Issued | None = None
    cert: Certificate | None = None
    deployed: dict[str, str] = field(default_factory=dict)
    verified_at: float | None = None  # time.time() when every node showed the new serial
    failure: AcmeFailure | None = None
    steps: dict[str, float] = field(default_factory=dict)  # AcmeOrder.steps


def _live(jobs: list[_Job]) -> list[_Job]:
    return [j for j in jobs if j.failure is None]


def _each(jobs: list[_Job], fn: Callable[[_Job], None]) -> None:
    """fn(job) for every job, ISSUE_CONCURRENCY at a time in threads; fn talks to the CA only (no
    database in threads). A failure becomes that job's outcome and leaves the others going."""

    def run(job: _Job) -> None:
        try:
            fn(job)
        except AcmeFailure as exc:
            job.failure = exc
        except Exception as exc:  # any other failure is still the order's outcome, in words
            logger.exception("acme: order %s failed", job.order.pk)
            job.failure = AcmeFailure("internal_error", f"Spillway failed while ordering: {exc}")

    if len(jobs) == 1:
        run(jobs[0])
    elif jobs:
        workers = min(int(_setting("ACME_CONCURRENCY", ISSUE_CONCURRENCY)), len(jobs))
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(run, jobs))


def _prepare(jobs: list[_Job]) -> None:
    """The CA's budget and the org's account for every job (database, before any thread starts). The
    budget is read once per org and counts this batch's orders as they are admitted."""
    accounts: dict[int, tuple[AcmeAccount, str]] = {}
    budgets: dict[int, dict[str, Any]] = {}
    for job in jobs:
        org = job.managed.org
        try:
            try:  # every order, the scheduled renewals too: the org must still hold each name it asks for
                check_hostnames_claimed(org=org, hostnames=list(job.managed.hostnames))
            except DomainError as exc:
                raise AcmeFailure("hostname_not_claimed", f"{exc.detail} Nothing was ordered.") from None
            if org.pk not in budgets:
                budgets[org.pk] = budget(org=org)
                # this batch's orders are already recorded: count them as each is admitted below
                budgets[org.pk]["orders_3h_used"] -= sum(1 for j in jobs if j.managed.org_id == org.pk)
            problem = admit(budgets[org.pk], job.managed.hostnames)
            if problem:
                raise AcmeFailure("rate_limit_budget", problem)
            if org.pk not in accounts:
                account = _account(org)
                accounts[org.pk] = (account, crypto.decrypt(account.key_encrypted))
        except AcmeFailure as exc:
            job.failure = exc
            continue
        job.account, job.account_key_pem = accounts[org.pk]


def _open_orders(jobs: list[_Job]) -> None:
    """New orders at the CA; an account not registered yet is registered by its first order alone (so
    concurrent orders do not race to register the same key)."""
    ca_bundle = _setting("ACME_CA_BUNDLE", "") or None
    contact, timeout_s = _setting("ACME_CONTACT_EMAIL", ""), float(_setting("ACME_TIMEOUT_S", 60))

    def begin(job: _Job) -> None:
        assert job.account is not None
        started = time.monotonic()
        job.pending = client.begin(
            directory_url=job.account.directory_url, account_key_pem=job.account_key_pem,
            account_uri=job.account.uri, hostnames=list(job.managed.hostnames), kind=job.managed.challenge,
            ca_bundle=ca_bundle, contact_email=contact, timeout_s=timeout_s)
        job.steps["order_s"] = time.monotonic() - started

    first: dict[int, _Job] = {}
    for job in jobs:
        if job.account is not None and not job.account.uri:
            first.setdefault(job.account.pk, job)
    _each(list(first.values()), begin)
    for job in first.values():
        if job.pending is not None and job.account is not None:
            job.account.uri = job.pending.account_uri  # the same object serves the org's other jobs
            AcmeAccount.objects.filter(pk=job.account.pk).update(uri=job.pending.account_uri)
    _each([j for j in jobs if j not in first.values()], begin)


def _publish(jobs: list[_Job]) -> list[tuple[Any, list[Challenge]]]:
    """Every challenge of the batch in one go per kind: one runtime call per node carries all HTTP-01
    answers, one DNS update per zone all TXT records. Returns what to clean up afterwards."""
    published = []
    for kind in ManagedCertificate.Challenge.values:
        group = [j for j in jobs if j.managed.challenge == kind and j.pending is not None]
        if not group:
            continue
        challenges = [c for j in group for c in j.pending.challenges]  # type: ignore[union-attr]
        started = time.monotonic()
        try:
            solver = _solver(kind)
            if challenges:
                solver.present(challenges)
        except AcmeFailure as exc:
            for job in group:
                job.failure = exc
            continue
        finally:
            for job in group:
                job.steps["publish_s"] = time.monotonic() - started
        published.append((solver, challenges))
    return published


def _cleanup(published: list[tuple[Any, list[Challenge]]]) -> None:
    for solver, challenges in published:
        try:
            solver.cleanup(challenges)
        except Exception:  # a leftover answer is harmless; the orders' outcomes matter
            logger.exception("acme: challenge cleanup failed")


def _store(jobs: list[_Job]) -> None:
    """Every issued chain and key into its managed `fleets.Certificate` (same row, same file on the
    nodes), in one transaction; each LB using one of them gets one revision bump for the batch."""
    with transaction.atomic():
        for job in jobs:
            managed, issued = job.managed, job.issued
            assert issued is not None
            cert = managed.certificate or Certificate(org=managed.org)
            try:
                with transaction.atomic():
                    job.cert = fleet_services.certificate_save(
                        principal=None, cert=cert, org=managed.org, name=managed.name,
                        cert_pem=issued.fullchain_pem, key_pem=issued.key_pem, touch_lbs=False)
            except DomainError as exc:
                job.failure = AcmeFailure("issued_certificate_invalid",
                                          f"The CA's certificate was refused: {exc.detail}")
                continue
            if managed.certificate_id != job.cert.pk:
                ManagedCertificate.objects.filter(pk=managed.pk).update(certificate=job.cert)
        stored = [j.cert.pk for j in jobs if j.failure is None and j.cert is not None]
        for lb_id in sorted(set(Listener.objects.filter(certificate__in=stored).values_list("lb_id", flat=True))):
            lb_touch(lb_id)


def _deploy(jobs: list[_Job]) -> None:
    """Roll the batch's certificates out and prove it: a TLS handshake per node and listener shows
    each new serial."""
    started = time.monotonic()
    deploy.roll_out([j.cert for j in jobs if j.cert is not None])
    rolled_out, rolled_out_at = time.monotonic(), time.time()
    for job in jobs:
        job.steps["roll_out_s"] = rolled_out - started
    where = deploy.endpoints_of([j.cert for j in jobs if j.cert is not None])
    checks = []
    for job in jobs:
        assert job.cert is not None
        leaf = x509.load_pem_x509_certificate(job.cert.cert_pem.encode())
        checks.append(deploy.Check(where.get(job.cert.pk, []), leaf.serial_number,
                                   job.managed.hostnames[0].lstrip("*.")))
    verified_at: list[float | None] = []
    results = deploy.verify_serials(checks, DEPLOY_VERIFY_TIMEOUT_S, verified_at)
    for job, seen, at in zip(jobs, results, verified_at or [None] * len(jobs), strict=True):
        job.deployed, job.verified_at = seen, at
        job.steps["verify_s"] = max(0.0, (at or time.time()) - rolled_out_at)


def managed_certificates_issue(*, managed_ids: list[int], force: bool = False, now: dt.datetime | None = None,
                               timings: dict[str, float] | None = None) -> list[AcmeOrder]:
    """Place orders for due (or forced) managed certificates together; the orders placed (none for one
    not due or already running: idempotent).

    Together, because each step's cost is per round, not per certificate: the orders talk to the CA
    concurrently, every HTTP-01 answer of the batch reaches each node in one runtime call, and each
    fleet renders and pushes once for all the new certificates. One order failing leaves the others
    going; its reason is stored in plain words with a backoff, and the previous certificate keeps serving.
    """
    steps: dict[str, float] = timings if timings is not None else {}
    mark = time.monotonic()

    def step(name: str) -> None:
        nonlocal mark
        steps[name] = steps.get(name, 0.0) + time.monotonic() - mark
        mark = time.monotonic()

    now = now or timezone.now()
    jobs = [_Job(managed, order, started=time.time()) for managed, order in _claim(managed_ids, force, now)]
    if not jobs:
        return []
    claimed_at = timezone.now()
    for job in jobs:  # from when it fell due (asked for, renew now, or its renewal time) to this claim
        due_at = job.managed.next_attempt_at
        job.steps["queued_s"] = max(0.0, (claimed_at - due_at).total_seconds()) if due_at else 0.0
    _prepare(jobs)
    step("claim_budget_s")
    _open_orders(_live(jobs))
    step("order_open_s")
    published = _publish(_live(jobs))
    step("challenge_publish_s")
    timeout_s = float(_setting("ACME_TIMEOUT_S", 60))
    try:
        _each(_live(jobs), lambda j: setattr(j, "issued", client.complete(
            j.pending, timeout_s, timings=j.steps)))  # type: ignore[arg-type]
        step("validate_finalize_s")
    finally:
        _cleanup(published)
    step("challenge_cleanup_s")
    stored = _live(jobs)
    _store(stored)
    step("store_s")
    for job in stored:
        job.steps["store_s"] = steps["store_s"]
    try:
        _deploy(_live(jobs))
    except Exception as exc:  # the certificates are stored; the next attempt deploys them
        logger.exception("acme: deploying orders %s failed", [j.order.pk for j in _live(jobs)])
        for job in _live(jobs):
            job.failure = AcmeFailure("internal_error", f"Spillway failed while deploying: {exc}")
    step("deploy_verify_s")
    with transaction.atomic():  # one commit for the batch's outcomes
        for job in jobs:
            job.order.steps = {name: round(value, 3) for name, value in job.steps.items()}
        orders = [_finish(job) for job in jobs]
    step("finish_s")
    return orders


def managed_certificate_issue(*, managed_id: int, force: bool = False,
                              now: dt.datetime | None = None) -> AcmeOrder | None:
    """Place one order for a due (or forced) managed certificate; None when not due or running."""
    orders = managed_certificates_issue(managed_ids=[managed_id], force=force, now=now)
    return orders[0] if orders else None


def _finish(job: _Job) -> AcmeOrder:
    managed, order = job.managed, job.order
    if job.failure is not None:
        _finish_failed(managed, order, job.failure.code, job.failure.reason, job.started)
        return order
    assert job.cert is not None
    cert = job.cert
    leaf = x509.load_pem_x509_certificate(cert.cert_pem.encode())
    now = timezone.now()
    order.status, order.serial, order.deployed = AcmeOrder.Status.VALID, format(leaf.serial_number, "X"), job.deployed
    # duration: from the claim to the handshake proof on every node (the bookkeeping after it excluded)
    order.finished_at, order.duration_s = now, (job.verified_at or time.time()) - job.started
    order.save()
    not_deployed = {k: v for k, v in job.deployed.items() if v != "ok"}
    ManagedCertificate.objects.filter(pk=managed.pk).update(
        status=ManagedCertificate.Status.VALID, last_success_at=now, failures=0,
        last_error="" if not not_deployed else "Issued, but not yet served by: "
        + "; ".join(f"{k} ({v})" for k, v in sorted(not_deployed.items())),
        last_error_code="" if not not_deployed else "not_deployed",
        next_attempt_at=renewal_time(leaf.not_valid_before_utc, leaf.not_valid_after_utc))
    audit_record(principal=None, org=managed.org, action="acme.issued", obj=managed,
                 after={"serial": order.serial, "hostnames": managed.hostnames, "not_after": cert.not_after})
    event_emit("certificate.renewed", org=managed.org, obj=cert,
               data={"serial": order.serial, "hostnames": managed.hostnames})
    return order


EXPIRING_DAYS = 14


def expiring_alerts(now: dt.datetime | None = None) -> list[int]:
    """A `certificate.expiring` event, at most once a day each, for every certificate (uploaded or managed)
    with fewer than 14 days left: a managed one that renewed would have a later expiry, so still being
    here means no successful renewal. Returns the ids alerted."""
    now = now or timezone.now()
    alerted = []
    for cert in Certificate.objects.filter(not_after__lt=now + dt.timedelta(days=EXPIRING_DAYS)).select_related("org"):
        recent = Event.objects.filter(type="certificate.expiring", object_type="certificate",
                                      object_id=str(cert.pk), at__gte=now - dt.timedelta(days=1))
        if recent.exists():
            continue
        days = max(0, int((cert.not_after - now).total_seconds() // 86400))
        managed = ManagedCertificate.objects.filter(certificate=cert).first()
        event_emit("certificate.expiring", org=cert.org, obj=cert,
                   data={"days": days, "not_after": cert.not_after.isoformat(),
                         "last_error": managed.last_error if managed else "uploaded: renew by hand"})
        alerted.append(cert.pk)
    return alerted


def _finish_failed(managed: ManagedCertificate, order: AcmeOrder, code: str, reason: str, started: float) -> None:
    failures = managed.failures + 1
    now = timezone.now()
    order.status, order.error, order.error_code = AcmeOrder.Status.FAILED, reason, code
    order.finished_at, order.duration_s = now, time.time() - started
    order.save()
    delay = max(backoff_s(failures), 3 * 3600.0 if code == "rate_limit_budget" else 0.0)
    ManagedCertificate.objects.filter(pk=managed.pk).update(
        status=ManagedCertificate.Status.FAILED, failures=failures, last_error=reason, last_error_code=code,
        next_attempt_at=now + dt.timedelta(seconds=delay))
    audit_record(principal=None, org=managed.org, action="acme.failed", obj=managed,
                 after={"code": code, "reason": reason})
