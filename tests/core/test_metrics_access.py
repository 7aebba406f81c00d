"""/metrics names every fleet, node and pool: not for anonymous callers from anywhere."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_metrics_need_an_operator_token_or_an_allowed_network(settings, alice, otto):
    settings.METRICS_ALLOWED_NETWORKS = ["10.99.0.0/16"]

    anonymous = Client(REMOTE_ADDR="192.0.2.10").get("/metrics")
    customer = Client(REMOTE_ADDR="192.0.2.10", HTTP_AUTHORIZATION=f"Bearer {alice.token}").get("/metrics")
    operator = Client(REMOTE_ADDR="192.0.2.10", HTTP_AUTHORIZATION=f"Bearer {otto.token}").get("/metrics")
    scraper = Client(REMOTE_ADDR="10.99.3.4").get("/metrics")

    assert anonymous.status_code == customer.status_code == 401
    assert anonymous.json()["code"] == "not_authenticated"
    assert operator.status_code == scraper.status_code == 200
    assert b"spillway_" in operator.content
