"""A tenant's route changes per minute (quota `route_changes_per_minute`, issue 40's fairness): past it a create,
update or delete answers 429 `rate_limited` with Retry-After and writes nothing, while another tenant's changes go
through; an operator's override moves one org's limit; what the quotas show as used is what was accepted (a
refused write and a previewed one are not changes)."""

from __future__ import annotations

import time

import pytest
from django.core.cache import cache
from django.test import Client

from apps.balancers.models import LoadBalancer, Route
from apps.core import quotas
from tests.factories import LoadBalancerFactory, PoolFactory

pytestmark = pytest.mark.django_db(transaction=True)  # writes count when they commit


@pytest.fixture(autouse=True)
def _one_window():
    """Counts start at zero, and the test does not straddle a minute's edge (the counts are per fixed minute)."""
    cache.clear()
    left = 60 - time.time() % 60
    if left < 8:
        time.sleep(left + 0.1)


def body(lb, pool, path: str, host: str = "acme.example.com") -> dict:
    return {"lb": lb.pk, "hosts": [host], "path": path, "targets": [{"pool": pool.pk, "weight": 100}]}


def used(org) -> tuple[int | None, int]:
    row = next(r for r in quotas.usage(org) if r["name"] == "route_changes_per_minute")
    return row["limit"], row["used"]


def test_past_its_change_rate_a_tenant_gets_429_with_retry_after_and_nothing_is_written(
        world, acme, globex, alice, charlie, settings) -> None:
    settings.QUOTA_ROUTE_CHANGES_PER_MINUTE = 3
    globex_lb = LoadBalancerFactory(name="globex-lb", org=globex)
    globex_pool = PoolFactory(lb=globex_lb, org=globex, name="web")
    made = [alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, f"/r{i}"), format="json")
            for i in range(3)]
    assert [m.status_code for m in made] == [201] * 3, made[-1].content
    revision = LoadBalancer.objects.get(pk=world.acme_lb.pk).revision

    refused = alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, "/r3"), format="json")
    assert refused.status_code == 429 and refused.json()["code"] == "rate_limited"
    assert "acme may make at most 3 route changes per minute" in refused.json()["detail"]
    assert 0 < int(refused["Retry-After"]) <= 61
    first, second = made[0].json()["id"], made[1].json()["id"]
    assert alice.client.delete(f"/api/v1/routes/{first}/").status_code == 429  # a delete is a change
    assert alice.client.patch(f"/api/v1/routes/{second}/", {"path": "/moved"}, format="json").status_code == 429

    assert sorted(Route.objects.filter(org=acme).values_list("path", flat=True)) == ["/r0", "/r1", "/r2"]
    assert LoadBalancer.objects.get(pk=world.acme_lb.pk).revision == revision  # nothing rolled out
    assert used(acme) == (3, 3)  # the three refused attempts are not counted
    other = charlie.client.post("/api/v1/routes/", body(globex_lb, globex_pool, "/g", "globex.example.com"),
                                format="json")
    assert other.status_code == 201, other.content  # another tenant is served meanwhile


def test_an_operator_raises_one_orgs_change_rate(world, acme, alice, otto, settings) -> None:
    settings.QUOTA_ROUTE_CHANGES_PER_MINUTE = 1
    assert alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, "/a"),
                             format="json").status_code == 201
    assert alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, "/b"),
                             format="json").status_code == 429
    raised = otto.client.patch(f"/api/v1/organizations/{acme.pk}/", {"quotas": {"route_changes_per_minute": 5}},
                               format="json")
    assert raised.status_code == 200, raised.content
    row = next(r for r in raised.json()["usage"] if r["name"] == "route_changes_per_minute")
    assert (row["limit"], row["used"], row["per_s"]) == (5, 1, 60)
    assert alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, "/b"),
                             format="json").status_code == 201
    acme.refresh_from_db()
    assert used(acme) == (5, 2)


def test_a_previewed_route_is_not_a_change(world, acme, alice, settings) -> None:
    """The route form's preview runs the write in a transaction that is rolled back: it costs no change."""
    settings.QUOTA_ROUTE_CHANGES_PER_MINUTE = 1
    page = Client()
    page.force_login(alice.user)
    preview = page.post(f"/load-balancers/{world.acme_lb.pk}/routes/preview/", {
        "hosts": "acme.example.com", "path": "/p", "path_match": "prefix", "priority": "120",
        "pool": world.acme_pool.pk}, HTTP_HX_REQUEST="true")
    assert preview.status_code == 200, preview.content[:500]
    assert used(acme) == (1, 0)
    assert alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, "/p"),
                             format="json").status_code == 201


def test_the_operator_org_changes_without_a_rate(ops, settings) -> None:
    settings.QUOTA_ROUTE_CHANGES_PER_MINUTE = 0
    assert quotas.limit(ops, "route_changes_per_minute") is None


def test_the_quotas_page_counts_route_changes_this_minute(world, acme, alice, settings) -> None:
    settings.QUOTA_ROUTE_CHANGES_PER_MINUTE = 7
    for path in ("/a", "/b"):
        assert alice.client.post("/api/v1/routes/", body(world.acme_lb, world.acme_pool, path),
                                 format="json").status_code == 201
    page = Client()
    page.force_login(alice.user)
    html = page.get("/quotas/").content.decode()
    row = html[html.index('id="quota-route_changes_per_minute"'):]
    row = row[:row.index("</tr>")]
    assert "route changes per minute" in row and "<td>2 this minute</td>" in row and "<td>7</td>" in row, row
    assert "<td>0 this hour</td>" in html  # the hourly quotas still say hour
