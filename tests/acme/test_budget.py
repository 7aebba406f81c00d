"""The CA's rate-limit budget counts certificates per registered domain (the public suffix list), as the CA does."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.acme import services
from apps.acme.budget import registered_domain
from apps.acme.models import AcmeOrder
from tests.acme.acmekit import approve, principal_of

pytestmark = pytest.mark.django_db


def test_registered_domain_follows_the_public_suffix_list() -> None:
    assert registered_domain("foo.example.co.uk") == registered_domain("bar.example.co.uk") == "example.co.uk"
    assert registered_domain("*.shop.example.com") == "example.com"
    assert registered_domain("WWW.Example.COM.") == "example.com"
    # a private-section suffix: each user's site is its own registered domain, as Let's Encrypt counts it
    assert registered_domain("a.github.io") == "a.github.io" != registered_domain("b.github.io")
    assert registered_domain("co.uk") == "co.uk"  # a bare public suffix counts as itself


def _issued(persona, hostname: str) -> None:
    """A certificate the CA issued this week (what the budget counts), without asking a CA."""
    managed = services.managed_certificate_request(
        principal=principal_of(persona), name=hostname.replace(".", "-"), hostnames=[hostname])
    AcmeOrder.objects.create(org=managed.org, managed=managed, hostnames=[hostname], status=AcmeOrder.Status.VALID)


def test_two_names_under_one_registered_domain_share_its_weekly_budget_whichever_org_asks(
        alice, charlie, settings) -> None:
    """GIVEN a limit of 2 certificates per registered domain per week, one issued for foo.example.co.uk
    (to another org) and one for www.example.co.uk, WHEN alice asks for bar.example.co.uk, THEN it waits
    with the reason naming example.co.uk (the CA would refuse it), while shop.other.co.uk, another
    registered domain under the same public suffix, goes on to the CA; the page shows the budget."""
    settings.ACME_CERTS_PER_DOMAIN_WEEK = 2
    settings.ACME_DIRECTORY_URL = ""  # an order that passes the budget stops at "not configured"
    for persona, host in ((charlie, "foo.example.co.uk"), (alice, "www.example.co.uk"),
                          (alice, "bar.example.co.uk"), (alice, "shop.other.co.uk")):
        approve(persona.org, host)
    _issued(charlie, "foo.example.co.uk")
    _issued(alice, "www.example.co.uk")
    bar = services.managed_certificate_request(principal=principal_of(alice), name="bar",
                                               hostnames=["bar.example.co.uk"])
    shop = services.managed_certificate_request(principal=principal_of(alice), name="shop",
                                                hostnames=["shop.other.co.uk"])

    orders = {o.managed.name: o for o in services.managed_certificates_issue(managed_ids=[bar.pk, shop.pk],
                                                                               force=True)}

    assert orders["bar"].error_code == "rate_limit_budget", orders["bar"].error
    assert "2 certificates for example.co.uk" in orders["bar"].error
    assert orders["shop"].error_code == "not_configured", orders["shop"].error
    bar.refresh_from_db()
    assert bar.status == "failed" and "example.co.uk" in bar.last_error
    web = Client()
    web.force_login(alice.user)
    page = web.get("/certificates/").content.decode()
    assert "Certificates for example.co.uk this week: 2 of 2." in page
    assert "co.uk this week" not in page.replace("example.co.uk this week", "")
