"""Writes for ACME: request a managed certificate, issue/renew it, deploy it, schedule the next try.

Flow of one issuance (`managed_certificate_issue`, run by a Celery task that takes the id):
claim the row (one order at a time per certificate), check the rate-limit budget, place the order
(apps.acme.client) with HTTP-01 answers published on every node through the runtime API or DNS-01
records through the DNS provider, store chain + encrypted key in the managed `fleets.Certificate`
(same row, same file name on the nodes, so a renewal is a hot `set/commit ssl cert`), roll out the
fleets whose listeners use it, and prove it with a TLS handshake per node showing the new serial.
A failure keeps the previous certificate serving and is stored in plain words with a backoff.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from typing import Any

from cryptography import x509
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.acme import client, deploy
from apps.acme.client import AcmeFailure, Challenge
from apps.acme.models import AcmeAccount, AcmeOrder, ManagedCertificate
from apps.audit.services import audit_record
from apps.balancers.hostnames import covers
from apps.balancers.models import HostnameClaim
from apps.core import crypto
from apps.core.errors import Conflict, DomainError
from apps.core.validators import InvalidValue, validate_hostname
from apps.events.models import Event
from apps.events.services import event_emit
from apps.fleets import certs
from apps.fleets import services as fleet_services
from apps.fleets.models import Certificate
from apps.fleets.selectors import lb_fleets

logger = logging.getLogger(__name__)

RENEW_AT_FRACTION = 2 / 3  # of the lifetime, as Let's Encrypt advises for clients without ARI
JITTER_FRACTION = 1 / 30  # renewals spread over ~3% of the lifetime before the 2/3 mark
BACKOFF_BASE_S = 60.0
BACKOFF_MAX_S = 6 * 3600.0
# Let's Encrypt's limits (https://letsencrypt.org/docs/rate-limits/); Spillway holds itself to them so a
# loop never locks an org out of its CA for a week.
ORDERS_PER_3H = 300
CERTS_PER_DOMAIN_WEEK = 50
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
                                org=None) -> ManagedCertificate:
    """Ask for a certificate Spillway obtains and renews by itself; issued soon by a task."""
    org = org if (org is not None and principal.is_operator) else principal.org
    names = _clean_hostnames(hostnames)
    if challenge not in ManagedCertificate.Challenge.values:
        raise DomainError("invalid_challenge", "Challenge must be http-01 or dns-01.", field="challenge")
    if challenge == ManagedCertificate.Challenge.HTTP01 and any(h.startswith("*.") for h in names):
        raise DomainError("wildcard_needs_dns", "A wildcard certificate can only be validated with dns-01.",
                          field="challenge")
    check_hostnames_claimed(org=org, hostnames=names)
    with transaction.atomic():
        if ManagedCertificate.objects.filter(org=org, name=name).exists() or \
                Certificate.objects.filter(org=org, name=name).exists():
            raise Conflict("name_taken", f"A certificate named '{name}' already exists.", field="name")
        managed = ManagedCertificate.objects.create(org=org, name=name, hostnames=names, challenge=challenge,
                                                    next_attempt_at=timezone.now())
        audit_record(principal=principal, org=org, action="acme.request", obj=managed,
                     after={"hostnames": names, "challenge": challenge})
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
    from apps.acme.tasks import issue_certificate_task

    issue_certificate_task.delay(managed_id)


# --- budget ----------------------------------------------------------------------------------------


def registered_domain(hostname: str) -> str:
    """The last two labels: good enough for the budget shown (a public-suffix list would be exact)."""
    labels = hostname.lstrip("*.").split(".")
    return ".".join(labels[-2:])


def budget(*, org, now: dt.datetime | None = None) -> dict[str, Any]:
    """What is left of the CA's limits for this org: orders per 3 h, certificates per domain per week."""
    now = now or timezone.now()
    orders = AcmeOrder.objects.filter(org=org, started_at__gte=now - dt.timedelta(hours=3)).count()
    per_domain: dict[str, int] = {}
    week = AcmeOrder.objects.filter(org=org, status=AcmeOrder.Status.VALID,
                                    started_at__gte=now - dt.timedelta(days=7))
    for hostnames in week.values_list("hostnames", flat=True):
        for domain in {registered_domain(h) for h in hostnames}:
            per_domain[domain] = per_domain.get(domain, 0) + 1
    return {"orders_3h_used": orders, "orders_3h_limit": _setting("ACME_ORDERS_PER_3H", ORDERS_PER_3H),
            "certs_week_per_domain": per_domain,
            "certs_week_limit": _setting("ACME_CERTS_PER_DOMAIN_WEEK", CERTS_PER_DOMAIN_WEEK)}


def _budget_problem(org, hostnames: list[str]) -> str | None:
    left = budget(org=org)
    if left["orders_3h_used"] >= left["orders_3h_limit"]:
        return (f"{left['orders_3h_used']} orders in the last 3 hours reach the CA's limit of "
                f"{left['orders_3h_limit']}; waiting before ordering again.")
    for domain in {registered_domain(h) for h in hostnames}:
        used = left["certs_week_per_domain"].get(domain, 0)
        if used >= left["certs_week_limit"]:
            return (f"{used} certificates for {domain} in the last 7 days reach the CA's limit of "
                    f"{left['certs_week_limit']}; waiting before ordering again.")
    return None


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
    now = now or timezone.now()
    return list(ManagedCertificate.objects.filter(next_attempt_at__lte=now).order_by("next_attempt_at")
                .values_list("pk", flat=True))


# --- issue -----------------------------------------------------------------------------------------


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


def _solver(managed: ManagedCertificate):
    if managed.challenge == ManagedCertificate.Challenge.DNS01:
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


def _claim(managed_id: int, force: bool, now: dt.datetime) -> tuple[ManagedCertificate, AcmeOrder] | None:
    """Lock the row, refuse when an order is running (one at a time), open the order record."""
    with transaction.atomic():
        managed = ManagedCertificate.objects.select_for_update().filter(pk=managed_id).first()
        if managed is None:
            return None
        if not force and (managed.next_attempt_at is None or managed.next_attempt_at > now):
            return None
        running = managed.orders.filter(status=AcmeOrder.Status.RUNNING,
                                        started_at__gte=now - dt.timedelta(seconds=RUNNING_ORDER_STALE_S))
        if running.exists():
            return None
        order = AcmeOrder.objects.create(org=managed.org, managed=managed, hostnames=managed.hostnames)
        ManagedCertificate.objects.filter(pk=managed.pk).update(last_attempt_at=now)
    return managed, order


def _store(managed: ManagedCertificate, issued: client.Issued) -> Certificate:
    cert = managed.certificate or Certificate(org=managed.org)
    return certs.certificate_save(principal=None, cert=cert, org=managed.org, name=managed.name,
                                  cert_pem=issued.fullchain_pem, key_pem=issued.key_pem)


def _roll_out(cert: Certificate) -> None:
    """Render and push the fleets using `cert` now (inline in the worker that issued it: the handshake
    check comes next). The lb_changed signal queued the same work; whichever runs second finds it done."""
    fleet_ids = sorted({f.pk for ln in cert.listeners.select_related("lb") for f in lb_fleets(ln.lb)})
    for fleet_id in fleet_ids:
        fleet_services.fleet_reconcile_now(fleet_id=fleet_id)


def managed_certificate_issue(*, managed_id: int, force: bool = False,
                              now: dt.datetime | None = None) -> AcmeOrder | None:
    """Place one order for a due (or forced) managed certificate; idempotent: None when not due or running."""
    claimed = _claim(managed_id, force, now or timezone.now())
    if claimed is None:
        return None
    managed, order = claimed
    started = time.monotonic()
    try:
        problem = _budget_problem(managed.org, managed.hostnames)
        if problem:
            raise AcmeFailure("rate_limit_budget", problem)
        account = _account(managed.org)
        issued = client.issue(
            directory_url=account.directory_url, account_key_pem=crypto.decrypt(account.key_encrypted),
            account_uri=account.uri, hostnames=list(managed.hostnames), solver=_solver(managed),
            ca_bundle=_setting("ACME_CA_BUNDLE", "") or None, contact_email=_setting("ACME_CONTACT_EMAIL", ""),
            timeout_s=float(_setting("ACME_TIMEOUT_S", 60)))
        if issued.account_uri != account.uri:
            AcmeAccount.objects.filter(pk=account.pk).update(uri=issued.account_uri)
        try:
            cert = _store(managed, issued)
        except DomainError as exc:
            raise AcmeFailure("issued_certificate_invalid", f"The CA's certificate was refused: {exc.detail}") from exc
        if managed.certificate_id != cert.pk:
            ManagedCertificate.objects.filter(pk=managed.pk).update(certificate=cert)
        _roll_out(cert)
        leaf = x509.load_pem_x509_certificate(cert.cert_pem.encode())
        deployed = deploy.verify_serial(cert, leaf.serial_number, managed.hostnames[0].lstrip("*."),
                                        DEPLOY_VERIFY_TIMEOUT_S)
    except AcmeFailure as exc:
        _finish_failed(managed, order, exc.code, exc.reason, started)
        return order
    except Exception as exc:  # any other failure is still the order's outcome, in words
        logger.exception("acme: order %s failed", order.pk)
        _finish_failed(managed, order, "internal_error", f"Spillway failed while ordering: {exc}", started)
        return order
    now = timezone.now()
    order.status, order.serial, order.deployed = AcmeOrder.Status.VALID, format(leaf.serial_number, "X"), deployed
    order.finished_at, order.duration_s = now, time.monotonic() - started
    order.save()
    not_deployed = {k: v for k, v in deployed.items() if v != "ok"}
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
    order.finished_at, order.duration_s = now, time.monotonic() - started
    order.save()
    delay = max(backoff_s(failures), 3 * 3600.0 if code == "rate_limit_budget" else 0.0)
    ManagedCertificate.objects.filter(pk=managed.pk).update(
        status=ManagedCertificate.Status.FAILED, failures=failures, last_error=reason, last_error_code=code,
        next_attempt_at=now + dt.timedelta(seconds=delay))
    audit_record(principal=None, org=managed.org, action="acme.failed", obj=managed,
                 after={"code": code, "reason": reason})
