"""The LB workspace's static IP section: IP pool choices in constant queries, bad input as a form error."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.balancers.models import IpPool, LoadBalancer, Region

pytestmark = pytest.mark.django_db


def test_the_static_ip_form_reads_ip_pool_regions_in_the_same_query_however_many_pools(acme, alice):
    lb = LoadBalancer.objects.create(org=acme, name="web")
    client = Client()
    client.force_login(alice.user)
    client.get("/hostnames/")  # the session's first request saves it; count a steady page view

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            page = client.get(f"/load-balancers/{lb.pk}/")
        assert page.status_code == 200 and "Reserve an address" in page.content.decode()
        return len(ctx.captured_queries)

    def add_pools(first: int, n: int) -> None:
        for i in range(first, first + n):
            region = Region.objects.create(slug=f"r{i}", name=f"Region {i}")
            IpPool.objects.create(name=f"ips-{i}", cidr=f"10.{i}.0.0/24", region=region)

    add_pools(1, 1)
    one = count()
    add_pools(2, 5)
    assert count() == one


def test_a_malformed_ip_pool_id_is_a_form_error_not_a_server_error(acme, alice):
    lb = LoadBalancer.objects.create(org=acme, name="web")
    IpPool.objects.create(name="ips", cidr="10.9.0.0/24")
    client = Client()
    client.force_login(alice.user)

    response = client.post(f"/load-balancers/{lb.pk}/static-ips/", {"pool": "x1", "address": ""})

    assert response.status_code == 422 and "Choose an IP pool." in response.content.decode()
