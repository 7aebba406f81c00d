"""The emit points outside the fleet engine's rollout path: overflow and member health.

(change.applied after a real rollout is asserted in tests/fleets/rollout/test_rollouts.py; job.failed and
capacity.run_finished go through the same `event_emit` from the runner and the run merge; certificate
expiring/renewed are apps.acme's, tested in tests/acme.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.events.models import Event
from apps.fleets import events as emit
from apps.fleets.models import Fleet, Node, NodeHealth
from apps.traffic import services as traffic
from apps.traffic.models import TrafficSample
from tests.factories import MemberFactory, PoolFactory, PoolRegionFactory, RegionFactory

pytestmark = pytest.mark.django_db


def _types() -> list[tuple[str, str]]:
    return list(Event.objects.order_by("id").values_list("type", "data__region"))


def test_overflow_started_and_stopped_once_per_pool_and_region(acme):
    """Started after two complete overflowing buckets, stopped after three calm ones, each once, with the
    figures of the buckets that decided it."""
    pool = PoolFactory(lb__org=acme, org=acme)
    for slug in ("ra", "rb"):
        PoolRegionFactory(pool=pool, region=RegionFactory(slug=slug), max_rate_per_member=10)
    t0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)

    def sample(at, sent_to):
        TrafficSample.objects.create(time=at, pool=pool, node="f/n1", region="ra", request_rate=20,
                                     served_local=20 - sum(sent_to.values()), sent_to=sent_to)
        traffic.overflow_bucket_refresh(pool_id=pool.pk, time=at)

    sample(t0, {})
    assert _types() == []
    sample(t0 + timedelta(seconds=20), {"rb": 5})
    sample(t0 + timedelta(seconds=21), {"rb": 6})  # the same bucket again: still one bucket
    sample(t0 + timedelta(seconds=30), {"rb": 4})  # the next bucket: the first one is complete now
    assert _types() == []  # one complete overflowing bucket is not yet overflow
    sample(t0 + timedelta(seconds=40), {"rb": 4})  # two complete overflowing buckets
    assert _types() == [("overflow.started", "ra")]
    started = Event.objects.get(type="overflow.started")
    assert started.data["out_rps"] > 0 and started.data["demand_rps"] == 20 and started.data["buckets"] == 2
    for second in (50, 60, 70):
        sample(t0 + timedelta(seconds=second), {})
    assert _types() == [("overflow.started", "ra")]  # two calm complete buckets: not yet
    sample(t0 + timedelta(seconds=80), {})
    assert _types() == [("overflow.started", "ra"), ("overflow.stopped", "ra")]
    stopped = Event.objects.get(type="overflow.stopped")
    assert stopped.data["demand_rps"] == 20 and stopped.data["out_rps"] == 0  # true figures, not 0.0 demand
    assert set(Event.objects.values_list("org_id", "object_id")) == {(acme.pk, str(pool.pk))}


def test_steady_overflow_seen_by_two_nodes_at_different_moments_does_not_flap(acme):
    """Two nodes sample at their own moments; a new bucket first holds one node's sample. Events flapped
    (stopped with demand 0.0, then started) every 10 s under steady overflow."""
    pool = PoolFactory(lb__org=acme, org=acme)
    for slug in ("ra", "rb"):
        PoolRegionFactory(pool=pool, region=RegionFactory(slug=slug), max_rate_per_member=10)
    t0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
    for second in range(0, 300, 2):
        at = t0 + timedelta(seconds=second)
        node = "f/n1" if second % 4 == 0 else "f/n2"
        out = 8.0 if node == "f/n1" else 0.0  # n1's ingress overflows, n2's does not
        TrafficSample.objects.create(time=at, pool=pool, node=node, region="ra", request_rate=20,
                                     served_local=20 - out, sent_to={"rb": out} if out else {})
        traffic.overflow_bucket_refresh(pool_id=pool.pk, time=at)
    assert _types() == [("overflow.started", "ra")]


def test_member_health_changed_once_per_member_across_nodes(acme):
    region = RegionFactory(slug="eu-west")
    member = MemberFactory(pool=PoolFactory(lb__org=acme, org=acme), region=region, name="app1")
    fleet = Fleet.objects.create(name="eu", region=region)
    nodes = [Node.objects.create(fleet=fleet, name=f"n{i}", address=f"127.0.0.{i + 1}") for i in range(2)]
    proxy = f"p{member.pool_id}_eu-west"

    def collect(status):
        before = emit.member_health_before(nodes)
        rows = [NodeHealth(node=n, proxy=proxy, server="app1", status=status, updated_at=timezone.now())
                for n in nodes]
        NodeHealth.objects.bulk_create(rows, update_conflicts=True, unique_fields=["node", "proxy", "server"],
                                       update_fields=["status", "updated_at"])
        emit.member_health_changed(before, rows)

    collect("UP")      # first sight: nothing to compare with
    collect("UP 1/3")  # still up
    collect("DOWN")
    collect("UP")
    collect("MAINT")   # an admin's choice, not health: no event either way
    collect("UP")
    events = list(Event.objects.order_by("id").values_list("type", "org_id", "object_repr", "data__status"))
    assert events == [("member.health_changed", acme.pk, f"{member.pool.name}/app1", "down"),
                      ("member.health_changed", acme.pk, f"{member.pool.name}/app1", "up")]



def test_a_failed_rollout_tells_a_customer_it_failed_but_not_the_operators_details(acme, ops):
    """The rollout's error names the operator's nodes and may quote other tenants' config lines: the
    customer's LB event (its webhooks and event list) says only that it failed, as its pages do; the
    operator's fleet event keeps the detail."""
    from apps.balancers.models import LoadBalancer
    from apps.fleets.models import ConfigRevision, Rollout

    fleet = Fleet.objects.create(name="edge", region=RegionFactory(slug="us-east"))
    mine = LoadBalancer.objects.create(org=acme, name="shop", fleet=fleet)
    shared = LoadBalancer.objects.create(org=ops, name="edge-shared", fleet=fleet, shared=True)
    revision = ConfigRevision.objects.create(fleet=fleet, number=2, text="", sha256="0" * 64,
                                             lb_revisions={str(mine.pk): 4, str(shared.pk): 7})
    rollout = Rollout.objects.create(fleet=fleet, revision=revision)
    error = "node edge-secret-7 (10.9.8.7): [ALERT] backend p99_globex-shop: server globex-db has no address"

    emit.rollout_finished(rollout, Rollout.Status.FAILED, error)

    by_lb = {e.object_id: e for e in Event.objects.filter(type="rollout.failed", object_type="loadbalancer")}
    customer = by_lb[str(mine.pk)]
    assert customer.org == acme and customer.data["revision"] == 4 and customer.data["fleet"] == "edge"
    text = str(customer.data) + customer.object_repr
    assert "edge-secret-7" not in text and "10.9.8.7" not in text and "globex" not in text
    assert "an operator can see the details" in customer.data["error"]
    assert by_lb[str(shared.pk)].data["error"] == error  # the operator's own LB
    assert Event.objects.get(type="rollout.failed", org=None).data["error"] == error  # the fleet's


def test_a_canary_stop_tells_a_customer_what_happened_without_the_operators_node(acme, ops):
    """The canary's reason names the operator's node and its figures: the customer's LB event says its change
    stopped at the first node and that no other node saw it; the operator's fleet event keeps the figures."""
    from apps.balancers.models import LoadBalancer
    from apps.fleets.models import ConfigRevision, Rollout

    fleet = Fleet.objects.create(name="edge", region=RegionFactory(slug="us-east"))
    node = Node.objects.create(fleet=fleet, name="edge-secret-7", address="10.9.8.7", runtime_dir="/r",
                               config_dir="/c")
    mine = LoadBalancer.objects.create(org=acme, name="shop", fleet=fleet)
    revision = ConfigRevision.objects.create(fleet=fleet, number=2, text="", sha256="0" * 64,
                                             lb_revisions={str(mine.pk): 4})
    rollout = Rollout.objects.create(fleet=fleet, revision=revision, stopped_by_canary=True)
    reason = "canary edge-secret-7: 5xx rose from 0.0% to 69.1% of requests (+69.1 points, guard 5)"

    emit.canary_failed(rollout, node, reason)

    customer = Event.objects.get(type="rollout.canary_failed", object_type="loadbalancer")
    assert customer.org == acme and customer.data["revision"] == 4
    assert "edge-secret-7" not in str(customer.data) and "the other nodes never saw it" in customer.data["reason"]
    operator = Event.objects.get(type="rollout.canary_failed", object_type="fleet")
    assert operator.data["reason"] == reason and operator.data["node"] == "edge-secret-7"
