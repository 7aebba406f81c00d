"""A customer's config preview on a shared LB in map form: map lines of other tenants stay hidden."""

from __future__ import annotations

import pytest

from apps.balancers.models import Route, RouteTarget
from apps.fleets import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(shared) -> dict:
    """The fleets conftest's shared LB, rendered and rolled out once (the base previews compare with)."""
    fleet = shared["fleet"]
    services.rollout_create(fleet=fleet, revision=services.fleet_render(fleet=fleet), enqueue=False)
    return shared


def test_an_operator_any_host_route_to_a_customer_pool_does_not_show_other_tenants_hosts(
    shared, ops, otto, alice
) -> None:
    """GIVEN an operator route with no hosts forwarding to acme's pool, WHEN acme previews, THEN acme sees
    its entry under the any-host class `*` (its only one: any-host routes are not copied into every
    host class), never a line naming globex's hostname."""
    for org, path in (("acme", "/a"), ("globex", "/g")):
        Route.objects.filter(org=shared["pools"][org].org).update(path=path)
    route = Route.objects.create(lb=shared["lb"], org=ops, hosts=[], path="/ops-check", priority=50)
    RouteTarget.objects.create(route=route, pool=shared["pools"]["acme"], weight=100)
    acme_pool = shared["pools"]["acme"].pk

    url = f"/api/v1/load-balancers/{shared['lb'].pk}/preview/"
    [operator] = otto.client.post(url).json()["fleets"]
    [customer] = alice.client.post(url).json()["fleets"]

    assert f"+*/ops-check/ p{acme_pool}" in operator["diff"]
    assert "/ops-check/" not in operator["diff"].replace(f"+*/ops-check/ p{acme_pool}", "")
    assert "globex" not in customer["diff"]
    assert f"+*/ops-check/ p{acme_pool}" in customer["diff"]

    # Only another tenant changes: acme's preview says nothing changed for it, and counts nothing.
    Route.objects.filter(pk=route.pk).delete()
    Route.objects.filter(org=shared["pools"]["acme"].org).update(path="/")  # as rolled out
    Route.objects.filter(org=shared["pools"]["globex"].org).update(path="/globex-only")
    [customer] = alice.client.post(url).json()["fleets"]
    [operator] = otto.client.post(url).json()["fleets"]
    assert operator["changed"] and "/globex-only" in operator["diff"]
    assert customer["changed"] is False and customer["diff"] == "" and "hidden_lines" not in customer


def test_the_preview_legend_names_only_the_pools_of_the_lines_shown(shared, alice, otto) -> None:
    for org in ("acme", "globex"):
        pool = shared["pools"][org]
        route = Route.objects.create(lb=shared["lb"], org=pool.org, hosts=[f"{org}.example.com"],
                                     path=f"/{org}-new", priority=10 if org == "acme" else 20)
        RouteTarget.objects.create(route=route, pool=pool, weight=100)
    acme, globex = shared["pools"]["acme"], shared["pools"]["globex"]

    url = f"/api/v1/load-balancers/{shared['lb'].pk}/preview/"
    [operator] = otto.client.post(url).json()["fleets"]
    [customer] = alice.client.post(url).json()["fleets"]

    assert operator["legend"] == {f"p{acme.pk}": "pool acme-web", f"p{globex.pk}": "pool globex-web"}
    assert customer["legend"] == {f"p{acme.pk}": "pool acme-web"}


@pytest.mark.django_db(transaction=True)
def test_previewing_a_change_does_not_hold_the_lb_lock_while_haproxy_checks_it(shared, alice, monkeypatch) -> None:
    """Another tenant's save on the shared LB must not wait for someone's preview: while the preview's
    `haproxy -c` runs (real), a second connection can take the LB row lock at once (NOWAIT)."""
    import psycopg
    from django.db import connection

    from apps.balancers.models import RouteTarget as Target
    from apps.balancers.services import route_save
    from apps.fleets.config import preview as fleet_preview
    from tests.factories import HostnameClaimFactory

    real_validate = fleet_preview.validate_bundle
    lock_free: list[bool] = []
    s = connection.settings_dict

    def validate_and_probe_lock(bundle, haproxy_bin):
        with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                             dbname=s["NAME"], autocommit=False) as other:
            try:
                other.execute("SELECT 1 FROM balancers_loadbalancer WHERE id = %s FOR UPDATE NOWAIT",
                              [shared["lb"].pk])
                lock_free.append(True)
            except psycopg.errors.LockNotAvailable:
                lock_free.append(False)
        return real_validate(bundle, haproxy_bin)

    monkeypatch.setattr(fleet_preview, "validate_bundle", validate_and_probe_lock)
    pool = shared["pools"]["acme"]
    # Priority 50 ranks above acme's "/" route (100); at 150 that route would shadow this one.
    data = {"lb": shared["lb"], "org": pool.org, "hosts": ["acme.example.com"], "path_match": "prefix",
            "path": "/preview-only", "priority": 50, "targets": [{"pool": pool, "weight": 100}]}

    HostnameClaimFactory(org=alice.org, hostname="acme.example.com")
    principal = alice.principal
    previews = fleet_preview.lb_preview_change(
        lb=shared["lb"], principal=principal,
        change=lambda: route_save(principal=principal, route=Route(), data=dict(data)))

    assert lock_free == [True]
    assert previews[0]["valid"] and "/preview-only" in previews[0]["diff"]
    assert not Route.objects.filter(path="/preview-only").exists() and Target.objects.count() == 2


def test_a_customer_sees_its_own_members_change_and_nothing_of_another_tenants(shared, alice, otto) -> None:
    """The render manifest owns a backend's every line by its pool, so acme reads the server line of its
    own member's new weight (a line naming no pool id) and none of globex's."""
    from apps.balancers.models import Member

    Member.objects.filter(pool=shared["pools"]["acme"]).update(weight=50)
    Member.objects.filter(pool=shared["pools"]["globex"]).update(weight=60)

    url = f"/api/v1/load-balancers/{shared['lb'].pk}/preview/"
    [operator] = otto.client.post(url).json()["fleets"]
    [customer] = alice.client.post(url).json()["fleets"]

    assert "+    server m1 127.0.20.1:9100 weight 50" in operator["diff"]
    assert "+    server m1 127.0.20.2:9100 weight 60" in operator["diff"]
    assert [line.removesuffix(" check") for line in customer["diff"].splitlines()] == [
        "-    server m1 127.0.20.1:9100 weight 100", "+    server m1 127.0.20.1:9100 weight 50"]
    assert customer["changed"] is True
