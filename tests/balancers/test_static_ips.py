"""Static IP allocation is atomic: never the same address twice, even under concurrency."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.balancers.models import IpPool, StaticIP


@pytest.mark.django_db(transaction=True)
def test_50_concurrent_allocations_from_20_addresses(world, alice, settings):
    if connection.vendor != "postgresql":
        pytest.skip("the concurrency guarantee is measured on PostgreSQL")
    settings.QUOTA_STATIC_IPS = 100  # the pool runs out first here (the quota has its own test)
    # 192.0.2.0/27 has 30 hosts; allocate 10 first so exactly 20 remain.
    pool = IpPool.objects.create(name="twenty", cidr="192.0.2.32/27")
    for i in range(10):
        StaticIP.objects.create(pool=pool, address=f"192.0.2.{33 + i}", org=alice.org)
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(50)

    def allocate() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.token}")
        barrier.wait()
        response = client.post("/api/v1/static-ips/allocate/", {"pool": "twenty"}, format="json")
        with lock:
            results.append((response.status_code, response.json()))
        connection.close()

    threads = [threading.Thread(target=allocate) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    statuses = Counter(status for status, _ in results)
    assert statuses == {201: 20, 409: 30}, statuses
    addresses = [body["address"] for status, body in results if status == 201]
    assert len(set(addresses)) == 20
    assert all(body["code"] == "pool_exhausted" for status, body in results if status == 409)
    assert StaticIP.objects.filter(pool=pool).exclude(state="free").count() == 30


@pytest.mark.django_db
def test_release_returns_the_address_and_it_can_be_allocated_again(world, alice):
    ip = alice.client.post("/api/v1/static-ips/allocate/", {"pool": "ips", "address": "192.0.2.5"},
                           format="json").json()
    assert ip["state"] == "reserved"
    again = alice.client.post("/api/v1/static-ips/allocate/", {"pool": "ips", "address": "192.0.2.5"},
                              format="json")
    assert again.status_code == 409 and again.json()["code"] == "address_taken"
    released = alice.client.post(f"/api/v1/static-ips/{ip['id']}/release/")
    assert released.status_code == 200
    assert alice.client.get(f"/api/v1/static-ips/{ip['id']}/").status_code == 404  # free = no longer yours
    assert alice.client.post("/api/v1/static-ips/allocate/", {"pool": "ips", "address": "192.0.2.5"},
                             format="json").status_code == 201


@pytest.mark.django_db
def test_address_outside_the_pool_is_refused(world, alice):
    response = alice.client.post("/api/v1/static-ips/allocate/", {"pool": "ips", "address": "10.9.9.9"},
                                 format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "address_not_in_pool"
