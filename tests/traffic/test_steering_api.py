"""Steering through the product: pool fields (validated at the edge), the what-if, the pool page, tenancy."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from apps.balancers.models import Pool, PoolRegion
from apps.traffic.selectors import DECISION_KEY
from tests.personas import web

WHAT_IF = "/api/v1/traffic/what-if/"


def test_owner_sets_steering_on_a_pool_and_reads_it_back(alice, two_regions) -> None:
    pool = two_regions.pool
    response = alice.client.patch(f"/api/v1/pools/{pool.pk}/", {
        "overflow_policy": "spray_to_world", "preferred_regions": ["rb"], "failover_threshold": 0.7,
        "auto_drain": True}, format="json")
    assert response.status_code == 200, response.json()
    body = alice.client.get(f"/api/v1/pools/{pool.pk}/").json()
    assert (body["overflow_policy"], body["preferred_regions"], body["failover_threshold"], body["auto_drain"]) == (
        "spray_to_world", ["rb"], 0.7, True)
    row = PoolRegion.objects.get(pool=pool, region=two_regions.a)
    assert alice.client.patch(f"/api/v1/pool-regions/{row.pk}/", {"traffic_dial": 0.25},
                              format="json").status_code == 200
    assert PoolRegion.objects.get(pk=row.pk).traffic_dial == 0.25


@pytest.mark.parametrize(("body", "field", "code"), [
    ({"preferred_regions": ["nowhere"]}, "preferred_regions", "unknown_region"),
    ({"preferred_regions": ["ra", "ra"]}, "preferred_regions", "duplicate_region"),
    ({"preferred_regions": ["ra\nbackend x"]}, "preferred_regions", "invalid"),
    ({"failover_threshold": 1.5}, "failover_threshold", "max_value"),
    ({"failover_threshold": 0}, "failover_threshold", "min_value"),
    ({"overflow_policy": "spray"}, "overflow_policy", "invalid_choice"),
])
def test_bad_steering_is_refused_with_a_code_and_nothing_changes(alice, two_regions, body, field, code) -> None:
    pool = two_regions.pool
    response = alice.client.patch(f"/api/v1/pools/{pool.pk}/", body, format="json")
    assert response.status_code == 400
    answer = response.json()
    assert answer.get("field") == field or field in str(answer), answer
    assert code in str(answer), answer
    fresh = Pool.objects.get(pk=pool.pk)
    assert (fresh.preferred_regions, fresh.failover_threshold, fresh.overflow_policy) == ([], None, "waterfall")


def test_traffic_dial_outside_0_1_is_refused(alice, two_regions) -> None:
    row = PoolRegion.objects.get(pool=two_regions.pool, region=two_regions.a)
    response = alice.client.patch(f"/api/v1/pool-regions/{row.pk}/", {"traffic_dial": 1.5}, format="json")
    assert response.status_code == 400 and PoolRegion.objects.get(pk=row.pk).traffic_dial == 1.0


def test_outsider_cannot_steer_another_tenants_pool(charlie, two_regions) -> None:
    pool = two_regions.pool
    assert charlie.client.patch(f"/api/v1/pools/{pool.pk}/", {"preferred_regions": ["rb"]},
                                format="json").status_code == 404
    assert Pool.objects.get(pk=pool.pk).preferred_regions == []


def test_what_if_plans_a_proposed_steering_beside_the_current_one(alice, two_regions) -> None:
    pool = two_regions.pool  # ra 2 x 10 = 20 req/s, rb 2 x 20 = 40 req/s
    Pool.objects.filter(pk=pool.pk).update(preferred_regions=["rb"])
    body = alice.client.post(WHAT_IF, {"pool": pool.pk, "demand": {"ra": 15}}, format="json").json()
    assert body["steering"]["preferred"] == ["rb"]
    assert body["plan"]["served"]["ra"] == {"rb": 15.0}  # the pool's own steering by default
    proposed = alice.client.post(WHAT_IF, {"pool": pool.pk, "demand": {"ra": 15}, "policy": "spray_to_world",
                                           "steering": {"preferred": [], "dials": {"rb": 0.5}}},
                                 format="json").json()
    # Spray to world over ra 20 and rb 40 x 0.5 = 20: half each.
    assert proposed["plan"]["served"]["ra"] == {"ra": 7.5, "rb": 7.5}
    assert proposed["baseline"]["served"]["ra"] == {"rb": 15.0}


def test_what_if_shows_a_region_the_loop_failed_over(alice, two_regions) -> None:
    pool = two_regions.pool
    cache.set(DECISION_KEY.format(pool.pk), {"failed_over": ["ra"], "drained": []})
    try:
        body = alice.client.post(WHAT_IF, {"pool": pool.pk, "demand": {"ra": 15}}, format="json").json()
        assert body["steering"]["failed_over"] == ["ra"] and body["plan"]["served"]["ra"] == {"rb": 15.0}
        text = web(alice).get(f"/traffic/pools/{pool.pk}/").content.decode()
        assert "failed over now: ra" in text
        # The what-if form starts from it: ra's "failed over" box is ticked.
        assert 'name="failed_over_ra" checked' in text
    finally:
        cache.delete(DECISION_KEY.format(pool.pk))


@pytest.mark.parametrize("steering", [["rb"], {"preferred": "rb"}, {"dials": {"ra": 2}}, {"nope": 1},
                                      {"preferred": ["ra", "ra"]}])
def test_what_if_refuses_bad_steering_with_a_code(alice, two_regions, steering) -> None:
    response = alice.client.post(WHAT_IF, {"pool": two_regions.pool.pk, "demand": {"ra": 1}, "steering": steering},
                                 format="json")
    assert response.status_code == 400
    assert response.json()["code"] in ("invalid_steering", "invalid_dial", "invalid_preferred"), response.json()


def test_a_removed_member_can_no_longer_steer_nor_plan_the_pool(alice, acme, two_regions) -> None:
    from apps.accounts.models import Membership

    pool = two_regions.pool
    assert alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"preferred_regions": ["rb"]},
                              format="json").status_code == 200
    Membership.objects.filter(user=alice.user, org=acme).delete()
    assert alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"preferred_regions": []},
                              format="json").status_code in (401, 403, 404)
    assert alice.client.post(WHAT_IF, {"pool": pool.pk, "demand": {"ra": 1}},
                             format="json").status_code in (401, 403, 404)
    assert Pool.objects.get(pk=pool.pk).preferred_regions == ["rb"]


def test_far_too_much_steering_is_refused_and_another_tenant_is_still_served(alice, charlie, two_regions) -> None:
    pool = two_regions.pool
    many = [f"r{i}" for i in range(21)]
    response = alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"preferred_regions": many}, format="json")
    assert response.status_code == 400 and Pool.objects.get(pk=pool.pk).preferred_regions == []
    huge = {"pool": pool.pk, "demand": {"ra": 1}, "steering": {"failed_over": [f"r{i}" for i in range(101)]}}
    answer = alice.client.post(WHAT_IF, huge, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_steering"
    assert charlie.client.post(WHAT_IF, {"policy": "spray_to_world", "demand": {"ra": 1},
                                         "capacities": [{"region": "ra", "healthy_members": 1}]},
                               format="json").status_code == 200


def test_session_affinity_is_cookie_or_none_and_an_outsider_cannot_set_it(alice, charlie, two_regions) -> None:
    pool = two_regions.pool
    bad = alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"session_affinity": "sticky"}, format="json")
    assert bad.status_code == 400 and "invalid_choice" in str(bad.json())
    assert charlie.client.patch(f"/api/v1/pools/{pool.pk}/", {"session_affinity": "cookie"},
                                format="json").status_code == 404
    assert Pool.objects.get(pk=pool.pk).session_affinity == "none"
    ok = alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"session_affinity": "cookie"}, format="json")
    assert ok.status_code == 200 and ok.json()["session_affinity"] == "cookie"
    assert "sticky sessions (cookie)" in web(alice).get(f"/traffic/pools/{pool.pk}/").content.decode()
