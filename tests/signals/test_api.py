"""Signals through the API as tenants see them: their own routes on a shared LB, nothing of anyone else's,
a missing and a foreign object alike; the roll-up keeps what the fine buckets said; /metrics and the
shipped Grafana dashboard name the same series."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from apps.signals import services
from apps.signals.models import SignalBucket
from tests.factories import LoadBalancerFactory, MemberFactory, PoolFactory, RouteFactory
from tests.signals.signalkit import signal_bucket

pytestmark = pytest.mark.django_db
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "spillway-signals.json"


@pytest.fixture
def shared(ops, acme, globex):
    """A shared LB of the operator with one route of acme's and one of globex's, traffic on both."""
    lb = LoadBalancerFactory(org=ops, shared=True)
    acme_pool, globex_pool = PoolFactory(lb=lb, org=acme), PoolFactory(lb=lb, org=globex)
    acme_route = RouteFactory(lb=lb, org=acme, path="/a", pool=acme_pool)
    globex_route = RouteFactory(lb=lb, org=globex, path="/g", pool=globex_pool)
    member = MemberFactory(pool=globex_pool)
    signal_bucket("listener", 1, org=ops, lb_id=lb.pk, requests=500, node="f/n1", region="us-east")
    signal_bucket("route", acme_route.pk, org=acme, lb_id=lb.pk, requests=100)
    signal_bucket("route", globex_route.pk, org=globex, lb_id=lb.pk, requests=400, s5xx=40)
    signal_bucket("member", member.pk, org=globex, lb_id=lb.pk, pool_id=globex_pool.pk, requests=400, s5xx=40,
            node="f/n1", upstream_ms=900)
    return lb, acme_route, globex_route, globex_pool, member


def _get(persona, **params):
    return persona.client.get("/api/v1/signals/", params)


def test_a_tenant_sees_its_own_routes_on_a_shared_lb_and_nothing_of_the_others(shared, alice, charlie, otto):
    lb, acme_route, globex_route, globex_pool, member = shared
    # The LB's chart: the operator sees all of it; each tenant only the sum of its own routes there.
    assert _get(otto, scope="lb", id=lb.pk).json()["totals"]["requests"] == 500
    assert _get(alice, scope="lb", id=lb.pk).json()["totals"]["requests"] == 100
    assert _get(charlie, scope="lb", id=lb.pk).json()["totals"]["requests"] == 400
    assert _get(alice, scope="route", id=acme_route.pk).json()["totals"]["error_ratio"] == 0.0
    # Another tenant's route, pool or member is exactly a missing one.
    for scope, pk in (("route", globex_route.pk), ("pool", globex_pool.pk), ("member", member.pk),
                      ("route", 999_999), ("node", 1)):
        answer = _get(alice, scope=scope, id=pk)
        assert (answer.status_code, answer.json()["code"]) == (404, "not_found"), (scope, pk)
    globex = _get(charlie, scope="pool", id=globex_pool.pk).json()
    assert globex["totals"]["error_ratio"] == 0.1
    assert [m["signals"]["upstream_p99_ms"] > 700 for m in globex["members"]] == [True]


def test_bad_parameters_answer_with_a_stable_code(shared, alice):
    lb = shared[0]
    for params, code in (({"scope": "planet", "id": lb.pk}, "invalid_scope"), ({"scope": "lb"}, "id_required"),
                         ({"scope": "lb", "id": lb.pk, "range": "1y"}, "invalid_range"),
                         ({"scope": "lb", "id": "1;drop"}, "id_required")):
        answer = _get(alice, **params)
        assert (answer.status_code, answer.json()["code"]) == (400, code), params


def test_a_removed_member_reads_nothing_more(shared, alice, acme):
    from apps.accounts.models import Membership

    Membership.objects.filter(user=alice.user, org=acme).delete()
    assert _get(alice, scope="lb", id=shared[0].pk).status_code in (401, 403)


def test_the_rollup_keeps_the_sums_and_the_latency_and_old_rows_go(shared):
    # A route of its own: the fixture's buckets (20 s ago) fall in the last closed window in a window's first 20 s.
    lb = shared[0]
    acme_route = RouteFactory(lb=lb, org=shared[1].org, path="/rollup")
    now = datetime.now(UTC)
    window = int(now.timestamp()) // 300 * 300 - 300
    for i in range(3):  # three fine buckets of the last closed window
        start = datetime.fromtimestamp(window + i * 5, UTC)
        SignalBucket.objects.create(kind="route", ref_id=acme_route.pk, start=start, step_s=5,
                                    org_id=acme_route.org_id, lb_id=lb.pk, requests=10, s5xx=1, t_total={"30": 10})
    old = datetime.fromtimestamp(window - 7 * 3600, UTC)
    SignalBucket.objects.create(kind="route", ref_id=acme_route.pk, start=old, step_s=5, org_id=acme_route.org_id,
                                lb_id=lb.pk, requests=1)
    services.signals_rollup(now=now)
    services.signals_rollup(now=now)  # idempotent
    coarse = SignalBucket.objects.get(kind="route", ref_id=acme_route.pk, step_s=300,
                                      start=datetime.fromtimestamp(window, UTC))
    assert (coarse.requests, coarse.s5xx, coarse.t_total) == (30, 3, {"30": 30})
    assert not SignalBucket.objects.filter(step_s=5, start__lt=now - services.FINE_KEEP).exists()


def test_metrics_and_the_grafana_dashboard_name_the_same_series(shared, client, settings):
    settings.METRICS_ALLOW_NETS = ["127.0.0.0/8"]
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    assert re.search(r'spillway_requests_per_second\{[^}]*code="5xx"[^}]*\} 0\.666', text)  # 40 in the last minute
    exposed = set(re.findall(r"^# TYPE (spillway_[a-z_0-9]+)", text, re.M))
    dashboard = json.loads(DASHBOARD.read_text())
    used = {name for panel in dashboard["panels"] for t in panel.get("targets", [])
            for name in re.findall(r"spillway_[a-z_0-9]+", t["expr"])}
    assert used and used <= exposed, used - exposed
    # Labels are ids of what the pages show: never a path, host or client.
    labels = set(re.findall(r'([a-z_]+)="', "\n".join(line for line in text.splitlines()
                                                       if line.startswith("spillway_requests_per_second"))))
    assert labels == {"level", "id", "node", "code"}


def test_fleet_guards_and_the_log_target_are_checked_at_the_edge(otto, alice):
    from apps.balancers.models import Region
    from apps.fleets.models import Fleet

    fleet = Fleet.objects.create(name="edge", region=Region.objects.get_or_create(slug="us-east")[0])
    url = f"/api/v1/fleets/{fleet.pk}/"
    for body, field in (({"canary_watch_s": 100_000}, "canary_watch_s"),
                        ({"guard_5xx_rise_pct": 0}, "guard_5xx_rise_pct"),
                        ({"guard_p99_rise_ms": -1}, "guard_p99_rise_ms"),
                        ({"signals_target": "10.0.0.5:5514\n    log 6.6.6.6:514"}, "signals_target"),
                        ({"signals_target": "collector.example:5514"}, "signals_target")):
        answer = otto.client.patch(url, body, format="json")
        assert answer.status_code == 400 and field in str(answer.json()), (body, answer.content)
    assert otto.client.patch(url, {"signals_target": "10.0.0.5:5514", "canary_watch_s": 30},
                             format="json").status_code == 200
    assert alice.client.patch(url, {"canary_watch_s": 0}, format="json").status_code == 404  # not a tenant's
    fleet.refresh_from_db()
    assert (fleet.signals_target, fleet.canary_watch_s) == ("10.0.0.5:5514", 30)


def test_a_region_chart_sums_what_arrived_at_its_nodes_for_whoever_owns_the_lbs(shared, alice, otto):
    from apps.balancers.models import Region

    region = Region.objects.get_or_create(slug="us-east")[0]
    operator = _get(otto, scope="region", id=region.pk).json()["totals"]
    assert operator["requests"] == 500
    assert _get(alice, scope="region", id=region.pk).json()["totals"]["requests"] == 0  # not acme's LB
    assert _get(alice, scope="region", id=999999).json()["code"] == "not_found"


def test_a_drift_repair_on_a_serving_node_is_a_marker_for_operators_only(shared, alice, otto):
    from apps.balancers.models import Region
    from apps.events.models import Event
    from apps.fleets.models import Fleet, Node

    lb = shared[0]
    fleet = Fleet.objects.create(name="edge", region=Region.objects.get_or_create(slug="us-east")[0])
    lb.fleet = fleet
    lb.save(update_fields=["fleet"])
    node = Node.objects.create(fleet=fleet, name="n1", address="10.0.0.1", runtime_dir="/r", config_dir="/c")
    Event.objects.create(type="drift.repaired", object_type="node", object_id=str(node.pk), object_repr=str(node))
    operator = [m["label"] for m in _get(otto, scope="lb", id=lb.pk).json()["markers"]]
    assert "system: drift.repaired on edge/n1" in operator
    assert not [m for m in _get(alice, scope="lb", id=lb.pk).json()["markers"] if m["kind"] == "drift"]


def test_a_busy_install_keeps_an_lbs_own_change_on_its_chart(shared, alice, acme):
    """A thousand other changes after it (another tenant's routes) must not push a route's change off its
    charts: the markers are filtered to the chart's objects before the newest are taken."""
    from apps.audit.models import AuditEvent

    _, acme_route, globex_route = shared[0], shared[1], shared[2]
    AuditEvent.objects.create(actor="user:1", actor_label="alice (acme)", org_id=acme.pk, action="route.update",
                              object_type="route", object_id=str(acme_route.pk))
    AuditEvent.objects.bulk_create([AuditEvent(actor="system", org_id=acme.pk, action="route.update",
                                               object_type="route", object_id=str(globex_route.pk + 1000 + i))
                                    for i in range(1_500)])
    for scope, pk in (("route", acme_route.pk), ("lb", shared[0].pk)):
        markers = _get(alice, scope=scope, id=pk, range="1h").json()["markers"]
        assert [(m["action"], m["object_id"]) for m in markers] == [("route.update", str(acme_route.pk))], scope
