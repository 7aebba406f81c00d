"""A renewal relies on the org still holding every name: it is checked again at every later order.

GIVEN acme's managed certificate for shop.acme.test, WHEN acme's claim is deleted and the name approved for
globex, THEN "renew now" is refused (API and scheduled order alike) and no order reaches the CA; and a person
cannot ask for renewals without limit.
"""

from __future__ import annotations

import pytest
from django.core.cache import cache

from apps.acme import services
from apps.acme.models import AcmeOrder, ManagedCertificate
from apps.balancers.models import HostnameClaim

pytestmark = pytest.mark.django_db


@pytest.fixture
def managed(acme):
    HostnameClaim.objects.create(org=acme, hostname="shop.acme.test", status="approved")
    return ManagedCertificate.objects.create(org=acme, name="shop", hostnames=["shop.acme.test"])


def test_renewing_after_the_claim_moved_to_another_org_is_refused_and_orders_nothing(acme, globex, alice, managed):
    HostnameClaim.objects.filter(org=acme).delete()
    HostnameClaim.objects.create(org=globex, hostname="shop.acme.test", status="approved")
    response = alice.client.post(f"/api/v1/managed-certificates/{managed.pk}/renew/")
    assert response.status_code == 422 and response.json()["code"] == "hostname_not_claimed"
    # The scheduled path too (a renewal falling due): the order fails in words before the CA is asked.
    orders = services.managed_certificates_issue(managed_ids=[managed.pk], force=True)
    assert [(o.status, o.error_code) for o in orders] == [("failed", "hostname_not_claimed")]
    assert not AcmeOrder.objects.filter(status="running").exists()


def test_renew_now_is_rate_limited(acme, alice, managed, settings):
    cache.clear()
    settings.QUOTA_RENEWALS_PER_HOUR = 2
    answers = [alice.client.post(f"/api/v1/managed-certificates/{managed.pk}/renew/").status_code for _ in range(3)]
    assert answers[:2] == [202, 202] and answers[2] == 429
