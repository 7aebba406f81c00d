"""Nothing silently dropped: unknown and read-only fields answer 400 by name; pools take nested regions."""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import Pool, PoolRegion
from tests.factories import PoolRegionFactory


@pytest.mark.django_db
def test_unknown_field_on_create_names_it_and_creates_nothing(world, alice):
    response = alice.client.post("/api/v1/pools/", {"lb": world.acme_lb.pk, "name": "typo", "algorithm": "roundrobin",
                                                     "capacity_scalr": 0.5}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "unknown_field"
    assert body["fields"] == {"capacity_scalr": ["Unknown field."]}
    assert not Pool.objects.filter(name="typo").exists()


@pytest.mark.django_db
def test_unknown_field_on_patch_changes_nothing(world, alice):
    url = f"/api/v1/pools/{world.acme_pool.pk}/"
    response = alice.client.patch(url, {"algorithm": "leastconn", "algorythm": "source"}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"] == {"algorythm": ["Unknown field."]}
    world.acme_pool.refresh_from_db()
    assert world.acme_pool.algorithm != "leastconn"


@pytest.mark.django_db
def test_read_only_field_with_a_new_value_is_refused(world, alice):
    url = f"/api/v1/pools/{world.acme_pool.pk}/"
    response = alice.client.patch(url, {"created_at": "2001-01-01T00:00:00Z"}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "read_only_field"
    assert list(response.json()["fields"]) == ["created_at"]


@pytest.mark.django_db
def test_get_body_sent_back_unchanged_still_passes(world, alice):
    PoolRegionFactory(pool=world.acme_pool, region=world.us)
    url = f"/api/v1/pools/{world.acme_pool.pk}/"
    body = alice.client.get(url).json()
    body["algorithm"] = "leastconn"
    response = alice.client.put(url, body, format="json")
    assert response.status_code == 200, response.json()
    world.acme_pool.refresh_from_db()
    assert world.acme_pool.algorithm == "leastconn"


@pytest.mark.django_db
def test_unknown_field_inside_a_nested_item_and_an_action_body(world, alice):
    body = {"lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/x", "priority": 400,
            "targets": [{"pool": world.acme_pool.pk, "weight": 100, "wieght": 5}]}
    response = alice.client.post("/api/v1/routes/", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "unknown_field"
    assert response.json()["fields"] == {"targets": {"0": {"wieght": ["Unknown field."]}}}
    member_state = alice.client.post("/api/v1/members/999999/state/", {"admin_state": "drain"}, format="json")
    assert member_state.status_code == 404  # the strict body check never leaks existence


@pytest.mark.django_db
def test_pool_create_with_regions_creates_capacity_rows_audited(world, alice):
    body = {"lb": world.acme_lb.pk, "name": "api", "algorithm": "roundrobin",
            "regions": [{"region": "us-east", "max_rate_per_member": 250, "capacity_scaler": 0.5},
                        {"region": "eu-west"}]}
    response = alice.client.post("/api/v1/pools/", body, format="json")
    assert response.status_code == 201, response.json()
    pool = Pool.objects.get(name="api", lb=world.acme_lb)
    rows = {r.region.slug: r for r in PoolRegion.objects.filter(pool=pool).select_related("region")}
    assert set(rows) == {"us-east", "eu-west"}
    assert rows["us-east"].max_rate_per_member == 250 and rows["us-east"].capacity_scaler == 0.5
    assert rows["eu-west"].capacity_scaler == 1.0
    assert {r["region"] for r in response.json()["regions"]} == {"us-east", "eu-west"}
    assert AuditEvent.objects.filter(action="poolregion.create").count() == 2
    assert AuditEvent.objects.filter(action="pool.create", object_id=str(pool.pk)).exists()


@pytest.mark.parametrize(("regions", "field_error"), [
    ([{"region": "us-east"}, {"region": "us-east"}], "repeated: us-east"),
    ([{"region": "mars-1"}], "does not exist"),
    ([{"region": "us-east", "capacity_scaler": 0.05}], "capacity_scaler"),
    ([{"region": "us-east", "pool": 1}], "read-only"),
])
@pytest.mark.django_db
def test_bad_regions_create_nothing(world, alice, regions, field_error):
    body = {"lb": world.acme_lb.pk, "name": "bad", "algorithm": "roundrobin", "regions": regions}
    response = alice.client.post("/api/v1/pools/", body, format="json")
    assert response.status_code == 400
    assert field_error in str(response.json()["fields"]["regions"])
    assert not Pool.objects.filter(name="bad").exists()
    assert not PoolRegion.objects.filter(pool__name="bad").exists()


@pytest.mark.django_db
def test_regions_on_update_points_to_pool_regions(world, alice):
    url = f"/api/v1/pools/{world.acme_pool.pk}/"
    response = alice.client.patch(url, {"regions": [{"region": "us-east"}]}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "regions_via_pool_regions"
    assert "/pool-regions/" in response.json()["fields"]["regions"][0]
    assert not PoolRegion.objects.filter(pool=world.acme_pool).exists()


@pytest.mark.django_db
def test_a_pool_without_health_checks_is_created_through_the_api(world, alice):
    """An empty health_path means no health check (backends with nothing to probe), as the model and the
    renderer already allow; the API refused it, so such a pool could only be made in the database."""
    from apps.fleets.models import Fleet
    from apps.fleets.selectors import fleet_snapshot

    response = alice.client.post("/api/v1/pools/", {"lb": world.acme_lb.pk, "name": "nocheck", "health_path": ""},
                                 format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["health_path"] == ""
    fleet = Fleet.objects.create(name="f-nocheck", region=world.us)
    fleet.serves.add(world.acme_lb)
    snap, _ = fleet_snapshot(fleet, 1)
    assert [p.health for p in snap.pools if p.name == "nocheck"] == [None]
    bad = alice.client.post("/api/v1/pools/", {"lb": world.acme_lb.pk, "name": "sp", "health_path": " "},
                            format="json")
    assert bad.status_code == 400 and "health_path" in bad.json()["fields"]
