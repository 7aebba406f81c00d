"""Traffic API and its database side: capacities with health, samples -> timeline, what-if, tenancy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.balancers.models import Member, PoolRegion
from apps.fleets.models import Fleet, Node, NodeHealth
from apps.traffic import selectors, services
from apps.traffic.models import CapacityState, OverflowPoint, TrafficSample
from apps.traffic.services import NodeReadings
from tests.traffic.traffickit import reading, record_steady_load

pytestmark = pytest.mark.django_db

OVERFLOW = "/api/v1/traffic/overflow/"
WHAT_IF = "/api/v1/traffic/what-if/"


# --- capacities ---------------------------------------------------------------------------------------


def test_capacity_is_active_members_times_rate_times_scaler(two_regions) -> None:
    PoolRegion.objects.filter(pool=two_regions.pool, region=two_regions.b).update(capacity_scaler=0.5)
    Member.objects.filter(pool=two_regions.pool, name="a2").update(admin_state="drain")
    caps = {c.region: c.capacity for c in selectors.pool_capacities(two_regions.pool)}
    assert caps == {"ra": 10.0, "rb": 20.0}


def test_members_the_nodes_see_down_add_no_capacity(two_regions) -> None:
    fleet = Fleet.objects.create(name="fa", region=two_regions.a)
    now = timezone.now()
    for i, status in enumerate(["DOWN", "DOWN", "UP"]):
        node = Node.objects.create(fleet=fleet, name=f"n{i}", address="127.0.0.1", runtime_dir=f"/tmp/n{i}",
                                   config_dir=f"/tmp/n{i}/etc")
        pool_id = two_regions.pool.pk
        NodeHealth.objects.create(node=node, proxy=f"p{pool_id}_ra", server="a1", status=status, updated_at=now)
        NodeHealth.objects.create(node=node, proxy=f"p{pool_id}_ra", server="a2", status="UP", updated_at=now)
        # A report older than the freshness window no longer counts.
        NodeHealth.objects.create(node=node, proxy=f"p{pool_id}_rb", server="b1", status="DOWN",
                                  updated_at=now - timedelta(minutes=5))
    caps = {c.region: (c.healthy_members, c.capacity) for c in selectors.pool_capacities(two_regions.pool)}
    assert caps == {"ra": (1, 10.0), "rb": (2, 40.0)}  # a1: 2 of 3 nodes see it down


def test_a_health_change_is_recorded_and_re_renders_the_fleets_serving_the_pool(two_regions) -> None:
    """Traffic records the capacity the fresh health gives and names the LBs it changed; the fleets
    health collector, right after writing that health, re-renders those LBs' fleets."""
    from apps.fleets import services as fleet_services

    fleet = Fleet.objects.create(name="fa", region=two_regions.a)
    fleet.serves.add(two_regions.lb)
    node = Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/tmp/n1",
                               config_dir="/tmp/n1/etc")
    assert services.capacity_record() == []  # first sight is the baseline
    assert CapacityState.objects.get(pool=two_regions.pool, region="ra").capacity == 20.0
    NodeHealth.objects.create(node=node, proxy=f"p{two_regions.pool.pk}_ra", server="a1", status="DOWN",
                              updated_at=timezone.now())
    seq = Fleet.objects.get(pk=fleet.pk).change_seq
    assert services.capacity_record() == [two_regions.lb.pk]
    assert Fleet.objects.get(pk=fleet.pk).change_seq == seq, "traffic re-drives no fleet itself"
    assert CapacityState.objects.get(pool=two_regions.pool, region="ra").capacity == 10.0

    NodeHealth.objects.filter(node=node).update(status="UP")
    assert fleet_services.fleet_capacity_follow() == [two_regions.lb.pk]
    assert Fleet.objects.get(pk=fleet.pk).change_seq == seq + 1
    assert fleet_services.fleet_capacity_follow() == []  # nothing changed since


# --- observation --------------------------------------------------------------------------------------


def test_overflow_endpoint_shows_demand_local_out_and_in_per_region(alice, two_regions) -> None:
    pool = two_regions.pool
    record_steady_load(pool.pk, a_local=20.0, a_out=10.0, b_local=5.0)
    response = alice.client.get(OVERFLOW, {"pool": pool.pk, "window": "1m"})
    assert response.status_code == 200, response.json()
    body = response.json()
    regions = {r["region"]: r for r in body["regions"]}
    a, b = regions["ra"], regions["rb"]
    assert a["capacity"] == 20.0 and b["capacity"] == 40.0
    # The first reading of each node has no earlier counter (rate column = 0), so the means sit a
    # little under the steady rates; the latest bucket is all steady.
    latest = {r["region"]: r for r in body["latest"]["regions"]}
    assert latest["ra"]["demand"] == pytest.approx(30.0) and latest["ra"]["local"] == pytest.approx(20.0)
    assert latest["ra"]["out_to"] == {"rb": pytest.approx(10.0)}
    assert latest["rb"]["in"] == pytest.approx(10.0) and latest["rb"]["local"] == pytest.approx(5.0)
    assert latest["rb"]["utilization"] == pytest.approx(15 / 40)
    assert a["out"] > 0 and b["in_from"]["ra"] > 0
    assert body["resolution_s"] == 10 and len(body["series"]["time"]) == body["buckets"] >= 2
    assert set(body["series"]["regions"]["ra"]) == {"demand", "local", "out", "in", "capacity"}
    assert body["plan"]["policy"] == "waterfall" and body["expected"] is not None


def test_overflow_endpoint_validates_its_parameters(alice, two_regions) -> None:
    assert alice.client.get(OVERFLOW).json()["code"] == "pool_required"
    bad = alice.client.get(OVERFLOW, {"pool": two_regions.pool.pk, "window": "5 minutes"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_window"
    assert alice.client.get(OVERFLOW, {"pool": 999999}).status_code == 404


def test_a_recorded_reading_is_stored_once(two_regions) -> None:
    at = timezone.now()
    nodes = [NodeReadings(None, "fa/n1", "ra", [reading(f"p{two_regions.pool.pk}_ra", 10, rate=3)])]
    assert services.readings_record(at=at, nodes=nodes) == 1
    services.readings_record(at=at, nodes=nodes)
    assert TrafficSample.objects.count() == 1
    # Backends of pools that do not exist (another control plane's config) are ignored.
    assert services.readings_record(at=at, nodes=[NodeReadings(None, "x/n", "ra", [reading("p999999_ra", 1)])]) == 0


def test_a_sample_rate_is_counted_from_the_nodes_newest_earlier_sample(two_regions) -> None:
    """The rate between two readings comes from the node's latest sample before this one, not an older one in the
    window: a counter at 0, then 100, then 105 five seconds apart is 1 req/s now (5 in 5 s), not 10.5."""
    backend = f"p{two_regions.pool.pk}_ra"
    start = timezone.now() - timedelta(seconds=10)
    for step, total in enumerate((0, 100, 105)):
        services.readings_record(at=start + timedelta(seconds=5 * step),
                                 nodes=[NodeReadings(None, "fa/n1", "ra", [reading(backend, total)]),
                                        NodeReadings(None, "fb/n1", "rb", [reading(backend, 7 * step)])])
    rates = dict(TrafficSample.objects.filter(time=start + timedelta(seconds=10)).values_list("node", "request_rate"))
    assert rates == {"fa/n1": pytest.approx(1.0), "fb/n1": pytest.approx(1.4)}


def test_downsampling_and_retention(two_regions) -> None:
    pool = two_regions.pool
    old = timezone.now() - timedelta(hours=3)
    start = services.bucket_start(old, 300)
    for i in range(30):  # 5 minutes of 10 s points, 12 req/s local in ra
        OverflowPoint.objects.create(pool=pool, time=start + timedelta(seconds=10 * i), resolution_s=10,
                                     region="ra", capacity=20.0, demand=12.0, local=12.0, utilization=0.6, nodes=1)
    assert services.overflow_downsample() == 1
    coarse = OverflowPoint.objects.get(resolution_s=300)
    assert (coarse.time, coarse.demand, coarse.utilization) == (start, 12.0, 0.6)
    assert services.overflow_downsample() == 1  # idempotent
    assert OverflowPoint.objects.filter(resolution_s=300).count() == 1
    TrafficSample.objects.create(time=old, pool=pool, node="fa/n1", region="ra")
    pruned = services.traffic_prune(now=timezone.now() + timedelta(days=1))
    assert pruned["samples"] == 1 and pruned["fine_points"] == 30 and pruned["coarse_points"] == 0


# --- what-if ---------------------------------------------------------------------------------------------


def test_what_if_shows_the_effect_of_a_capacity_change_before_pushing_it(bob, two_regions) -> None:
    before = PoolRegion.objects.get(pool=two_regions.pool, region=two_regions.a).max_rate_per_member
    response = bob.client.post(WHAT_IF, {
        "pool": two_regions.pool.pk,
        "capacities": [{"region": "ra", "max_rate_per_member": 20}],
        "demand": {"ra": 50},
    }, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    proposed = {r["region"]: r for r in body["plan"]["regions"]}
    baseline = {r["region"]: r for r in body["baseline"]["regions"]}
    assert proposed["ra"]["local"] == 40.0 and proposed["ra"]["out_to"] == {"rb": 10.0}
    assert baseline["ra"]["local"] == 20.0 and baseline["ra"]["out_to"] == {"rb": 30.0}
    assert body["capacities"][0] == {"region": "ra", "healthy_members": 2, "max_rate_per_member": 20.0,
                                     "capacity_scaler": 1.0, "capacity": 40.0}
    # Nothing changed.
    assert PoolRegion.objects.get(pool=two_regions.pool, region=two_regions.a).max_rate_per_member == before


def test_what_if_with_nodes_shows_the_chains_it_would_render(alice, two_regions) -> None:
    for region, name in ((two_regions.a, "fa"), (two_regions.b, "fb")):
        fleet = Fleet.objects.create(name=name, region=region)
        fleet.serves.add(two_regions.lb)
        Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir=f"/tmp/{name}",
                            config_dir=f"/tmp/{name}/etc")
    body = alice.client.post(WHAT_IF, {"pool": two_regions.pool.pk, "demand": {"ra": 30}}, format="json").json()
    # Each node's share follows where demand arrives: fa/n1 gets all of ra's 20 req/s and rb's 10 it
    # overflows (+10% headroom); fb/n1 keeps the rest of rb. The enforced split is the plan's.
    assert body["enforced"]["chains"]["fa/n1"] == [{"region": "ra", "rate_limit_per_node": 20},
                                                   {"region": "rb", "rate_limit_per_node": 11}]
    assert body["enforced"]["chains"]["fb/n1"] == [{"region": "rb", "rate_limit_per_node": 29},
                                                   {"region": "ra", "rate_limit_per_node": 0}]
    assert body["enforced"]["served"]["ra"] == {"ra": 20.0, "rb": 10.0}
    assert body["plan"]["served"]["ra"] == {"ra": 20.0, "rb": 10.0}


def test_what_if_without_a_pool_plans_the_numbers_given(vera, two_regions) -> None:
    """A viewer may preview: nothing is written."""
    response = vera.client.post(WHAT_IF, {
        "policy": "isolation",
        "capacities": [{"region": "ra", "healthy_members": 1, "max_rate_per_member": 10}],
        "demand": {"ra": 15},
    }, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["plan"]["unserved"] == {"ra": 5.0}
    # "pool": null means no pool, as the schema says (it said integer only while null was accepted).
    explicit = vera.client.post(WHAT_IF, {"pool": None, "policy": "isolation", "capacities": [
        {"region": "ra", "healthy_members": 1, "max_rate_per_member": 10}], "demand": {"ra": 15}}, format="json")
    assert explicit.json()["plan"]["unserved"] == {"ra": 5.0}
    schema = vera.client.get("/api/v1/schema/", {"format": "json"}).json()
    body_ref = schema["paths"][WHAT_IF]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    properties = schema["components"]["schemas"][body_ref.rsplit("/", 1)[1]]["properties"]
    assert properties["pool"]["nullable"] is True
    assert vera.client.post(WHAT_IF, {"policy": None, "capacities": [{"region": "ra", "healthy_members": 1}],
                                      "demand": {"ra": 1}}, format="json").json()["policy"] == "waterfall"
    assert properties["policy"]["nullable"] is True


@pytest.mark.parametrize(("body", "code", "field"), [
    ({"pool": "x"}, "invalid_pool", "pool"),
    ({"capacities": []}, "pool_or_inputs_required", "pool"),
    ({"policy": "random"}, "invalid_policy", "policy"),
    ({"capacities": [{"region": "ra", "capacity_scaler": 0.05}]}, "invalid_capacity", "capacities[0]"),
    ({"capacities": [{"region": "ra", "healthy_members": 1.5}]}, "invalid_number", "capacities[0].healthy_members"),
    ({"capacities": [{"region": "ra"}, {"region": "ra"}]}, "duplicate_region", "capacities[1].region"),
    ({"capacities": [{"region": "mars", "healthy_members": 1}]}, "unknown_region", "capacities"),
    ({"capacities": [{"region": "ra", "weight": 3}]}, "unknown_field", "capacities[0]"),
    ({"demand": {"ra": -1}}, "invalid_number", "demand.ra"),
    ({"demand": {"ra": "lots"}}, "invalid_number", "demand.ra"),
    ({"demand": {"pluto": 5}}, "unknown_region", "demand"),
    ({"surprise": 1}, "unknown_field", "surprise"),
])
def test_what_if_refuses_bad_input_with_a_code_and_the_field(alice, two_regions, body, code, field) -> None:
    if "pool" not in body and code != "pool_or_inputs_required":
        body = {"pool": two_regions.pool.pk, **body}
    response = alice.client.post(WHAT_IF, body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert field in response.json()["fields"]


def test_outsiders_get_404_for_another_tenant_s_pool(charlie, two_regions) -> None:
    pool = two_regions.pool
    response = charlie.client.post(WHAT_IF, {"pool": pool.pk, "demand": {"ra": 1}}, format="json")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert charlie.client.get(OVERFLOW, {"pool": pool.pk}).status_code == 404


def test_operators_see_every_pool_and_anonymous_callers_none(otto, anon, two_regions) -> None:
    assert otto.client.get(OVERFLOW, {"pool": two_regions.pool.pk}).status_code == 200
    assert anon.get(OVERFLOW, {"pool": two_regions.pool.pk}).status_code == 401
    assert anon.post(WHAT_IF, {"pool": two_regions.pool.pk}, format="json").status_code == 401
