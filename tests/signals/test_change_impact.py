"""A change's page: the changed route's 5 minutes before against the 5 after, flagged past the guards an operator
sets on the fleets serving it; another tenant's change reads as a missing one, and a removed member reads
nothing. The page in Chromium shows the flag and the chart with the change on it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.accounts.models import Membership
from apps.audit.models import AuditEvent
from apps.balancers.models import Region
from apps.fleets.models import Fleet
from apps.signals import hist, services
from apps.signals.models import SignalBucket
from tests.browser import login, shot
from tests.factories import LoadBalancerFactory, PoolFactory, RouteFactory

pytestmark = pytest.mark.django_db


def _buckets(route, around: datetime, *, before: tuple[int, int], after: tuple[int, int]) -> None:
    """(requests, 5xx) spread over the minute before and the minute after `around`."""
    edge = int(around.timestamp()) // services.FINE_STEP_S * services.FINE_STEP_S
    for (requests, s5xx), starts in ((before, range(edge - 60, edge, 5)), (after, range(edge, edge + 60, 5))):
        each, errors = requests // len(starts), s5xx // len(starts)
        for start in starts:
            counts = hist.new()
            counts[hist.index(12)] = each
            SignalBucket.objects.create(
                kind="route", ref_id=route.pk, start=datetime.fromtimestamp(start, UTC),
                step_s=services.FINE_STEP_S, org_id=route.org_id, lb_id=route.lb_id, requests=each,
                s2xx=each - errors, s5xx=errors, t_total=hist.sparse(counts))


@pytest.fixture
def changed(alice, acme):
    """alice re-prioritises her route through the API; 120 requests before it, 120 after, half of them 5xx."""
    lb = LoadBalancerFactory(org=acme)
    pool = PoolFactory(lb=lb, org=acme)
    route = RouteFactory(lb=lb, org=acme, path="/shop", pool=pool)
    answer = alice.client.patch(f"/api/v1/routes/{route.pk}/", {"priority": 5}, format="json")
    assert answer.status_code == 200, answer.content
    event = AuditEvent.objects.get(action="route.update", object_id=str(route.pk))
    _buckets(route, event.at, before=(120, 0), after=(120, 60))
    return lb, route, event


def test_a_change_after_which_5xx_rose_is_flagged_with_the_figures(changed, alice):
    _, route, event = changed
    answer = alice.client.get(f"/api/v1/signals/changes/{event.pk}/")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    impact = body["impact"]
    assert (body["scope"], body["target_id"]) == ("route", route.pk)
    assert impact["before"]["requests"] == 120 and impact["before"]["error_pct"] == 0.0
    assert impact["after"]["requests"] == 120 and impact["after"]["error_pct"] == 50.0
    assert impact["flagged"] and impact["reasons"] == [
        "5xx rose from 0.0% to 50.0% of requests (+50.0 points, guard 5)"]
    assert sum(impact["chart"]["requests"]) == 240
    assert impact["chart"]["markers"][0]["t"] == event.at.timestamp()


def test_the_operators_guard_on_the_serving_fleet_decides_the_flag(changed, alice):
    lb, _, event = changed
    fleet = Fleet.objects.create(name="acme-east", region=Region.objects.get_or_create(slug="us-east")[0],
                                 guard_5xx_rise_pct=60.0)
    lb.fleet = fleet
    lb.save(update_fields=["fleet"])
    impact = alice.client.get(f"/api/v1/signals/changes/{event.pk}/").json()["impact"]
    assert not impact["flagged"] and impact["judged"] and impact["guards"]["max_5xx_rise_pct"] == 60.0


def test_too_few_requests_are_not_judged(alice, acme):
    lb = LoadBalancerFactory(org=acme)
    route = RouteFactory(lb=lb, org=acme, path="/quiet", pool=PoolFactory(lb=lb, org=acme))
    assert alice.client.patch(f"/api/v1/routes/{route.pk}/", {"priority": 7}, format="json").status_code == 200
    event = AuditEvent.objects.get(action="route.update", object_id=str(route.pk))
    _buckets(route, event.at, before=(120, 0), after=(12, 12))
    impact = alice.client.get(f"/api/v1/signals/changes/{event.pk}/").json()["impact"]
    assert not impact["judged"] and not impact["flagged"]


def test_another_tenants_change_is_a_missing_one_and_a_removed_member_reads_nothing(changed, alice, charlie, acme):
    _, _, event = changed
    foreign = charlie.client.get(f"/api/v1/signals/changes/{event.pk}/")
    missing = charlie.client.get("/api/v1/signals/changes/99999999/")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["code"] == missing.json()["code"] == "not_found"
    Membership.objects.filter(user=alice.user, org=acme).delete()
    assert alice.client.get(f"/api/v1/signals/changes/{event.pk}/").status_code in (401, 403)


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_change_page_shows_the_flag_and_the_chart(alice, acme, page, live_server):
    lb = LoadBalancerFactory(org=acme)
    route = RouteFactory(lb=lb, org=acme, path="/shop", pool=PoolFactory(lb=lb, org=acme))
    assert alice.client.patch(f"/api/v1/routes/{route.pk}/", {"priority": 5}, format="json").status_code == 200
    # Made 90 s ago (the log is append-only to the app, not to a test moving time): the minute after it is past.
    AuditEvent.objects.filter(action="route.update", object_id=str(route.pk)).update(
        at=datetime.now(UTC) - timedelta(seconds=90))
    event = AuditEvent.objects.get(action="route.update", object_id=str(route.pk))
    _buckets(route, event.at, before=(120, 0), after=(120, 60))
    alice.user.set_password("alice-pass-123")
    alice.user.save()
    login(page, "alice", "alice-pass-123")
    page.goto(f"{live_server.url}/load-balancers/{lb.pk}/")
    page.locator("#lb-change-table a", has_text="route.update").click()
    flag = page.get_by_test_id("change-flag")
    flag.wait_for()
    assert "Flagged" in flag.inner_text() and "5xx rose from 0.0% to 50.0%" in flag.inner_text()
    sides = page.get_by_test_id("change-sides").inner_text()
    assert "120" in sides and "50.0%" in sides
    page.locator("[data-testid=change-impact] .signals-chart canvas").first.wait_for()
    shot(page, "signals-change-flagged")
