"""Failover drills without a fleet: the pure rates, checks and summary; starting one through the pool page as
each persona (attacker, viewer, another org's test, an operator acting on a tenant's pool); limits; the drain's
own expiry; lost drills. The drill on real HAProxy nodes: test_drills_live.py; in a browser: test_drill_browser.py."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import Membership
from apps.accounts.principal import Principal
from apps.balancers.models import Pool
from apps.capacity import drills, services
from apps.capacity.models import CapacityTest, Drill
from apps.fleets.selectors import NodeCounters
from apps.scheduling.registry import validate_params
from apps.traffic import services as traffic_services
from apps.traffic.selectors import pool_steering_now, pool_steerings
from tests.personas import web


def _sample(t: float, phase: str, served: dict, capacity: dict, arrived: float = 30.0, errors: float = 0.0,
            p99: float | None = None) -> dict:
    return {"t": t, "phase": phase, "served": served, "capacity": capacity, "arrived": arrived, "errors": errors,
            "error_rate": errors / arrived if arrived else 0.0, "p99_ms": p99}


# --- pure ---------------------------------------------------------------------------------------------------


def test_rates_count_shed_requests_as_failed_and_a_restarted_counter_from_zero() -> None:
    before = {"n1": NodeCounters(arrived=100, shed=4, served={"ra": 86, "rb": 10}, failed={"ra": 0, "rb": 0}),
              "n2": NodeCounters(arrived=500, served={"ra": 500}, failed={"ra": 2})}
    after = {"n1": NodeCounters(arrived=130, shed=14, served={"ra": 86, "rb": 30}, failed={"ra": 0, "rb": 1}),
             "n2": NodeCounters(arrived=20, served={"ra": 20}, failed={"ra": 0}),  # reloaded: counts from zero
             "n3": NodeCounters(arrived=999, served={"ra": 999})}  # new: no earlier reading, not counted
    got = drills.rates(before, after, 2.0)
    # n1: 30 arrived, 20 served (rb), 10 shed by the node itself, 1 failed at a member.
    assert got == {"served": {"ra": 10.0, "rb": 10.0}, "arrived": 25.0, "failed": 0.5, "unanswered": 5.0,
                   "errors": 5.5}


def test_a_request_between_arrival_and_its_backend_at_a_reading_is_no_error() -> None:
    """Arrival and dispatch are counted a moment apart (on a busy machine a node's thread can stop between them
    while the reading runs): a reading sees one request arrived and not yet sent. The node's own count of shed
    answers says nothing failed (a drill failed its 1% SLO on such a request: 1 of 90 at the window's edge)."""
    before = {"n1": NodeCounters(arrived=100, shed=0, served={"rb": 100}, failed={"rb": 0})}
    waiting = {"n1": NodeCounters(arrived=130, shed=0, served={"rb": 129}, failed={"rb": 0})}
    assert drills.rates(before, waiting, 1.0)["errors"] == 0.0
    # A node whose config predates the count (no gpc0): inferred, and a window nets the request out.
    old = {k: NodeCounters(arrived=v.arrived, shed=None, served=v.served, failed=v.failed) for k, v in before.items()}
    old_waiting = {"n1": NodeCounters(arrived=130, shed=None, served={"rb": 129}, failed={"rb": 0})}
    assert drills.rates(old, old_waiting, 1.0)["unanswered"] == 1.0
    waiting = {"arrived": 15.0, "failed": 0.0, "unanswered": 1.0, "errors": 1.0}
    caught_up = {"arrived": 15.0, "failed": 0.0, "unanswered": -1.0, "errors": 0.0}
    assert drills.window_errors([waiting, caught_up, {**caught_up, "unanswered": 0.0}]) == 0.0
    shed = {"arrived": 15.0, "failed": 1.0, "unanswered": 3.0, "errors": 4.0}
    assert drills.window_errors([shed, caught_up]) == 1.0 + 2.0


def _drill(**kw) -> Drill:
    from apps.balancers.models import Region

    return Drill(region=Region(slug="ra"), share=kw.pop("share", 1.0), slo_error_rate=kw.pop("slo", 0.01),
                 slo_p99_ms=kw.pop("p99", None), duration_s=10)


def test_error_rate_is_judged_over_the_last_three_seconds() -> None:
    d = _drill(slo=0.2)
    ok = _sample(1, "drained", {"rb": 30}, {"rb": 80})
    bad = _sample(2, "drained", {"rb": 20}, {"rb": 80}, errors=10)
    assert drills.check(d, [bad, bad]) is None  # not yet a full window
    assert drills.check(d, [bad, bad, ok, ok, bad]) is None  # 10 of 90 over the last 3 s: 11% <= 20%
    code, reason = drills.check(d, [ok, bad, bad, bad])
    assert code == "error_rate" and reason == "33.3% of requests failed over the last 3 s (the drill allows 20.0%)"
    # The capacity test's clients saw worse than the nodes: theirs counts.
    assert drills.check(d, [ok, ok, ok], client={"sent": 100, "errors": 25})[0] == "error_rate"


def test_over_capacity_needs_three_seconds_in_a_row() -> None:
    d = _drill()
    over = _sample(1, "drained", {"rb": 95}, {"rb": 80})
    fine = _sample(1, "drained", {"rb": 85}, {"rb": 80})  # within 10%
    assert drills.check(d, [over, over, fine]) is None
    code, reason = drills.check(d, [fine, over, over, over])
    assert code == "over_capacity" and reason.startswith("rb served 95 req/s for 3 s, over its capacity of 80")
    assert drills.check(d, [over] * 3 + [_sample(5, "drained", {"rb": 95}, {"rb": None})]) is None  # unlimited


def test_p99_breaks_the_slo_only_when_the_drill_names_one() -> None:
    slow = _sample(1, "drained", {"rb": 30}, {"rb": 80}, p99=450.0)
    assert drills.check(_drill(), [slow]) is None
    assert drills.check(_drill(p99=200.0), [slow])[0] == "p99"


def test_summary_says_what_moved_where_and_how_fast() -> None:
    d = _drill()
    caps = {"ra": 40, "rb": 80}
    samples = [_sample(1, "baseline", {"ra": 30, "rb": 0}, caps), _sample(2, "baseline", {"ra": 30, "rb": 0}, caps),
               _sample(3, "drained", {"ra": 12, "rb": 18}, {"ra": 0, "rb": 80}),
               _sample(4, "drained", {"ra": 0, "rb": 30}, {"ra": 0, "rb": 80}),
               _sample(5, "drained", {"ra": 0, "rb": 32}, {"ra": 0, "rb": 80}),
               _sample(6, "restored", {"ra": 25, "rb": 5}, caps)]
    s = drills.summarize(d, samples)
    assert s["before"] == {"ra": 30.0, "rb": 0.0}
    assert s["during"] == {"ra": 0.0, "rb": 31.0}  # from the first settled second on
    assert s["moved"] == {"ra": -30.0, "rb": 31.0}
    assert s["react_s"] == 2.0 and s["peak_utilization"]["rb"] == 0.4
    assert drills.describe(s) == "rb +31 req/s, in 2 s"


# --- through the product -------------------------------------------------------------------------------------


def _post(persona, pool: Pool, **fields):
    data = {"region": "ra", "share_pct": "100", "duration_s": "30", "slo_error_rate_pct": "1", **fields}
    return web(persona).post(f"/capacity/pools/{pool.pk}/drills/", data, HTTP_HX_REQUEST="true")


def test_an_editor_starts_a_drill_from_the_pool_page(bob, two_regions, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        response = _post(bob, two_regions.pool, duration_s="12", share_pct="50")
    assert response.status_code == 200 and response["HX-Redirect"].startswith("/capacity/drills/")
    drill = Drill.objects.get()
    assert (drill.region.slug, drill.share, drill.duration_s, drill.status) == ("ra", 0.5, 12.0, "pending")
    assert drill.requested_by == f"user:{bob.user.pk}" and len(callbacks) == 1  # the task, once committed
    page = web(bob).get(f"/capacity/drills/{drill.pk}/")
    assert page.status_code == 200 and "drain 50% of ra for 12 s" in page.content.decode()


@pytest.mark.parametrize(("fields", "code"), [
    ({"region": "nowhere"}, "invalid_region"),
    ({"region": "ra\nbackend x"}, "invalid_region"),
    ({"share_pct": "0"}, "invalid_drill"),
    ({"share_pct": "150"}, "invalid_drill"),
    ({"share_pct": "nan"}, "invalid_drill"),
    ({"share_pct": "abc"}, "invalid_drill"),
    ({"duration_s": "1"}, "invalid_drill"),
    ({"duration_s": "1e9"}, "invalid_drill"),
    ({"slo_error_rate_pct": "-1"}, "invalid_drill"),
    ({"slo_p99_ms": "200"}, "p99_needs_test"),
])
def test_bad_drills_are_refused_with_a_code_and_nothing_runs(alice, two_regions, fields, code) -> None:
    response = _post(alice, two_regions.pool, **fields)
    assert response.status_code == 422 and f"<code>{code}</code>" in response.content.decode()
    assert not Drill.objects.exists()


def test_a_viewer_cannot_drill_and_sees_no_form(vera, two_regions) -> None:
    assert "Run drill now" not in web(vera).get(f"/capacity/pools/{two_regions.pool.pk}/drills/").content.decode()
    response = _post(vera, two_regions.pool)
    assert response.status_code == 422 and "<code>read_only</code>" in response.content.decode()
    assert not Drill.objects.exists()


def test_an_outsider_finds_neither_the_pool_nor_its_drills(alice, charlie, two_regions) -> None:
    drill = services.drill_start(principal=Principal(org=alice.org, role="owner"), pool=two_regions.pool,
                                 region="ra", duration_s=10)
    client = web(charlie)
    assert _post(charlie, two_regions.pool).status_code == 404
    for url in (f"/capacity/pools/{two_regions.pool.pk}/drills/", f"/capacity/drills/{drill.pk}/",
                f"/capacity/drills/{drill.pk}/progress/", f"/capacity/drills/{drill.pk}/chart.json"):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/capacity/drills/{drill.pk}/cancel/").status_code == 404
    assert Drill.objects.get(pk=drill.pk).status == "pending" and Drill.objects.count() == 1


def test_nobody_drives_a_pool_with_another_orgs_capacity_test(alice, otto, two_regions, globex) -> None:
    """Acting on behalf of a tenant: not even an operator may aim globex's test (its load, its budget) at acme's
    pool; the tenant's form answers like a missing test."""
    theirs = CapacityTest.objects.create(org=globex, name="theirs", steps=[[10, 5]])
    response = _post(alice, two_regions.pool, test=str(theirs.pk))
    assert response.status_code == 422 and "<code>not_found</code>" in response.content.decode()
    with pytest.raises(Exception, match="Capacity test not found"):
        services.drill_start(principal=Principal(org=otto.org, role="admin"), pool=two_regions.pool, region="ra",
                             test=theirs, duration_s=10)
    assert not Drill.objects.exists()


def test_the_failover_drill_job_validates_its_pool_region_and_test_in_the_jobs_org(alice, two_regions,
                                                                                   globex) -> None:
    from apps.balancers.models import PoolRegion

    principal = Principal(org=alice.org, role="owner")
    pr = PoolRegion.objects.get(pool=two_regions.pool, region__slug="ra")
    assert validate_params("failover_drill", {"pool_region": "acme-edge/web/ra", "duration_s": 30},
                           principal)["pool_region"] == pr.pk
    theirs = CapacityTest.objects.create(org=globex, name="theirs", steps=[[10, 5]])
    with pytest.raises(Exception, match="not found"):
        validate_params("failover_drill", {"pool_region": pr.pk, "test": theirs.pk}, principal)
    with pytest.raises(Exception, match="not found"):
        validate_params("failover_drill", {"pool_region": pr.pk},
                        Principal(org=globex, role="owner"))  # globex's job, acme's pool
    with pytest.raises(Exception, match="share must be between"):
        validate_params("failover_drill", {"pool_region": pr.pk, "share": 2}, principal)


def test_one_drill_per_pool_and_two_per_org_at_once(alice, charlie, two_regions) -> None:
    from tests.factories import LoadBalancerFactory, PoolFactory, PoolRegionFactory

    owner = Principal(org=alice.org, role="owner")
    services.drill_start(principal=owner, pool=two_regions.pool, region="ra", duration_s=10)
    with pytest.raises(Exception, match="already running") as busy:
        services.drill_start(principal=owner, pool=two_regions.pool, region="rb", duration_s=10)
    assert busy.value.code == "drill_running"
    pools = []
    for name in ("p2", "p3"):
        pool = PoolFactory(lb=two_regions.lb, org=alice.org, name=name)
        PoolRegionFactory(pool=pool, region=two_regions.a)
        PoolRegionFactory(pool=pool, region=two_regions.b)
        pools.append(pool)
    services.drill_start(principal=owner, pool=pools[0], region="ra", duration_s=10)
    with pytest.raises(Exception, match="At most 2 drills") as many:
        services.drill_start(principal=owner, pool=pools[1], region="ra", duration_s=10)
    assert (many.value.code, many.value.status) == ("too_many_drills", 429)
    # Another tenant is served meanwhile: the limit is acme's alone.
    theirs = PoolFactory(lb=LoadBalancerFactory(name="globex-edge", org=charlie.org), org=charlie.org, name="web")
    PoolRegionFactory(pool=theirs, region=two_regions.a)
    PoolRegionFactory(pool=theirs, region=two_regions.b)
    assert services.drill_start(principal=Principal(org=charlie.org, role="admin"), pool=theirs, region="ra",
                                duration_s=10).status == "pending"


def test_a_removed_member_can_no_longer_drill(bob, two_regions) -> None:
    client = web(bob)
    Membership.objects.filter(user=bob.user).delete()
    response = client.post(f"/capacity/pools/{two_regions.pool.pk}/drills/", {"region": "ra"},
                           HTTP_HX_REQUEST="true")
    assert response.status_code in (302, 401, 403, 404) and not Drill.objects.exists()


def test_a_drill_drain_expires_by_itself(alice, two_regions) -> None:
    """A drill whose worker died: the drain is gone after its time to live, whatever else happens."""
    pool = two_regions.pool
    traffic_services.drill_drain(pool_id=pool.pk, region="ra", share=1.0, ttl_s=1)
    assert "ra" in pool_steering_now(pool).drained
    assert "drained now: ra" in web(alice).get(f"/traffic/pools/{pool.pk}/").content.decode()  # said while it lasts
    assert pool_steerings([pool])[pool.pk].drained == frozenset()  # a rendered config never holds a drill
    time.sleep(1.6)
    assert "ra" not in pool_steering_now(pool).drained
    traffic_services.drill_drain(pool_id=pool.pk, region="ra", share=0.4, ttl_s=5)
    assert pool_steering_now(pool).dials == {"ra": 0.6}
    traffic_services.drill_restore(pool_id=pool.pk)
    assert pool_steering_now(pool).dials == {}


def test_a_lost_drill_is_failed_and_a_pending_one_can_be_cancelled(alice, two_regions) -> None:
    owner = Principal(org=alice.org, role="owner")
    drill = services.drill_start(principal=owner, pool=two_regions.pool, region="ra", duration_s=10)
    Drill.objects.filter(pk=drill.pk).update(status="running", started_at=timezone.now())
    Drill.objects.filter(pk=drill.pk).update(updated_at=timezone.now() - timedelta(seconds=120))
    assert drills.reap_lost_drills() == 1
    drill.refresh_from_db()
    assert (drill.status, drill.failed_check) == ("failed", "lost")
    other = services.drill_start(principal=owner, pool=two_regions.pool, region="rb", duration_s=10)
    services.drill_cancel(principal=owner, drill=other)
    other.refresh_from_db()
    assert other.status == "cancelled" and other.finished_at is not None
    assert drills.drill_execute(other.pk) == "skipped"  # the task, arriving late, does nothing


def test_the_drills_api_starts_lists_and_stops_a_drill_and_keeps_other_tenants_out(alice, vera, charlie,
                                                                                    two_regions) -> None:
    pool = two_regions.pool
    response = alice.client.post("/api/v1/drills/", {"pool": pool.pk, "region": "ra", "share": 0.5,
                                                     "duration_s": 20}, format="json")
    assert response.status_code == 201, response.json()
    drill = response.json()
    assert (drill["status"], drill["share"], drill["region"]) == ("pending", 0.5, "ra")
    assert charlie.client.get(f"/api/v1/drills/{drill['id']}/").status_code == 404
    assert charlie.client.post(f"/api/v1/drills/{drill['id']}/cancel/").status_code == 404
    assert charlie.client.get("/api/v1/drills/").json()["count"] == 0
    refused = charlie.client.post("/api/v1/drills/", {"pool": pool.pk, "region": "ra"}, format="json")
    assert refused.status_code == 400 and "pool" in str(refused.json())  # another tenant's pool: does not exist
    assert vera.client.post("/api/v1/drills/", {"pool": pool.pk, "region": "rb"}, format="json").status_code in (
        403, 404)
    busy = alice.client.post("/api/v1/drills/", {"pool": pool.pk, "region": "rb"}, format="json")
    assert busy.status_code == 409 and busy.json()["code"] == "drill_running"
    bad = alice.client.post("/api/v1/drills/", {"pool": pool.pk, "region": "ra", "share": 3}, format="json")
    assert bad.status_code == 400
    stopped = alice.client.post(f"/api/v1/drills/{drill['id']}/cancel/")
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
    assert Drill.objects.count() == 1
