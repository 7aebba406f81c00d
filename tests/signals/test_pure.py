"""The pure parts of golden signals: the log line, the histograms, the route index and the sums."""

from __future__ import annotations

import random

import pytest

from apps.balancers.routing import RouteRow, resolve_route
from apps.signals import hist
from apps.signals.aggregate import LISTENER, MEMBER, ROUTE, Aggregator, Dims, Resolved
from apps.signals.logline import parse
from apps.signals.routeindex import IndexedRoute, RouteIndex


def test_a_line_haproxy_sent_is_read_field_by_field():
    r = parse(b"spw1 edge/n1 fe_shop.https~ p3_us-east web-2 503 1 2 -1 3005 +3 sC-- 217 /api/x shop.example\n")
    assert r is not None
    assert (r.node, r.frontend, r.backend, r.server, r.status) == (
        "edge/n1", "fe_shop.https", "p3_us-east", "web-2", 503)
    assert (r.t_queue, r.t_connect, r.t_upstream, r.t_total) == (1, 2, -1, 3005)
    assert (r.retries, r.redispatched, r.by_proxy) == (3, True, True)  # a server timeout: HAProxy's own 503
    assert (r.path, r.host) == ("/api/x", "shop.example")


def test_a_host_with_spaces_stays_in_the_last_field_and_foreign_lines_are_ignored():
    r = parse(b"spw1 e/n1 fe_a.http p1_eu s1 200 0 0 1 1 0 ---- 5 /p a b c")
    assert r is not None and r.host == "a b c" and r.path == "/p" and not r.by_proxy
    assert parse(b"Proxy fe_a.http stopped (cumulated conns: FE: 38, BE: 0).") is None
    assert parse(b"spw1 too few fields") is None
    assert parse(b"spw9 e/n1 fe_a.http p1_eu s1 200 0 0 1 1 0 ---- 5 /p h") is None
    assert parse(b"spw1 e/n1 fe_a.http fe_a.http <NOSRV> 404 -1 -1 -1 0 0 LR-- 80 /nf h").server is None
    cut = parse(b"spw1 e/n1 fe_a.http p1_eu s1 200 0 0 1 1 0 ---- 5 /" + b"x" * 3000)  # cut by the node's `len`
    assert cut is not None and cut.status == 200 and cut.host == ""


@pytest.mark.parametrize("true_ms", [1, 7, 33, 180, 950, 4_200, 30_000])
def test_a_percentile_from_the_buckets_is_within_12_percent(true_ms):
    rng = random.Random(true_ms)
    samples = [max(1, int(rng.gauss(true_ms, true_ms * 0.2))) for _ in range(5_000)]
    counts = hist.new()
    for ms in samples:
        counts[hist.index(ms)] += 1
    for q in (0.5, 0.95, 0.99):
        exact = sorted(samples)[int(q * len(samples)) - 1]
        assert abs(hist.percentile(counts, q) - exact) <= max(1.0, 0.12 * exact), (q, exact)
    assert hist.merged([hist.sparse(counts), hist.sparse(counts)]) == [2 * n for n in counts]
    assert hist.percentile(hist.new(), 0.99) is None


def test_the_route_index_answers_as_the_routing_rule_does():
    rng = random.Random(7)
    hosts = ["a.ex.org", "b.ex.org", "*.ex.org", "x.a.ex.org", "*.a.ex.org"]  # wildcards over 2+ labels, as claimed
    paths = ["/", "/api", "/api/v1", "/apix", "/static", "/api/"]
    routes = [IndexedRoute(i, rng.randrange(1, 50), tuple(rng.sample(hosts, rng.randrange(0, 3))),
                           rng.choice(["prefix", "exact"]), rng.choice(paths), 1) for i in range(1, 60)]
    index = RouteIndex(routes)
    rows = [RouteRow(r.id, r.priority, r.hosts, r.path_match, r.path) for r in routes]
    for host in ["a.ex.org", "b.ex.org", "c.ex.org", "x.a.ex.org", "y.x.a.ex.org", "other.org"]:
        for path in ["/", "/api", "/api/", "/api/v1", "/api/v1/items", "/apix", "/static/app.js", "/static", "/no"]:
            want = resolve_route(rows, host, path)
            got = index.resolve(host, path)
            assert (got.id if got else None) == (want.id if want else None), (host, path)
            assert index.resolve(host, path) is got  # the second answer comes from the cache


def test_sums_go_to_the_listener_per_node_the_route_and_the_member_per_node_of_their_bucket():
    agg = Aggregator(step_s=5)
    line = b"spw1 edge/n1 fe_a.http p1_eu s1 %d 0 1 %d %d %s %s 10 /api h"
    resolved = Resolved((1, Dims(9, 1)), (7, Dims(9, 1)), (3, Dims(9, 1, 1, "eu")))
    agg.add(parse(line % (200, 20, 21, b"0", b"----")), resolved, now=1000.2)
    agg.add(parse(line % (502, -1, 5, b"+1", b"SH--")), resolved, now=1004.9)
    agg.add(parse(line % (500, 30, 31, b"0", b"----")), resolved, now=1005.0)  # the next bucket
    agg.add(parse(line % (200, 1, 1, b"0", b"----")), Resolved(None, None, None), now=1005.0)
    agg.add(parse(line % (200, 1, 1, b"0", b"----")), resolved, now=990.0, closed_before=995)
    assert (agg.unknown, agg.late) == (1, 1)
    due = dict(agg.due())
    first = due[(1000, (ROUTE, 7, ""))].sums
    assert (first.requests, first.s2xx, first.s5xx, first.proxy_5xx, first.retries, first.redispatches) == (
        2, 1, 1, 1, 1, 1)
    assert sum(first.t_upstream) == 1  # the 502 never had a response from the server
    assert due[(1000, (LISTENER, 1, "edge/n1"))].sums.requests == 2
    member = due[(1005, (MEMBER, 3, "edge/n1"))].sums
    assert (member.s5xx, member.proxy_5xx) == (1, 0)
    assert list(agg.due()) == []  # nothing changed since
    agg.close(before=1005)
    assert {k[0] for k in agg.open} == {1005}


@pytest.mark.parametrize("signals, tag, field", [
    (("10.0.0.5\n    log-format x", 5514), "edge/n1", "node.signals.address"),
    (("10.0.0.5", 70000), "edge/n1", "node.signals.port"),
    (("10.0.0.5", 5514), "edge/n1) str(x", "node.signals_tag"),
    (("10.0.0.5", 5514), "edge/n1\nstats socket /tmp/x", "node.signals_tag"),
])
def test_a_hostile_collector_address_or_node_name_never_reaches_the_config(signals, tag, field):
    from apps.fleets.config.render import UnsafeValue, render
    from apps.fleets.config.spec import FleetSnapshot, NodeSpec

    snap = FleetSnapshot(fleet="edge", region="us-east", revision=1, listeners=(), pools=())
    with pytest.raises(UnsafeValue) as refused:
        render(snap, NodeSpec(name="n1", runtime_dir="/run/spillway/edge", signals=signals, signals_tag=tag))
    assert refused.value.field == field
    bundle = render(snap, NodeSpec(name="n1", runtime_dir="/run/spillway/edge", signals=("10.0.0.5", 5514),
                                   signals_tag="edge/n1"))
    assert "log 10.0.0.5:5514 len 16384 format raw local0 info" in bundle.main


def test_a_flood_of_distinct_paths_grows_no_series_and_no_cache_past_its_bound():
    from apps.signals import routeindex

    routes = [IndexedRoute(i, i, (), "prefix", f"/r{i}", 1) for i in range(1, 51)]
    index = RouteIndex(routes)
    agg = Aggregator(step_s=5)
    listener = (7, Dims(1, 3, None, "us-east"))
    for i in range(routeindex.CACHE_MAX + 10_000):
        path = f"/r{i % 60}/{i}"  # every path new; 10 of 60 prefixes match no route
        found = index.resolve("shop.example", path)
        request = parse(f"spw1 f/n1 fe_a.http p1_eu s1 200 0 0 1 1 0 ---- 5 {path} shop.example".encode())
        agg.add(request, Resolved(listener, (found.id, Dims(1, 3)) if found else None, None), 1000.0)
    assert len(index._cache) == routeindex.CACHE_MAX
    assert len(agg.open) == 2 + 50  # the listener's node and all-nodes series, and one per route: not per path
