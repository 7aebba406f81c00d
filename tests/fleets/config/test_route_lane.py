"""The route lane on real HAProxy nodes: route writes through the services become small revisions that end
exactly where a full render would, without a reload; anything else still renders in full.

GIVEN a 3-node local fleet rolled out by a full render,
WHEN routes are created, updated and deleted through balancers' services (which journal them) and the
fleet reconciles,
THEN each revision is a route-lane revision on the previous one (no text, only its route changes stored),
every node records it with the same worker (no reload), every node's live maps and on-disk bundle equal a
full render of the revision's snapshot, and requests follow the changed routes; a change that is not a
journaled route change (a pool's first route, a write past the journal) goes through the full render.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db.models import F

from apps.accounts.principal import Principal
from apps.balancers import services as balancers
from apps.balancers.models import LoadBalancer, Route
from apps.fleets import caches, selectors, services
from apps.fleets.config import routelane
from apps.fleets.config.render import render
from apps.fleets.models import ConfigRevision, Fleet, Node, Rollout
from tests.fleets.fleetkit import (
    LocalFleet,
    add_pool,
    live_maps_equal_a_full_render,
    make_local_fleet,
    reconcile,
    rolled_out,
    serving_local_fleet,
    workers,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


@pytest.fixture
def fleet3(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="lane", subnet=73, node_count=3) as local:
        yield local


def routes_changed(local: LocalFleet) -> None:
    """What the lb_changed receiver records for a journaled route change, minus the Celery hop."""
    Fleet.objects.filter(pk=local.fleet.pk).update(change_seq=F("change_seq") + 1, route_seq=F("route_seq") + 1)


def save_route(local: LocalFleet, route: Route, **data) -> Route:  # type: ignore[no-untyped-def]
    principal = Principal(org=local.lb.org, role="admin")
    base = {"lb": local.lb, "org": local.lb.org, "path_match": "prefix"} if route.pk is None else {}
    return balancers.route_save(principal=principal, route=route, data={**base, **data})


def lane_rollout(local: LocalFleet) -> ConfigRevision:
    routes_changed(local)
    rollout = Rollout.objects.get(pk=services.fleet_reconcile(fleet_id=local.fleet.pk)["rollouts"][-1])
    assert rollout.status == Rollout.Status.SUCCEEDED, rollout.error
    return ConfigRevision.objects.get(pk=rollout.revision_id)


def nodes_serve_a_full_render(local: LocalFleet) -> None:
    live_maps_equal_a_full_render(local)
    for node in Node.objects.filter(fleet=local.fleet).select_related("applied_revision"):
        full = render(selectors.revision_snapshot(node.applied_revision), selectors.node_spec(node))
        assert node.applied_sha256 == full.sha256, node.name


def test_route_writes_take_the_lane_and_end_as_a_full_render(fleet3: LocalFleet, tiny_backend) -> None:
    new = tiny_backend("new")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    full = rolled_out(fleet3).revision  # full render: the lane starts from here
    assert full.base_id is None and full.text
    before = workers(fleet3)

    created = save_route(fleet3, Route(), hosts=["a.example.com"], path="/hot", priority=11,
                         targets=[{"pool": pool_new, "weight": 100}])
    revision = lane_rollout(fleet3)
    assert revision.base_id == full.pk and revision.text == "" and "Route-only change" in revision.validation_output
    assert "+a.example.com/hot/ " in revision.diff
    assert f"route {created.pk} created" in revision.reason
    nodes_serve_a_full_render(fleet3)
    assert {fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {"new"}

    # Update to a redirect on a new host, then delete it: both through the lane, each on the previous one.
    save_route(fleet3, created, hosts=["b.example.com"], redirect_url="https://elsewhere.example/", targets=[])
    moved = lane_rollout(fleet3)
    assert moved.base_id == revision.pk
    # Each diff is against the revision before it: the entry the first one added is the one removed here.
    assert "-a.example.com/hot/ " in moved.diff and "+b.example.com/hot/ " in moved.diff
    assert "+a.example.com/hot/ " not in moved.diff
    nodes_serve_a_full_render(fleet3)
    status, _ = fleet3.get(fleet3.nodes[0], "/hot/x", host="b.example.com")
    assert status == 302
    assert {fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {"old"}
    balancers.object_delete(principal=Principal(org=fleet3.lb.org, role="admin"), obj=Route.objects.get(pk=created.pk))
    gone = lane_rollout(fleet3)
    assert gone.base_id == moved.pk
    assert "-b.example.com/hot/ " in gone.diff and "a.example.com/hot/" not in gone.diff
    nodes_serve_a_full_render(fleet3)
    assert {fleet3.get(n, "/hot/x", host="b.example.com")[1] for n in fleet3.nodes} == {"old"}
    assert workers(fleet3) == before, "route-only changes must not reload"

    # The lane's revision rebuilds its snapshot from the chain in a process that never held it.
    caches.reset("revision_snapshots")
    assert {r.path for ln in selectors.revision_snapshot(gone).listeners for r in ln.routes} == {"/first"}


def test_a_lane_change_skips_a_node_that_is_down_without_a_preflight_round_and_it_catches_up(
        fleet3: LocalFleet, tiny_backend, monkeypatch) -> None:
    """A route-lane rollout binds nothing new and has no canary: no node is asked anything before the apply (a
    round of every node before the first change goes live). A node that is down then is skipped as the pre-flight
    would skip it: the others serve the change, the down node is recorded down with why, and it catches up when
    it returns."""
    from apps.fleets.rollout import execute

    new = tiny_backend("new")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    rolled_out(fleet3)  # full render: the lane starts from here
    asked: list[str] = []
    real_reachable = execute.reachable
    monkeypatch.setattr(execute, "reachable", lambda conn: (asked.append(conn.name), real_reachable(conn))[1])
    n3 = Node.objects.get(fleet=fleet3.fleet, name="n3")
    fleet3.kill(n3)

    save_route(fleet3, Route(), hosts=["a.example.com"], path="/hot", priority=11,
               targets=[{"pool": pool_new, "weight": 100}])
    routes_changed(fleet3)
    rollout = Rollout.objects.get(pk=services.fleet_reconcile(fleet_id=fleet3.fleet.pk)["rollouts"][-1])

    assert rollout.revision.validation_kind == ConfigRevision.Validation.ROUTE_LANE and not rollout.canary
    assert asked == [], "a route change needs no pre-flight round"
    assert rollout.status == Rollout.Status.FAILED and "unreachable nodes catch up when they return" in rollout.error
    by_node = {r.node.name: r for r in rollout.results.select_related("node")}
    assert (by_node["n3"].status, by_node["n3"].unreachable) == ("failed", True)
    assert "n3 unreachable" in by_node["n3"].error and "catches up" in by_node["n3"].error
    assert (by_node["n1"].status, by_node["n2"].status) == ("succeeded", "succeeded")
    nodes = {n.name: n for n in Node.objects.filter(fleet=fleet3.fleet)}
    assert nodes["n3"].status == Node.Status.DOWN
    assert {fleet3.get(nodes[name], "/hot/x", host="a.example.com")[1] for name in ("n1", "n2")} == {"new"}

    monkeypatch.setattr(execute, "reachable", real_reachable)
    fleet3.start(nodes["n3"])
    services.fleet_converge(fleet=fleet3.fleet, enqueue=False)
    services.fleet_reconcile(fleet_id=fleet3.fleet.pk)
    assert {n.name: fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {
        "n1": "new", "n2": "new", "n3": "new"}


@pytest.mark.django_db(transaction=True)  # the reconcile's own transactions, as a worker runs them
def test_a_route_change_reaches_every_node_through_a_bounded_number_of_statements(
        fleet3: LocalFleet, tiny_backend, monkeypatch) -> None:
    """Every statement of a route change's reconcile is a round trip on its path and CPU of the worker and of
    PostgreSQL beside it (66 of them in session 40, 53 in 41; ~0.3-0.5 ms of worker CPU each with the ORM's compile).
    Most are compiled once (apps.core.prepared): the ORM compiled 45 of them on every change before session 44, 11
    after (CPU per reconcile on a 3-node fleet 76-84 ms -> 52-60 ms on a slow machine).
    GIVEN a fleet whose lane is ready WHEN a route is created and the fleet reconciles THEN every node serves it, the
    rollout and its node results were created running (no separate start), the reconcile took at most the budget's
    statements and ORM compilations, and no prepared statement it used fell back to the ORM: more is a regression to
    look at, fewer a budget to lower."""
    from django.db import connection
    from django.db.models.sql import compiler

    from apps.core import prepared

    statements_budget = 50
    compiled_budget = 5
    new = tiny_backend("new")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    rolled_out(fleet3)  # full render: the lane starts from here
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/warm", priority=11,
               targets=[{"pool": pool_new, "weight": 100}])
    lane_rollout(fleet3)  # the process's first lane step (challenge answers, restore check) is behind us

    save_route(fleet3, Route(), hosts=["a.example.com"], path="/hot", priority=12,
               targets=[{"pool": pool_new, "weight": 100}])
    routes_changed(fleet3)
    sent: list[str] = []

    def count(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        sent.append(sql)
        return execute(sql, params, many, context)

    compiled: list[str] = []
    for klass in (compiler.SQLCompiler, compiler.SQLUpdateCompiler, compiler.SQLInsertCompiler):
        def as_sql(self, *args, _as_sql=klass.__dict__["as_sql"], **kwargs):  # type: ignore[no-untyped-def]
            compiled.append(type(self).__name__)
            return _as_sql(self, *args, **kwargs)
        monkeypatch.setattr(klass, "as_sql", as_sql)
    with connection.execute_wrapper(count):
        result = services.fleet_reconcile(fleet_id=fleet3.fleet.pk)
    monkeypatch.undo()

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert rollout.status == Rollout.Status.SUCCEEDED, rollout.error
    assert rollout.revision.validation_kind == ConfigRevision.Validation.ROUTE_LANE
    assert rollout.started_at is not None
    assert not [q for q in sent if q.startswith('UPDATE "fleets_rollout"') and '"started_at"' in q], "created running"
    assert not [q for q in sent if q.startswith('UPDATE "fleets_noderesult"') and '"started_at"' in q], "results too"
    assert all(r.started_at is not None for r in rollout.results.all())
    assert {fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {"new"}
    assert len(sent) <= statements_budget, "\n".join(q[:120] for q in sent)
    if connection.vendor == "postgresql":
        fell_back = [p._build for p in prepared.ALL if p.refused()]
        assert not fell_back, f"prepared statements running through the ORM: {fell_back}"
    assert len(compiled) <= compiled_budget, compiled


def test_what_the_lane_cannot_prove_goes_through_the_full_render(fleet3: LocalFleet, tiny_backend) -> None:
    new, third = tiny_backend("new"), tiny_backend("third")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    rolled_out(fleet3)

    # A pool's first route adds per-pool rules to haproxy.cfg: full render, checked by `haproxy -c`.
    pool_third = add_pool(fleet3.lb, "third", (third.address, third.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/t", priority=12,
               targets=[{"pool": pool_third, "weight": 100}])
    revision = lane_rollout(fleet3)
    assert revision.base_id is None and "Configuration file is valid" in revision.validation_output

    # A route written past the services (no journal row) with the LB revision bumped: a gap, so full.
    Route.objects.filter(path="/t").update(path="/t2")
    LoadBalancer.objects.filter(pk=fleet3.lb.pk).update(revision=F("revision") + 1)
    revision = lane_rollout(fleet3)
    assert revision.base_id is None
    nodes_serve_a_full_render(fleet3)
    assert {fleet3.get(n, "/t2", host="a.example.com")[1] for n in fleet3.nodes} == {"third"}

    # Any change that is not a route change (here: only change_seq moves) also renders in full.
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/c", priority=13,
               targets=[{"pool": pool_new, "weight": 100}])
    revision = rolled_out_after_other_change(fleet3)
    assert revision.base_id is None

    # A process without the lane's state (another worker) renders in full once, then takes the lane.
    routelane.forget(fleet3.fleet.pk)
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/d", priority=14,
               targets=[{"pool": pool_new, "weight": 100}])
    assert lane_rollout(fleet3).base_id is None
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/e", priority=15,
               targets=[{"pool": pool_new, "weight": 100}])
    assert lane_rollout(fleet3).base_id is not None
    nodes_serve_a_full_render(fleet3)


def test_a_listeners_first_route_goes_through_the_full_render(fleet3: LocalFleet, caplog) -> None:
    """A listener that had no routes has no routes map in its render: its first route changes haproxy.cfg
    (the map lookups appear), so the lane declines it, and the change is served (it failed the reconcile
    with a KeyError before, and the change waited for the next converge)."""
    rolled_out(fleet3)  # the listener serves its default pool only
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/r", priority=10,
               redirect_url="https://elsewhere.example/")
    revision = lane_rollout(fleet3)
    assert revision.base_id is None and "Configuration file is valid" in revision.validation_output
    assert "route lane declined" in caplog.text and "route lane failed" not in caplog.text
    assert {fleet3.get(n, "/r/x", host="a.example.com")[0] for n in fleet3.nodes} == {302}
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/s", priority=11,
               redirect_url="https://elsewhere.example/s")
    assert lane_rollout(fleet3).base_id is not None  # from then on, the lane
    nodes_serve_a_full_render(fleet3)


def rolled_out_after_other_change(local: LocalFleet) -> ConfigRevision:
    reconcile(local.fleet)  # change_seq only, as every other change records it
    return ConfigRevision.objects.filter(fleet=local.fleet).order_by("-number").first()


def test_a_hostile_route_that_bypassed_the_api_never_reaches_a_node_through_the_lane(fleet3: LocalFleet,
                                                                                   tiny_backend) -> None:
    """GIVEN a route the API would refuse written straight through the service (a bug or a bypass upstream),
    WHEN the lane sees it in the journal, THEN the renderer's checks stop it: the full render leaves it out as
    a problem for its owner, and no node's maps or config carry the injected text."""
    new = tiny_backend("new")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    rolled_out(fleet3)
    hostile = save_route(fleet3, Route(), hosts=["a.example.com"], path="/x }\nbind :1\n", priority=11,
                         targets=[{"pool": pool_new, "weight": 100}])
    routes_changed(fleet3)
    services.fleet_reconcile(fleet_id=fleet3.fleet.pk)
    latest = ConfigRevision.objects.filter(fleet=fleet3.fleet).order_by("-number").first()
    assert latest.base_id is None  # declined by the lane; the full render left the route out
    assert hostile.pk not in {r.id for ln in selectors.revision_snapshot(latest).listeners for r in ln.routes}
    for node in Node.objects.filter(fleet=fleet3.fleet):
        on_disk = [p.read_bytes() for p in Path(node.config_dir).rglob("*") if p.is_file()]
        assert on_disk and not any(b"bind :1" in content or b"/x }" in content for content in on_disk)
    assert {fleet3.get(n, "/first", host="a.example.com")[1] for n in fleet3.nodes} == {"new"}


@pytest.mark.django_db(transaction=True)
def test_each_fleets_reconciles_reach_the_process_holding_its_lane(
    fleet3: LocalFleet, tiny_backend, celery_worker_factory, settings
) -> None:
    """As `make run` runs reconciles (runall): a fleet's reconciles go to its shard's queue, served by one worker
    process. Its first reconcile of a fleet renders in full (the process has no lane yet); every later one
    takes the lane. Two fleets change together, as when an LB is served in two regions: on a prefork
    pool of 2 processes their reconciles land on either process, and each one landing on the other process
    rendered every route again (17-21 s at 100k routes in bench-scale)."""
    old = tiny_backend("old-b")
    other = make_local_fleet(name="lane-b", subnet=77, node_count=1, backend_address=(old.address, old.port))
    try:
        pools = {}
        for local in (fleet3, other):
            new = tiny_backend(f"new-{local.lb.name}")
            pools[local.lb.pk] = add_pool(local.lb, "new", (new.address, new.port))
            save_route(local, Route(), hosts=["a.example.com"], path="/first", priority=10,
                       targets=[{"pool": pools[local.lb.pk], "weight": 100}])
        # In this process: the worker has no lane for either fleet yet.
        first = {local.fleet.pk: rolled_out(local).revision.number for local in (fleet3, other)}
        for shard, queue in enumerate(settings.FLEET_QUEUES):  # as runall starts them: a process per shard
            celery_worker_factory(name=f"fleets{shard}", queues=queue, pool="threads", concurrency=2)
        for i in range(12):
            # Through the services, as the API writes: each commit records the change and queues a reconcile.
            # Changes keep coming while reconciles run, so a free thread (or process) takes whichever is next.
            for local in (fleet3, other):
                save_route(local, Route(), hosts=["a.example.com"], path=f"/w{i}", priority=20 + i,
                           targets=[{"pool": pools[local.lb.pk], "weight": 100}])
            time.sleep(0.1 * (i % 3))
        for local in (fleet3, other):
            lb = LoadBalancer.objects.get(pk=local.lb.pk)
            assert wait_for(lambda lb=lb: selectors.lb_applied_state(lb, lb.revision)[0], 60), lb.name
        for local in (fleet3, other):
            made = list(ConfigRevision.objects.filter(fleet=local.fleet, number__gt=first[local.fleet.pk])
                        .order_by("number").values_list("number", "base_id"))
            full = [number for number, base in made if base is None]
            assert len(made) >= 2 and full == [made[0][0]], (local.fleet.name, made)
            assert {local.get(n, "/w11/x", host="a.example.com")[1] for n in local.nodes} == {
                f"new-{local.lb.name}"}
    finally:
        other.stop_all()


def test_a_large_lanes_state_is_left_out_of_full_garbage_collections(fleet3: LocalFleet, tiny_backend,
                                                                     monkeypatch) -> None:
    """A shard worker holding a 100k-route lane paused 550-670 ms in each full collection (apps.core.gcpause):
    from FREEZE_FROM_ROUTES on, what the process holds once the lane is remembered is frozen, and later lane
    changes still work on it."""
    import gc

    monkeypatch.setattr(routelane, "FREEZE_FROM_ROUTES", 1)
    monkeypatch.setattr(routelane, "FREEZE", True)  # as in a Celery worker (controlplane/celery.py)
    new = tiny_backend("new")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    try:
        frozen_before = gc.get_freeze_count()
        rolled_out(fleet3)  # a full render, remembered by the lane
        assert gc.get_freeze_count() > frozen_before
        lane = routelane._LANES[fleet3.fleet.pk]
        listener_routes = next(iter(lane.listeners.values()))
        tracked = {id(o) for o in gc.get_objects()}
        assert id(lane) not in tracked and id(listener_routes.routes) not in tracked  # frozen, not collected
        save_route(fleet3, Route(), hosts=["a.example.com"], path="/hot", priority=11,
                   targets=[{"pool": pool_new, "weight": 100}])
        assert lane_rollout(fleet3).base_id is not None
        nodes_serve_a_full_render(fleet3)
    finally:
        gc.unfreeze()  # the test process goes on collecting everything


def test_semicolons_a_tenant_may_write_in_paths_and_redirects_reach_the_nodes_as_data(
        fleet3: LocalFleet, tiny_backend) -> None:
    """`;` is a path and redirect character the validators accept, and HAProxy's CLI separates commands with it:
    a route change's keys and values go to the nodes escaped (runtime._cli_escape), so `;help` is part of the URL
    the nodes answer with, not a command run on them, and the change stays hot (no reload, no fallback)."""
    import http.client

    new = tiny_backend("new")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/first", priority=10,
               targets=[{"pool": pool_new, "weight": 100}])
    rolled_out(fleet3)
    before = workers(fleet3)
    save_route(fleet3, Route(), hosts=["a.example.com"], path="/x;help", priority=11, targets=[],
               redirect_url="https://r.example/to;help?a=1;quit")
    revision = lane_rollout(fleet3)
    assert revision.base_id is not None
    nodes_serve_a_full_render(fleet3)
    assert workers(fleet3) == before
    for node in fleet3.nodes:
        conn = http.client.HTTPConnection(node.bind_address, fleet3.port, timeout=2)
        try:
            conn.request("GET", "/x;help/y", headers={"Host": "a.example.com", "Connection": "close"})
            response = conn.getresponse()
            assert (response.status, response.getheader("Location")) == (302, "https://r.example/to;help?a=1;quit")
        finally:
            conn.close()
