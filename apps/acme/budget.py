"""The CA's rate limits as a budget (Let's Encrypt: 300 new orders per account per 3 hours, 50 certificates
per registered domain per week): shown on the certificates page and checked before each order, so
Spillway waits instead of spending orders the CA would refuse."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from django.conf import settings
from django.utils import timezone
from publicsuffixlist import PublicSuffixList

from apps.acme.models import AcmeOrder, ManagedCertificate

# Let's Encrypt's limits (https://letsencrypt.org/docs/rate-limits/); Spillway holds itself to them so a
# loop never locks an org out of its CA for a week.
ORDERS_PER_3H = 300
CERTS_PER_DOMAIN_WEEK = 50


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


@functools.cache
def _suffixes() -> PublicSuffixList:
    """The public suffix list bundled with the pinned `publicsuffixlist` release: read once, offline (no
    download at run time; a newer list arrives with a new pin)."""
    return PublicSuffixList()


def registered_domain(hostname: str) -> str:
    """The domain the CA counts certificates against (Let's Encrypt: the public suffix list, private
    section included): foo.example.co.uk and bar.example.co.uk are both example.co.uk, while
    a.github.io and b.github.io are two. A name that is itself a public suffix counts as itself."""
    name = hostname.removeprefix("*.").rstrip(".").lower()
    return _suffixes().privatesuffix(name) or name


def budget(*, org, now: dt.datetime | None = None) -> dict[str, Any]:
    """What is left of the CA's limits for this org: orders per 3 h (per ACME account, so the org's own)
    and certificates per registered domain per week for the domains the org's certificates are under.
    The weekly count includes every org's certificates: the CA counts a registered domain whoever asks."""
    now = now or timezone.now()
    orders = AcmeOrder.objects.filter(org=org, started_at__gte=now - dt.timedelta(hours=3)).count()
    mine = {registered_domain(h)
            for hostnames in ManagedCertificate.objects.filter(org=org).values_list("hostnames", flat=True)
            for h in hostnames}
    per_domain: dict[str, int] = {}
    week = AcmeOrder.objects.filter(status=AcmeOrder.Status.VALID, started_at__gte=now - dt.timedelta(days=7))
    for hostnames in week.values_list("hostnames", flat=True):
        for domain in {registered_domain(h) for h in hostnames} & mine:
            per_domain[domain] = per_domain.get(domain, 0) + 1
    return {"orders_3h_used": orders, "orders_3h_limit": _setting("ACME_ORDERS_PER_3H", ORDERS_PER_3H),
            "certs_week_per_domain": per_domain,
            "certs_week_limit": _setting("ACME_CERTS_PER_DOMAIN_WEEK", CERTS_PER_DOMAIN_WEEK)}


def admit(left: dict[str, Any], hostnames: list[str]) -> str | None:
    """None and the order counted in `left` (a budget()) when it fits the CA's limits, else why not."""
    if left["orders_3h_used"] >= left["orders_3h_limit"]:
        return (f"{left['orders_3h_used']} orders in the last 3 hours reach the CA's limit of "
                f"{left['orders_3h_limit']}; waiting before ordering again.")
    domains = {registered_domain(h) for h in hostnames}
    for domain in domains:
        used = left["certs_week_per_domain"].get(domain, 0)
        if used >= left["certs_week_limit"]:
            return (f"{used} certificates for {domain} in the last 7 days reach the CA's limit of "
                    f"{left['certs_week_limit']}; waiting before ordering again.")
    left["orders_3h_used"] += 1
    for domain in domains:  # counted as if it succeeds: a batch must not overshoot the week's limit
        left["certs_week_per_domain"][domain] = left["certs_week_per_domain"].get(domain, 0) + 1
    return None
