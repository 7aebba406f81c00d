"""A rollout never undoes the enforcement loop's values: a capacity change re-renders the chain maps with new static
shares, and the node takes the change at run time (no reload) keeping the live values the loop set, which the
static ones would replace until its next run (a failed-over region took requests again at every such rollout:
make bench-steering's failover reaction was 3.1 s)."""

from __future__ import annotations

import pytest

from apps.balancers.models import PoolRegion
from apps.fleets.config.render.chain import ENFORCER_MAPS, LIMITS_MAP, UNLIMITED
from apps.fleets.node.apply import NodePlan, apply_node
from apps.fleets.node.runtime_api import HAProxySocket
from tests.traffic.livekit import NODES, node_bundle, start

pytestmark = [pytest.mark.django_db, pytest.mark.haproxy]


def test_a_capacity_rollout_keeps_the_enforcers_limits_without_a_reload(two_regions, haproxy_node,
                                                                       tiny_backend) -> None:
    fleet = start(two_regions, haproxy_node, tiny_backend)
    node, conn = fleet.nodes["ra1"]
    before = node_bundle(node, conn, NODES[node.name][1])
    first = apply_node(NodePlan(conn=conn, bundle=before, last_good=None))  # the product's own layout on disk
    assert first.ok, first
    sock = HAProxySocket(conn.stats_socket_path)
    backend = f"p{fleet.pool.pk}_ra"
    sock.command(f"set map {LIMITS_MAP} {backend} 7")  # what the loop set: not the static share
    PoolRegion.objects.filter(pool=fleet.pool, region=two_regions.a).update(max_rate_per_member=5)
    after = node_bundle(node, conn, NODES[node.name][1])
    after_limits, before_limits = after.rendered_manifest.maps[LIMITS_MAP], before.rendered_manifest.maps[LIMITS_MAP]
    assert dict(after_limits) != dict(before_limits)  # new static shares
    outcome = apply_node(NodePlan(conn=conn, bundle=after, last_good=before, worker_pid=first.worker_pid,
                                  keep_live_values=ENFORCER_MAPS))  # what a rollout asks while the enforcer runs
    assert outcome.ok, outcome
    assert not outcome.reloaded and outcome.worker_pid == first.worker_pid
    assert dict(sock.show_map(LIMITS_MAP))[backend] == "7"


def test_without_an_enforcer_a_rollout_serves_the_rendered_shares(two_regions, haproxy_node, tiny_backend) -> None:
    """No loop owns the values (none runs): the static shares a capacity change rendered are served at once."""
    fleet = start(two_regions, haproxy_node, tiny_backend)
    node, conn = fleet.nodes["ra1"]
    before = node_bundle(node, conn, NODES[node.name][1])
    first = apply_node(NodePlan(conn=conn, bundle=before, last_good=None))
    sock = HAProxySocket(conn.stats_socket_path)
    backend = f"p{fleet.pool.pk}_ra"
    sock.command(f"set map {LIMITS_MAP} {backend} {UNLIMITED}")  # a capacity test's hold, long over
    PoolRegion.objects.filter(pool=fleet.pool, region=two_regions.a).update(max_rate_per_member=5)
    after = node_bundle(node, conn, NODES[node.name][1])
    outcome = apply_node(NodePlan(conn=conn, bundle=after, last_good=before, worker_pid=first.worker_pid))
    assert outcome.ok and not outcome.reloaded, outcome
    assert dict(sock.show_map(LIMITS_MAP))[backend] == dict(after.rendered_manifest.maps[LIMITS_MAP])[backend]
