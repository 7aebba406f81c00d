"""Rollouts against real HAProxy nodes: convergence, refusals, failures, rollback, runtime changes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from apps.balancers.models import Member
from apps.events.models import Event
from apps.fleets import selectors, services
from apps.fleets.config.render import render
from apps.fleets.models import Certificate, ConfigRevision, Fleet, Node, NodeResult, Rollout
from apps.fleets.node.apply import verify
from apps.fleets.node.runtime_api import HAProxySocket, MasterSocket, RuntimeApiError
from apps.fleets.node.transports import transport_for
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, reconcile, serving_local_fleet

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def assert_succeeded(rollout_id: int) -> None:
    """The rollout succeeded; if not, the failure says why, from the rollout and each node (a run at 4 workers on
    a slower machine failed one with nothing more to go on)."""
    rollout = Rollout.objects.get(pk=rollout_id)
    assert rollout.status == Rollout.Status.SUCCEEDED, (rollout.status, rollout.error, {
        r.node.name: (r.status, r.error, r.unreachable) for r in NodeResult.objects.filter(rollout=rollout)})


def running_workers(local: LocalFleet) -> dict[str, int]:
    """The worker PID each node's master reports right now."""
    return {n.name: MasterSocket(f"{n.runtime_dir}/master.sock").show_proc().current_worker.pid
            for n in local.nodes}


@pytest.fixture
def fleet3(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="web", subnet=71, node_count=3) as local:
        yield local


def test_a_three_node_fleet_converges_on_a_new_route(fleet3: LocalFleet, tiny_backend) -> None:
    reconcile(fleet3.fleet)
    assert set(fleet3.bodies("/new/x").values()) == {"old"}
    new = tiny_backend("new")
    route = add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)

    result = reconcile(fleet3.fleet)

    assert fleet3.bodies("/new/x") == {"n1": "new", "n2": "new", "n3": "new"}
    assert set(fleet3.bodies("/other").values()) == {"old"}
    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert_succeeded(rollout.pk)
    revision = rollout.revision
    # The route is a routes map entry (any-host class "*", its path, its pool's action key).
    entry = f"*/new/ p{route.targets.get().pool_id}"
    assert entry in revision.text and f"+{entry}" in revision.diff
    assert revision.validation_ok and "valid" in revision.validation_output.lower()
    fleet3.fleet.refresh_from_db()
    assert fleet3.fleet.desired_revision == revision.number
    for node in fleet3.nodes:
        assert node.applied_revision_id == revision.pk and node.status == Node.Status.UP
    # Applied on every node: the LB's owner gets one change.applied event for this LB revision.
    fleet3.lb.refresh_from_db()
    applied = Event.objects.filter(type="change.applied", object_id=str(fleet3.lb.pk),
                                   data__revision=fleet3.lb.revision)
    assert list(applied.values_list("org_id", flat=True)) == [fleet3.lb.org_id]
    results = {r.node.name: r for r in rollout.results.select_related("node")}
    assert all(r.status == NodeResult.Status.SUCCEEDED for r in results.values())
    # Canary first: the other nodes started only after the canary had finished.
    assert results["n1"].finished_at <= min(results["n2"].started_at, results["n3"].started_at)


def test_a_route_only_change_is_served_through_runtime_map_updates_without_a_reload(
    fleet3: LocalFleet, tiny_backend
) -> None:
    """GIVEN a fleet serving pool `new` on /new, WHEN a second route to the same pool is added,
    THEN every node serves it while keeping its worker (no reload); the files on disk agree, so the
    next reload (a config change) keeps serving it."""
    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    workers = running_workers(fleet3)

    add_route(fleet3.lb, pool, "/hot", 11, hosts=["hot.example.com"])
    result = reconcile(fleet3.fleet)

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert_succeeded(rollout.pk)
    assert running_workers(fleet3) == workers, "a route-only change must not reload"
    assert all(r.reload_ms is None for r in rollout.results.all())
    assert {n.name: fleet3.get(n, "/hot/x", host="hot.example.com")[1] for n in fleet3.nodes} == {
        "n1": "new", "n2": "new", "n3": "new"}
    assert set(fleet3.bodies("/hot/x").values()) == {"old"}, "the host still scopes the route"
    for node in fleet3.nodes:
        assert node.applied_revision_id == rollout.revision_id and node.worker_pid == workers[node.name]

    other = tiny_backend("other")
    add_route(fleet3.lb, add_pool(fleet3.lb, "other", (other.address, other.port)), "/other", 12)
    reconcile(fleet3.fleet)  # a new pool changes haproxy.cfg: a real reload, from the files on disk

    assert running_workers(fleet3) != workers
    assert {fleet3.get(n, "/hot/x", host="hot.example.com")[1] for n in fleet3.nodes} == {"new"}
    assert set(fleet3.bodies("/other/x").values()) == {"other"}


def test_a_fleets_nodes_hold_one_copy_of_each_map_a_revision_renders_alike(fleet3: LocalFleet) -> None:
    """Each node rendered in full used to hold its own copy of every map: ~400k entries a node at 100k routes, kept
    in every worker's bundle cache (10 nodes at 20k routes: 260 MB of RSS, 204 MB with one copy)."""
    from apps.fleets import caches
    from apps.fleets.config.digest import set_digest
    from apps.fleets.rollout.execute import BundleRenderer

    assert_succeeded(reconcile(fleet3.fleet)["rollouts"][-1])
    caches.reset("bundles")
    revision = ConfigRevision.objects.filter(fleet=fleet3.fleet).order_by("-number").first()
    renderer = BundleRenderer()
    first, *others = [renderer.bundle(revision, node) for node in fleet3.nodes]
    maps = first.rendered_manifest.maps
    assert [name for name, entries in maps.items() if entries]  # maps with entries to share
    for bundle in others:
        assert bundle.main != first.main  # each node's haproxy.cfg binds its own address
        assert bundle.sha256 == set_digest(bundle.files) != first.sha256
        for name, entries in maps.items():
            assert bundle.files[name] == first.files[name]
            if first.files[name]:
                assert bundle.files[name] is first.files[name], name
                assert bundle.rendered_manifest.maps[name] is entries, name


def test_local_nodes_take_a_route_change_in_turn_and_a_reload_on_threads(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    """A route change on nodes of this host is short work of this process's own (a map update, a few files): spread
    over threads, every system call handed the interpreter lock to another thread and back (~9 ms of kernel time
    per node and change, more than the work itself). It runs node after node in the rollout's thread; a reload
    waits ~50 ms for each new worker, so a reload rollout keeps its nodes on threads."""
    from apps.fleets.rollout import execute as execute_module

    threads: list[tuple[str, bool]] = []
    real = execute_module.apply_node

    def recording(plan):  # type: ignore[no-untyped-def]
        import threading

        outcome = real(plan)
        threads.append((threading.current_thread().name, outcome.hot))
        return outcome

    monkeypatch.setattr(execute_module, "apply_node", recording)
    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)  # a new pool: a reload
    reloads, threads[:] = list(threads), []

    add_route(fleet3.lb, pool, "/hot", 11)
    reconcile(fleet3.fleet)

    here = __import__("threading").current_thread().name
    assert {hot for _, hot in reloads} == {False}
    assert any(name != here for name, _ in reloads), reloads  # (a canary alone is applied in the rollout's thread)
    assert threads == [(here, True)] * 3
    assert set(fleet3.bodies("/hot/x").values()) == {"new"}


def test_a_node_not_recorded_clean_takes_a_route_change_by_reload(fleet3: LocalFleet, tiny_backend) -> None:
    """A node marked drifted (say an interrupted map update whose rollback did not finish) may hold
    maps of a revision it never verified; only a reload from disk is sure to clear them."""
    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    workers = running_workers(fleet3)
    Node.objects.filter(pk=fleet3.nodes[0].pk).update(status=Node.Status.DRIFTED)

    add_route(fleet3.lb, pool, "/hot", 11)
    reconcile(fleet3.fleet)

    now = running_workers(fleet3)
    assert now["n1"] != workers["n1"] and (now["n2"], now["n3"]) == (workers["n2"], workers["n3"])
    assert set(fleet3.bodies("/hot/x").values()) == {"new"}


def refuse_map_updates(monkeypatch, node: Node) -> None:
    """`node`'s HAProxy refuses every runtime map update (HAProxy's own error text): whole-map swaps and key-by-key
    updates alike (apps.fleets.node.mapdelta picks one per map)."""
    stats_socket = f"{node.runtime_dir}/stats.sock"

    def refusing(real):
        def call(self, name, entries):
            if self.path == stats_socket:
                raise RuntimeApiError(f"add map {name}", "Unknown map identifier. Please use #<id> or <file>.")
            return real(self, name, entries)
        return call

    monkeypatch.setattr(HAProxySocket, "replace_map", refusing(HAProxySocket.replace_map))
    monkeypatch.setattr(HAProxySocket, "apply_map_delta", refusing(HAProxySocket.apply_map_delta))


def test_a_refused_runtime_map_update_falls_back_to_a_reload(fleet3: LocalFleet, tiny_backend, monkeypatch) -> None:
    """GIVEN node n1's HAProxy refusing the map update, WHEN a route-only change rolls out, THEN n1
    reloads instead (loading the pushed files) and serves the route; the others keep their workers.

    The refusal is injected (HAProxy's own error text, raised from n1's `replace_map` / `apply_map_delta`): a healthy
    2.6 worker offers no way to make `prepare/add/commit map` fail on demand. Everything else is real.
    """
    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    workers = running_workers(fleet3)
    refuse_map_updates(monkeypatch, fleet3.nodes[0])

    add_route(fleet3.lb, pool, "/hot", 11)
    result = reconcile(fleet3.fleet)

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert_succeeded(rollout.pk)
    assert set(fleet3.bodies("/hot/x").values()) == {"new"}
    now = running_workers(fleet3)
    assert now["n1"] != workers["n1"] and (now["n2"], now["n3"]) == (workers["n2"], workers["n3"])
    n1 = rollout.results.get(node__name="n1")
    assert n1.reload_ms is not None and "reloading instead" in n1.error


@pytest.fixture
def nodes_checking_their_own_pushes(monkeypatch) -> list[str]:
    """Local nodes that run `haproxy -c` on every push, as SSH nodes do; the names of the nodes that ran it."""
    from apps.fleets.node.transports.base import FileSetTransport
    from apps.fleets.rollout import execute

    monkeypatch.setattr(execute, "REVALIDATE_LOCAL_NODES", True)
    checked: list[str] = []
    real = FileSetTransport.validate_dir

    def validate_dir(self, set_dir):
        checked.append(self.node.name)
        return real(self, set_dir)

    monkeypatch.setattr(FileSetTransport, "validate_dir", validate_dir)
    return checked


def test_a_route_change_on_nodes_that_check_their_own_pushes_runs_no_haproxy_check(
    fleet3: LocalFleet, tiny_backend, nodes_checking_their_own_pushes: list[str]
) -> None:
    """GIVEN nodes that validate what they are sent (SSH nodes: their binary may differ from Spillway's), WHEN a
    route-only change rolls out, THEN no node runs `haproxy -c` (its worker takes every moved entry first, and
    that is the node's own check), none reloads, each serves the route, and each node's files on disk are the
    new revision's (a restart serves the change too)."""
    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)  # a pool: haproxy.cfg moves, every node checks it
    assert sorted(set(nodes_checking_their_own_pushes)) == ["n1", "n2", "n3"]
    workers = running_workers(fleet3)
    nodes_checking_their_own_pushes.clear()

    add_route(fleet3.lb, pool, "/hot", 11)
    result = reconcile(fleet3.fleet)

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert_succeeded(rollout.pk)
    assert nodes_checking_their_own_pushes == []
    assert running_workers(fleet3) == workers
    assert set(fleet3.bodies("/hot/x").values()) == {"new"}
    for node in Node.objects.filter(fleet=fleet3.fleet):
        assert node.applied_revision_id == rollout.revision_id
        assert transport_for(selectors.node_conn(node)).config_sha256() == node.applied_sha256


def test_a_worker_refusing_a_route_change_sends_a_self_checking_node_to_a_checked_push_and_reload(
    fleet3: LocalFleet, tiny_backend, nodes_checking_their_own_pushes: list[str], monkeypatch
) -> None:
    """GIVEN a node that validates its pushes and whose worker refuses the moved map entries, WHEN a route-only
    change rolls out, THEN that node's files are checked on the node (`haproxy -c`) before it reloads onto them,
    it serves the route, and the other nodes neither check nor reload.

    The refusal is injected (as in test_a_refused_runtime_map_update_falls_back_to_a_reload); the rest is real."""
    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    workers = running_workers(fleet3)
    nodes_checking_their_own_pushes.clear()
    refuse_map_updates(monkeypatch, fleet3.nodes[0])
    add_route(fleet3.lb, pool, "/hot", 11)
    result = reconcile(fleet3.fleet)

    # Once, in a run at 5 workers, n2 checked (and so left the runtime path) too: what each node did, if again.
    steps = {r.node.name: r.error for r in NodeResult.objects.filter(rollout_id=result["rollouts"][-1])}
    assert nodes_checking_their_own_pushes == ["n1"], steps
    now = running_workers(fleet3)
    assert now["n1"] != workers["n1"] and (now["n2"], now["n3"]) == (workers["n2"], workers["n3"])
    assert set(fleet3.bodies("/hot/x").values()) == {"new"}


def test_a_self_checking_node_whose_worker_took_part_of_a_refused_change_serves_its_last_good_files(
    fleet3: LocalFleet, tiny_backend, nodes_checking_their_own_pushes: list[str], monkeypatch
) -> None:
    """GIVEN a node that validates its pushes, whose worker takes the moved map entries but fails their read-back,
    and whose `haproxy -c` then refuses the files, WHEN a route-only change rolls out, THEN that node is reloaded
    onto the files it has and serves the old routing: nothing the worker took stays live ahead of its disk.

    Both failures are injected (the read-back after a real update of n1's maps, and n1's check); the rest is real."""
    from apps.fleets.node.transports.base import FileSetTransport

    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    n1 = fleet3.nodes[0]
    n1_socket = f"{n1.runtime_dir}/stats.sock"
    real_replace, real_delta = HAProxySocket.replace_map, HAProxySocket.apply_map_delta

    def taken_then_unread(real):
        def call(self, name, entries):
            result = real(self, name, entries)
            if self.path == n1_socket:
                raise RuntimeApiError(f"get map {name}", "not as written after the update")
            return result
        return call

    monkeypatch.setattr(HAProxySocket, "replace_map", taken_then_unread(real_replace))
    monkeypatch.setattr(HAProxySocket, "apply_map_delta", taken_then_unread(real_delta))
    checking = FileSetTransport.validate_dir  # the fixture's counting wrapper
    monkeypatch.setattr(FileSetTransport, "validate_dir", lambda self, set_dir: (False, "refused by n1") if
                        self.node.name == "n1" else checking(self, set_dir))

    add_route(fleet3.lb, pool, "/hot", 11)
    reconcile(fleet3.fleet)

    assert fleet3.get(n1, "/hot/x")[1] == "old"
    n1 = Node.objects.get(pk=n1.pk)
    assert transport_for(selectors.node_conn(n1)).config_sha256() == n1.applied_sha256  # its last good files


def test_a_push_failing_beside_the_runtime_map_update_leaves_the_node_serving_its_last_good_files(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    """A local node takes a route change's map keys while its files are written (delivery._hot_apply). GIVEN
    n3's disk failing the write, WHEN a route-only change rolls out, THEN n3 serves what its files say (the
    old routing: its worker may have taken the new keys already, so it is reloaded onto those files) and
    is not recorded as serving the new revision; the other nodes serve the change; once the disk is back,
    the next change brings n3 up to date.

    The full disk is injected (OSError ENOSPC from n3's file writes; n3, not the canary n1): everything else is real."""
    import errno

    from apps.fleets.node.transports.local import LocalTransport

    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    n3 = fleet3.nodes[2]
    before = Node.objects.get(pk=n3.pk).applied_revision_id
    real_write = LocalTransport._write_staged  # how a push writes a set's files

    def full_on_n3(self, path, data, mode):
        if path.startswith(n3.config_dir):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_write(self, path, data, mode)

    monkeypatch.setattr(LocalTransport, "_write_staged", full_on_n3)
    add_route(fleet3.lb, pool, "/hot", 11)
    result = reconcile(fleet3.fleet)

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert rollout.status == Rollout.Status.FAILED
    bodies = fleet3.bodies("/hot/x")
    assert bodies["n3"] == "old" and (bodies["n1"], bodies["n2"]) == ("new", "new")
    n3_result = rollout.results.get(node__name="n3")
    assert n3_result.status == NodeResult.Status.ROLLED_BACK, n3_result.error
    assert "No space left on device" in n3_result.error
    assert Node.objects.get(pk=n3.pk).applied_revision_id == before

    monkeypatch.setattr(LocalTransport, "_write_staged", real_write)
    add_route(fleet3.lb, pool, "/later", 12)  # a node that failed while reachable moves with the next change
    result = reconcile(fleet3.fleet)

    assert_succeeded(result["rollouts"][-1])
    assert set(fleet3.bodies("/hot/x").values()) == set(fleet3.bodies("/later/x").values()) == {"new"}


def test_an_unchanged_desired_state_makes_no_new_revision_and_no_reload(fleet3: LocalFleet) -> None:
    reconcile(fleet3.fleet)
    workers = {n.name: n.worker_pid for n in fleet3.nodes}
    count = ConfigRevision.objects.filter(fleet=fleet3.fleet).count()

    result = reconcile(fleet3.fleet)

    assert result["rollouts"] == []
    assert ConfigRevision.objects.filter(fleet=fleet3.fleet).count() == count
    assert {n.name: n.worker_pid for n in fleet3.nodes} == workers


def test_an_injected_value_never_reaches_a_node(fleet3: LocalFleet, tiny_backend) -> None:
    """GIVEN a route path carrying a newline and a directive (written past the API, as a buggy
    migration could) WHEN reconciled THEN that route is left out of the revision and named as its
    problem, nothing of it reaches a node, and everything else on the fleet still deploys."""
    reconcile(fleet3.fleet)
    new = tiny_backend("new")
    route = add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)),
                      "/api }\n    bind 127.0.0.1:9\n    http-request deny if { path_beg /x", 10)

    reconcile(fleet3.fleet)

    revision = ConfigRevision.objects.filter(fleet=fleet3.fleet).order_by("-number").first()
    assert revision.validation_ok
    assert [(p["kind"], p["id"], p["code"]) for p in revision.problems] == [("route", route.pk, "invalid_path")]
    assert "127.0.0.1:9" not in revision.text and "path_beg /x" not in revision.text
    for node in fleet3.nodes:
        node.refresh_from_db()
        assert node.applied_revision_id == revision.pk  # the valid rest (the new pool) was deployed
    assert set(fleet3.bodies("/").values()) == {"old"}


def test_a_config_haproxy_rejects_is_stored_with_its_output_and_never_pushed(
    fleet3: LocalFleet, monkeypatch
) -> None:
    """GIVEN a render HAProxy refuses (simulated by a renderer bug: an unknown keyword, since
    every user value is allowlisted) WHEN reconciled THEN `haproxy -c -dW` output is stored."""
    reconcile(fleet3.fleet)
    before = {n.name: n.worker_pid for n in fleet3.nodes}
    from apps.fleets.config import render as render_module

    real = render_module.render

    def buggy(snapshot, node, **kwargs):
        bundle = real(snapshot, node, **kwargs)
        files = dict(bundle.files)
        files["haproxy.cfg"] += b"    no_such_keyword on\n"
        return type(bundle).of(files, bundle.manifest)

    from apps.fleets.config import revisions

    monkeypatch.setattr(revisions, "render", buggy)
    result = reconcile(fleet3.fleet)

    revision = ConfigRevision.objects.filter(fleet=fleet3.fleet).order_by("-number").first()
    assert not revision.validation_ok
    assert "no_such_keyword" in revision.validation_output
    assert result["rollouts"] == []
    assert {n.name: n.worker_pid for n in fleet3.nodes} == before


def _hold(address: str, port: int):
    """Another process's listening socket (a stray service on the node)."""
    import socket

    sock = socket.socket()
    sock.bind((address, port))
    sock.listen()
    return sock


@pytest.fixture
def listener_reads(monkeypatch) -> list[int]:
    """One entry per read of this host's listening sockets (/proc/net/tcp{,6}) by the bind pre-check."""
    from apps.fleets.config import check

    reads: list[int] = []
    real = check._listeners
    monkeypatch.setattr(check, "_listeners", lambda: reads.append(1) or real())
    return reads


def test_a_port_conflict_is_refused_before_anything_is_pushed(fleet3: LocalFleet, listener_reads) -> None:
    reconcile(fleet3.fleet)
    listener_reads.clear()
    before = {n.name: (n.applied_revision_id, n.worker_pid) for n in fleet3.nodes}
    from apps.balancers.models import Listener
    from tests.fleets.fleetkit import free_port_on

    port = free_port_on([n.bind_address for n in fleet3.nodes])
    Listener.objects.create(lb=fleet3.lb, name="second", port=port, default_pool=fleet3.listener.default_pool)
    stray = _hold("127.0.71.2", port)
    try:
        result = reconcile(fleet3.fleet)
    finally:
        stray.close()

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert rollout.status == Rollout.Status.FAILED
    assert "bind conflict" in rollout.error and f"127.0.71.2:{port}" in rollout.error
    assert f"127.0.71.1:{port}" not in rollout.error and f"127.0.71.3:{port}" not in rollout.error
    assert len(listener_reads) == 2  # once for the three nodes, once more to confirm the conflict found
    assert {n.name: (n.applied_revision_id, n.worker_pid) for n in fleet3.nodes} == before
    assert set(fleet3.bodies("/").values()) == {"old"}
    assert not rollout.results.filter(push_ms__isnull=False).exists()


def test_a_new_listener_is_checked_on_every_node_with_one_read_of_the_hosts_sockets(fleet3: LocalFleet,
                                                                                    listener_reads) -> None:
    """Each local node's pre-check used to read /proc/net/tcp{,6} and every process's stat on the host again: a
    rollout's pre-check of 200 local nodes took 85% of its 24 s there. The round now reads the sockets once (and a
    stranger is still told from each node's own HAProxy: test_a_port_conflict_is_refused_before_anything_is_pushed)."""
    from apps.balancers.models import Listener
    from tests.fleets.fleetkit import free_port_on
    from tests.netutil import http_get

    reconcile(fleet3.fleet)
    listener_reads.clear()
    port = free_port_on([n.bind_address for n in fleet3.nodes])
    Listener.objects.create(lb=fleet3.lb, name="second", port=port, default_pool=fleet3.listener.default_pool)
    assert_succeeded(reconcile(fleet3.fleet)["rollouts"][-1])
    assert len(listener_reads) == 1
    # Served on every node, each node's own HAProxy holding the port it binds (not a conflict at the next check).
    assert {n.name: http_get(f"http://{n.bind_address}:{port}/")[1] for n in fleet3.nodes} == {
        "n1": "old", "n2": "old", "n3": "old"}


def test_a_node_killed_mid_rollout_fails_alone_and_catches_up_when_it_returns(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    reconcile(fleet3.fleet)
    new = tiny_backend("new")
    add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)
    from apps.fleets.rollout import execute

    real_apply = execute.apply_node
    n3 = Node.objects.get(fleet=fleet3.fleet, name="n3")

    def apply_and_kill(plan):
        if plan.conn.name == "n3":
            fleet3.kill(n3)  # the node dies while the rollout is working on it
        return real_apply(plan)

    monkeypatch.setattr(execute, "apply_node", apply_and_kill)
    result = reconcile(fleet3.fleet)
    monkeypatch.setattr(execute, "apply_node", real_apply)

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert rollout.status == Rollout.Status.FAILED and "n3" in rollout.error
    by_node = {r.node.name: r for r in rollout.results.select_related("node")}
    assert by_node["n3"].status == NodeResult.Status.FAILED and by_node["n3"].unreachable
    nodes = {n.name: n for n in fleet3.nodes}
    assert nodes["n3"].status == Node.Status.DOWN and nodes["n3"].applied_revision_id != rollout.revision_id
    assert {nodes["n1"].applied_revision_id, nodes["n2"].applied_revision_id} == {rollout.revision_id}
    assert fleet3.get(nodes["n1"], "/new")[1] == fleet3.get(nodes["n2"], "/new")[1] == "new"

    fleet3.start(nodes["n3"])  # it comes back, on whatever config it had
    converge = services.fleet_converge(fleet=fleet3.fleet, enqueue=False)
    assert converge is not None and list(converge.results.values_list("node__name", flat=True)) == ["n3"]
    services.fleet_reconcile(fleet_id=fleet3.fleet.pk)

    assert fleet3.bodies("/new") == {"n1": "new", "n2": "new", "n3": "new"}
    n3 = Node.objects.get(pk=nodes["n3"].pk)
    assert n3.status == Node.Status.UP and n3.applied_revision_id == rollout.revision_id


def test_rollback_to_an_earlier_revision_and_undo_it(fleet3: LocalFleet, tiny_backend) -> None:
    first = Rollout.objects.get(pk=reconcile(fleet3.fleet)["rollouts"][-1])
    new = tiny_backend("new")
    add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)
    second = Rollout.objects.get(pk=reconcile(fleet3.fleet)["rollouts"][-1])
    assert set(fleet3.bodies("/new").values()) == {"new"}

    back = services.fleet_rollback(fleet=fleet3.fleet, number=first.revision.number, principal=None)
    services.fleet_reconcile(fleet_id=fleet3.fleet.pk)
    back.refresh_from_db()
    assert back.status == Rollout.Status.SUCCEEDED and back.kind == Rollout.Kind.ROLLBACK
    # A manual rollback to an earlier revision is a rollback to subscribers too (the fleet's and the LB's).
    rolled = Event.objects.filter(type="rollout.rolled_back")
    assert {(e.object_type, e.data["revision"]) for e in rolled} >= {("fleet", first.revision.number)}
    assert rolled.filter(object_type="loadbalancer", object_id=str(fleet3.lb.pk)).exists()
    assert set(fleet3.bodies("/new").values()) == {"old"}
    assert {n.applied_revision_id for n in fleet3.nodes} == {first.revision_id}

    undo = services.rollout_rollback(rollout=back, principal=None)
    services.fleet_reconcile(fleet_id=fleet3.fleet.pk)
    undo.refresh_from_db()
    back.refresh_from_db()
    assert undo.status == Rollout.Status.SUCCEEDED and undo.revision_id == second.revision_id
    assert back.status == Rollout.Status.ROLLED_BACK
    assert set(fleet3.bodies("/new").values()) == {"new"}


def test_drain_reaches_every_node_without_reload_and_survives_the_next_reload(
    fleet3: LocalFleet, tiny_backend
) -> None:
    second = tiny_backend("old2")
    pool = fleet3.listener.default_pool
    Member.objects.create(pool=pool, region=pool.regions.get().region, name="old-2", address=second.address,
                          port=second.port)
    reconcile(fleet3.fleet)
    workers = running_workers(fleet3)
    member = Member.objects.get(pool=pool, name="old-1")
    Member.objects.filter(pk=member.pk).update(admin_state="drain")  # what balancers writes first

    errors = services.member_runtime_apply(member_id=member.pk)

    assert errors == {f"web-fleet/{n}": None for n in ("n1", "n2", "n3")}
    backend = f"p{pool.pk}_us-east"

    def status_of(node: Node) -> str:
        rows = HAProxySocket(f"{node.runtime_dir}/stats.sock").show_stat()
        return next(r.status for r in rows if r.pxname == backend and r.svname == "old-1")

    assert {status_of(n) for n in fleet3.nodes} == {"DRAIN"}
    assert running_workers(fleet3) == workers  # no reload happened
    assert all(fleet3.get(n, f"/x{i}")[1] == "old2" for n in fleet3.nodes for i in range(6))

    rollout = Rollout.objects.get(pk=reconcile(fleet3.fleet)["rollouts"][-1])  # the desired state (weight 0)

    # The new revision differs only in the member's server line: taken through the runtime API, no reload.
    assert_succeeded(rollout.pk)
    assert running_workers(fleet3) == workers
    assert {status_of(n) for n in fleet3.nodes} == {"DRAIN"}
    assert all(fleet3.get(n, f"/y{i}")[1] == "old2" for n in fleet3.nodes for i in range(6))

    # A later change that does need a reload (a new pool) keeps the drain: the config says weight 0.
    new = tiny_backend("new")
    add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)
    reconcile(fleet3.fleet)
    assert running_workers(fleet3) != workers
    assert all(fleet3.get(n, f"/z{i}")[1] == "old2" for n in fleet3.nodes for i in range(6))


def test_a_weight_and_a_state_change_through_the_api_reach_every_node_without_a_reload(
    fleet3: LocalFleet, tiny_backend
) -> None:
    """The page said "without a reload" while every drain reloaded (the worker PID changed on every node)."""
    from rest_framework.test import APIClient

    from apps.accounts.models import Organization, Role
    from tests.personas import persona

    second = tiny_backend("old2")
    pool = fleet3.listener.default_pool
    Member.objects.create(pool=pool, region=pool.regions.get().region, name="old-2", address=second.address,
                          port=second.port)
    reconcile(fleet3.fleet)
    workers = running_workers(fleet3)
    ops = Organization.objects.filter(kind="operator").first() or Organization.objects.create(
        slug="ops-x", name="ops", kind="operator")
    otto: APIClient = persona("otto-x", ops, Role.ADMIN).client
    member = Member.objects.get(pool=pool, name="old-1")
    backend = f"p{pool.pk}_us-east"

    def server(node: Node) -> tuple[str, int]:
        from apps.fleets.node.runtime_api import parse_servers_state

        return parse_servers_state(HAProxySocket(f"{node.runtime_dir}/stats.sock").show_servers_state())[
            (backend, "old-1")]

    for change, expected in (({"weight": 7}, ("active", 7)), ({"admin_state": "drain"}, ("drain", 7)),
                             ({"admin_state": "maint"}, ("maint", 7)), ({"admin_state": "active"}, ("active", 7))):
        answer = otto.post(f"/api/v1/members/{member.pk}/state/", change, format="json")
        assert answer.status_code in (200, 202), answer.content
        services.member_runtime_apply(member_id=member.pk)  # what the member_runtime task does
        rollout = Rollout.objects.get(pk=reconcile(fleet3.fleet)["rollouts"][-1])
        assert_succeeded(rollout.pk)
        assert {n.name: server(n) for n in fleet3.nodes} == {n.name: expected for n in fleet3.nodes}, change
        assert running_workers(fleet3) == workers, f"{change} reloaded a node"


def test_drift_is_detected_and_reconverged(fleet3: LocalFleet) -> None:
    reconcile(fleet3.fleet)
    n2 = Node.objects.get(fleet=fleet3.fleet, name="n2")
    from apps.fleets.config.render import render
    from apps.fleets.config.spec import ConfigBundle
    from apps.fleets.node.apply import (
        NodePlan,
        apply_node,  # someone hand-edits n2 and reloads it
    )

    conn = selectors.node_conn(n2)
    from apps.fleets.node.transports.local import LocalTransport

    transport = LocalTransport(conn)
    files = dict(transport._read_tree(conn.current_dir))
    files["haproxy.cfg"] = files["haproxy.cfg"].replace(b"timeout client 30s", b"timeout client 31s")
    rendered = render(selectors.revision_snapshot(n2.applied_revision), selectors.node_spec(n2))
    # The hand edit changes no listener or proxy: the render's manifest still describes it.
    edited = ConfigBundle.of(files, rendered.manifest)
    assert apply_node(NodePlan(conn=conn, bundle=edited, last_good=None)).ok

    assert services.fleet_drift_check(fleet=fleet3.fleet) == ["n2"]
    assert Node.objects.get(pk=n2.pk).status == Node.Status.DRIFTED
    rollout = services.fleet_converge(fleet=fleet3.fleet, check_drift=False, enqueue=False)
    services.fleet_reconcile(fleet_id=fleet3.fleet.pk)

    rollout.refresh_from_db()
    assert rollout.status == Rollout.Status.SUCCEEDED and rollout.kind == Rollout.Kind.CONVERGE
    assert services.fleet_drift_check(fleet=fleet3.fleet) == []
    assert b"timeout client 31s" not in LocalTransport(conn)._read_tree(conn.current_dir)["haproxy.cfg"]


def test_a_node_verified_under_the_earlier_digest_is_not_drifted_and_an_edit_still_is(fleet3: LocalFleet) -> None:
    """Set digests hash each file once (apps.fleets.config.digest); nodes verified before carry the earlier digest
    of the same files. A drift check recognises those files and records the new digest (no drift, no
    reload); a hand edit of such a node is still drifted."""
    from apps.fleets.config.digest import set_digest_v1
    from apps.fleets.node.transports.local import LocalTransport

    reconcile(fleet3.fleet)
    n1, n2 = (Node.objects.get(fleet=fleet3.fleet, name=name) for name in ("n1", "n2"))
    current = {}
    for node in (n1, n2):
        conn = selectors.node_conn(node)
        files = LocalTransport(conn)._read_tree(conn.current_dir)
        current[node.name] = node.applied_sha256
        Node.objects.filter(pk=node.pk).update(applied_sha256=set_digest_v1(files))  # as an earlier version left it
    edited = f"{selectors.node_conn(n2).current_dir}/haproxy.cfg"
    with open(edited, "rb") as handle:
        text = handle.read()
    with open(edited, "wb") as handle:
        handle.write(text.replace(b"timeout client 30s", b"timeout client 31s"))
    workers = running_workers(fleet3)

    assert services.fleet_drift_check(fleet=fleet3.fleet) == ["n2"]

    n1.refresh_from_db()
    assert n1.status == Node.Status.UP and n1.applied_sha256 == current["n1"]
    assert Node.objects.get(pk=n2.pk).status == Node.Status.DRIFTED
    assert running_workers(fleet3) == workers


def test_a_drift_check_finding_nothing_leaves_the_fleet_to_route_changes(fleet3: LocalFleet, monkeypatch) -> None:
    """Reading every node's maps back takes seconds at 100k routes: a check that finds nothing does not hold
    the fleet's lease, so a reconcile (a route change) can run meanwhile."""
    from apps.fleets.rollout import drift, lease

    reconcile(fleet3.fleet)
    claimed = []
    real = drift.read_live_drift

    def reading(*args, **kwargs):
        owner = lease.new_owner()
        claimed.append(lease.claim(fleet3.fleet.pk, owner))  # a reconcile starting now
        lease.release(fleet3.fleet.pk, owner)
        return real(*args, **kwargs)

    monkeypatch.setattr(drift, "read_live_drift", reading)
    monkeypatch.setattr(drift, "parallel", lambda fn, items, **_: [fn(i) for i in items])  # this test's connection
    report = services.fleet_drift_report(fleet=fleet3.fleet)

    assert report.checked == 3 and not report.drifted and not report.repaired
    assert claimed == [True, True, True]


def _drifted_with_queued_reconciles(fleet3: LocalFleet, tiny_backend, monkeypatch):  # type: ignore[no-untyped-def]
    """A served pool "new", a node marked drifted (the next drift check takes the lease), and the fleet ids of the
    reconcile tasks queued from now on (recorded, not sent)."""
    from apps.fleets.tasks import reconcile_task

    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    reconcile(fleet3.fleet)
    Node.objects.filter(pk=fleet3.nodes[0].pk).update(status=Node.Status.DRIFTED)
    queued: list[int] = []
    monkeypatch.setattr(reconcile_task, "apply_async", lambda args, **kw: queued.append(args[0]))
    return pool, queued


def test_a_change_arriving_while_a_drift_check_holds_the_lease_is_reconciled_after_it(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    """A drift check that found something holds the fleet's lease while it confirms and repairs; a reconcile
    arriving then gives up (the lease is taken) and the check queues one when it lets go, instead of the
    change waiting for the next converge (10 s)."""
    from apps.fleets.rollout import drift

    pool, queued = _drifted_with_queued_reconciles(fleet3, tiny_backend, monkeypatch)
    real = drift.read_state
    busy = []

    def reading(*args, **kwargs):
        if not busy:
            add_route(fleet3.lb, pool, "/during", 13)
            services.fleets_mark_changed(fleet_ids=[fleet3.fleet.pk])  # as the write's receiver does: queued ...
            busy.append(services.fleet_reconcile(fleet_id=fleet3.fleet.pk))  # ... and finds the lease taken
        return real(*args, **kwargs)

    monkeypatch.setattr(drift, "read_state", reading)
    monkeypatch.setattr(drift, "parallel", lambda fn, items, **_: [fn(i) for i in items])  # this test's connection
    queued.clear()
    services.fleet_drift_report(fleet=fleet3.fleet)

    assert busy == [{"busy": True}]
    assert queued.count(fleet3.fleet.pk) == 2, "the check let go of the lease without queueing the waiting change"
    monkeypatch.setattr(drift, "read_state", real)
    reconcile(fleet3.fleet)
    assert set(fleet3.bodies("/during/x").values()) == {"new"}


def test_changes_arriving_while_the_lease_is_held_queue_one_reconcile_not_one_each(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    """Route changes arriving while a holder runs (here a drift check that found something) queue one reconcile
    between them, not one per change that wakes only to find the lease taken (1,000 a minute in bench-scale);
    once the holder lets go, it queues the one that applies them, and the next change queues its own."""
    from apps.fleets.rollout import drift

    pool, queued = _drifted_with_queued_reconciles(fleet3, tiny_backend, monkeypatch)
    real = drift.read_state
    during: list[int] = []

    def reading(*args, **kwargs):
        if not during:
            for n in range(3):
                add_route(fleet3.lb, pool, f"/during{n}", 20 + n)
                services.fleets_mark_changed(fleet_ids=[fleet3.fleet.pk])
                during.append(len(queued))
                assert services.fleet_reconcile(fleet_id=fleet3.fleet.pk) == {"busy": True}
        return real(*args, **kwargs)

    monkeypatch.setattr(drift, "read_state", reading)
    monkeypatch.setattr(drift, "parallel", lambda fn, items, **_: [fn(i) for i in items])  # this test's connection
    queued.clear()
    services.fleet_drift_report(fleet=fleet3.fleet)

    assert during == [1, 1, 1], "each change while the lease was held queued another reconcile"
    assert queued == [fleet3.fleet.pk] * 2, "the check let go of the lease without queueing the waiting changes"
    monkeypatch.setattr(drift, "read_state", real)
    reconcile(fleet3.fleet)
    assert {tuple(set(fleet3.bodies(f"/during{n}/x").values())) for n in range(3)} == {("new",)}
    queued.clear()
    add_route(fleet3.lb, pool, "/after", 30)
    services.fleets_mark_changed(fleet_ids=[fleet3.fleet.pk])
    assert queued == [fleet3.fleet.pk], "a change after the holder let go waited for the converge"


def test_a_reconcile_that_fails_still_queues_one_for_the_changes_that_waited_on_it(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    """A change arriving while a reconcile holds the lease leaves it to the holder (reconcile_queued stays set). A
    holder that fails (its render raised) must still queue a reconcile when it lets go: else that change, and
    every later one (they find the flag set), waited for the converge."""
    from apps.fleets.rollout import reconcile as reconcile_module

    pool, queued = _drifted_with_queued_reconciles(fleet3, tiny_backend, monkeypatch)
    add_route(fleet3.lb, pool, "/first", 15)
    services.fleets_mark_changed(fleet_ids=[fleet3.fleet.pk])

    def failing(**kwargs):  # type: ignore[no-untyped-def]
        add_route(fleet3.lb, pool, "/waiting", 16)
        services.fleets_mark_changed(fleet_ids=[fleet3.fleet.pk])
        assert services.fleet_reconcile(fleet_id=fleet3.fleet.pk) == {"busy": True}
        raise RuntimeError("the render failed")

    monkeypatch.setattr(reconcile_module, "fleet_render", failing)
    queued.clear()
    with pytest.raises(RuntimeError):
        services.fleet_reconcile(fleet_id=fleet3.fleet.pk)

    # The change's own task (run above: it found the lease taken), then the one the holder queued as it let go.
    assert queued == [fleet3.fleet.pk] * 2, "the failed holder let go without queueing the waiting change"
    monkeypatch.undo()
    reconcile(fleet3.fleet)
    assert set(fleet3.bodies("/waiting/x").values()) == {"new"}


def test_a_converge_does_not_push_back_a_revision_the_engine_moved_past_during_its_drift_check(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    """The periodic converge checks drift first, which takes long enough for the engine to roll a newer revision
    out meanwhile. The converge must decide on the fleet as it is after the check: with the desired revision
    read before it, every node looked "off" and the converge pushed the older revision back onto them (routes
    served a moment before went away; seen in bench-scale's sustained run)."""
    from apps.fleets.rollout import drift

    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    reconcile(fleet3.fleet)
    before = Fleet.objects.get(pk=fleet3.fleet.pk).desired_revision
    real = drift.fleet_drift_check

    def checking(*, fleet, all_maps):  # type: ignore[no-untyped-def]
        add_route(fleet3.lb, pool, "/meanwhile", 14)  # a change the engine renders and rolls out during the check
        reconcile(fleet3.fleet)
        return real(fleet=fleet, all_maps=all_maps)

    monkeypatch.setattr(drift, "fleet_drift_check", checking)
    rollout = services.fleet_converge(fleet=fleet3.fleet, enqueue=False)

    fleet = Fleet.objects.get(pk=fleet3.fleet.pk)
    assert fleet.desired_revision > before
    assert rollout is None, f"the converge pushed revision {rollout.revision.number}, not {fleet.desired_revision}"
    assert set(fleet3.bodies("/meanwhile/x").values()) == {"new"}


def test_health_collection_keeps_a_hot_copy_per_server(fleet3: LocalFleet) -> None:
    reconcile(fleet3.fleet)
    rows = services.fleet_health_collect(fleet=fleet3.fleet)
    from apps.fleets.models import NodeHealth

    assert rows >= 3 * 3  # per node at least a frontend, a backend and a server row
    pool = fleet3.listener.default_pool
    servers = NodeHealth.objects.filter(proxy=f"p{pool.pk}_us-east", server="old-1")
    assert servers.count() == 3 and {s.status for s in servers} <= {"UP", "no check"}
    from apps.traffic.models import TrafficSample

    # The same readings feed the overflow charts' history: one sample per node for the pool.
    assert TrafficSample.objects.filter(pool=pool).count() == 3


def test_health_reads_what_a_node_serves_not_its_files(fleet3: LocalFleet, monkeypatch) -> None:
    """Health collection asks each node's HAProxy (master and stats socket), never its config files: those are the
    drift check's. GIVEN a node set whose files cannot be read (an I/O error, simulated) THEN health still finds every
    node up with its rows, where a hash it never used made each such serving node count as down."""
    from apps.fleets.models import NodeHealth
    from apps.fleets.node.transports.local import LocalTransport

    reconcile(fleet3.fleet)

    def unreadable(self, fresh=False):  # type: ignore[no-untyped-def]
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(LocalTransport, "config_sha256", unreadable)
    assert services.fleet_health_collect(fleet=fleet3.fleet) >= 3 * 3
    assert {n.status for n in Node.objects.filter(fleet=fleet3.fleet)} == {Node.Status.UP}
    assert NodeHealth.objects.filter(node__fleet=fleet3.fleet).values("node").distinct().count() == 3


def test_nodes_applied_under_the_old_header_take_the_next_route_change_without_a_reload(fleet3: LocalFleet,
                                                                                        tiny_backend) -> None:
    """haproxy.cfg's header named the revision before 2026-11-26. A node applied then holds that file and its
    recorded digest is that set's, until its next push. GIVEN every node so, THEN a drift check finds no drift, and
    the next route change is still a runtime update (the same workers) that writes the new header: the rollout knows
    which bundle each node holds (BundleRenderer.applied), instead of taking them for changed and reloading all."""
    from apps.fleets import queries
    from apps.fleets.config.render import with_revision_header
    from apps.fleets.rollout.drift import fleet_drift_report
    from apps.fleets.rollout.execute import BundleRenderer

    new = tiny_backend("new")
    pool = add_pool(fleet3.lb, "new", (new.address, new.port))
    add_route(fleet3.lb, pool, "/new", 10)
    reconcile(fleet3.fleet)
    renderer = BundleRenderer()
    for node in Node.objects.filter(fleet=fleet3.fleet).select_related("applied_revision", "fleet"):
        bundle = renderer.bundle(node.applied_revision, node)
        older = with_revision_header(bundle, fleet=fleet3.fleet.name, revision=node.applied_revision.number,
                                     node_name=node.name)
        assert older.body == bundle.body and older.sha256 != bundle.sha256
        assert transport_for(queries.node_conn(node)).push(older, validate=False).ok  # as it was written then
        Node.objects.filter(pk=node.pk).update(applied_sha256=older.sha256)
    before = running_workers(fleet3)
    assert fleet_drift_report(fleet=fleet3.fleet).summary().startswith("No drift: all 3 node(s)")

    add_route(fleet3.lb, pool, "/hot", 11)  # a route-only change
    result = reconcile(fleet3.fleet)

    assert_succeeded(result["rollouts"][-1])
    assert fleet3.bodies("/hot/x") == {"n1": "new", "n2": "new", "n3": "new"}
    assert running_workers(fleet3) == before  # no reload
    for node in Node.objects.filter(fleet=fleet3.fleet):
        on_disk = (Path(node.config_dir) / "current" / "haproxy.cfg").read_text()
        assert "revision" not in on_disk.splitlines()[0] and "served.json" in on_disk.splitlines()[1]


@pytest.mark.django_db(transaction=True)  # a second connection holds a node's row, as a rollout's record does
def test_health_collection_marks_nodes_seen_and_up_in_a_few_statements_and_waits_for_no_locked_node(
    fleet3: LocalFleet,
) -> None:
    """Two statements per node every 5 s (400 at 201 nodes) became a few for the fleet. GIVEN n1 down, n2 unknown
    and n3's row held by another transaction (a rollout recording it), WHEN health is collected, THEN n1 and n2 are
    up and seen (n1 says it came back), n3 is left to that transaction instead of waited for, and the next
    collection sees it."""
    import threading
    import time

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    reconcile(fleet3.fleet)
    n1, n2, n3 = (Node.objects.get(pk=n.pk) for n in fleet3.nodes)
    Node.objects.filter(pk=n1.pk).update(status=Node.Status.DOWN, status_detail="unreachable")
    Node.objects.filter(pk=n2.pk).update(status=Node.Status.UNKNOWN)
    Node.objects.update(last_seen=None)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():  # as execute._record writes a node: an UPDATE, its row held to the commit
                Node.objects.filter(pk=n3.pk).update(status_detail="being recorded")
                locked.set()
                release.wait(15)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(5)
        started = time.monotonic()
        with CaptureQueriesContext(connection) as queries:
            services.fleet_health_collect(fleet=fleet3.fleet)
        took = time.monotonic() - started
    finally:
        release.set()
        holder.join()

    assert took < 5, "waited for the row another transaction held"
    node_writes = [q["sql"] for q in queries if q["sql"].startswith("UPDATE") and Node._meta.db_table in q["sql"]]
    assert len(node_writes) == 2, node_writes  # up where it was not, then seen: not two per node
    nodes = {n.name: n for n in Node.objects.all()}
    assert nodes["n1"].status == nodes["n2"].status == Node.Status.UP
    assert nodes["n1"].last_seen and nodes["n2"].last_seen and nodes["n3"].last_seen is None
    assert Event.objects.filter(type="node.health_changed", object_id=str(n1.pk)).exists()

    services.fleet_health_collect(fleet=fleet3.fleet)
    assert Node.objects.get(pk=n3.pk).last_seen is not None


def test_a_canary_whose_reload_fails_is_rolled_back_and_the_rollout_stops(fleet3: LocalFleet, monkeypatch) -> None:
    """GIVEN a port taken between the pre-check and the reload (simulated: the pre-check is told
    nothing is in the way) WHEN the canary reloads THEN HAProxy refuses, the canary goes back to its
    last good config, the other nodes are never touched and the rollout fails with the node's error."""
    reconcile(fleet3.fleet)
    before = {n.name: (n.applied_revision_id, n.worker_pid) for n in fleet3.nodes}
    from apps.balancers.models import Listener
    from apps.fleets.rollout import execute
    from tests.fleets.fleetkit import free_port_on

    port = free_port_on([n.bind_address for n in fleet3.nodes])
    Listener.objects.create(lb=fleet3.lb, name="second", port=port, default_pool=fleet3.listener.default_pool)
    monkeypatch.setattr(execute, "precheck_binds", lambda *args, **kwargs: [])
    stray = _hold("127.0.71.1", port)
    try:
        result = reconcile(fleet3.fleet)
    finally:
        stray.close()

    rollout = Rollout.objects.get(pk=result["rollouts"][-1])
    assert rollout.status == Rollout.Status.FAILED and "n1" in rollout.error and "reload failed" in rollout.error
    by_node = {r.node.name: r.status for r in rollout.results.select_related("node")}
    assert by_node == {"n1": "rolled_back", "n2": "skipped", "n3": "skipped"}
    nodes = {n.name: n for n in fleet3.nodes}
    assert {name: (n.applied_revision_id, n.worker_pid) for name, n in nodes.items() if name != "n1"} == {
        name: value for name, value in before.items() if name != "n1"}
    assert nodes["n1"].applied_revision_id == before["n1"][0] and nodes["n1"].status == Node.Status.UP
    assert set(fleet3.bodies("/").values()) == {"old"}  # every node serves, n1 included
    assert services.fleet_drift_check(fleet=fleet3.fleet) == []


def test_an_uploaded_certificate_is_served_by_every_node_with_its_key_kept_private(fleet3: LocalFleet) -> None:
    import os
    import ssl
    import stat

    from apps.balancers.models import Listener
    from apps.fleets.config.certificates import certificate_save
    from tests.fleets.fleetkit import free_port_on, self_signed

    cert_pem, key_pem = self_signed(days=90, name="shop.example.com")
    cert = certificate_save(principal=_system(fleet3), cert=Certificate(), org=fleet3.lb.org, name="shop",
                            cert_pem=cert_pem, key_pem=key_pem)
    port = free_port_on([n.bind_address for n in fleet3.nodes])
    Listener.objects.create(lb=fleet3.lb, name="https", protocol="https", port=port, certificate=cert,
                            default_pool=fleet3.listener.default_pool)

    result = reconcile(fleet3.fleet)

    assert_succeeded(result["rollouts"][-1])
    context = ssl.create_default_context(cadata=cert_pem)
    context.check_hostname = True
    for node in fleet3.nodes:
        import http.client

        conn = http.client.HTTPSConnection(node.bind_address, port, timeout=3, context=context)
        try:
            conn.request("GET", "/", headers={"Host": "shop.example.com"})
            assert conn.getresponse().read() == b"old"
        except ssl.SSLCertVerificationError:
            # The node's IP is not in the certificate: verify the chain, not the name.
            context.check_hostname = False
            conn = http.client.HTTPSConnection(node.bind_address, port, timeout=3, context=context)
            conn.request("GET", "/")
            assert conn.getresponse().read() == b"old"
        finally:
            conn.close()
        certs_dir = f"{node.config_dir}/current/certs"
        [name] = os.listdir(certs_dir)
        assert stat.S_IMODE(os.stat(f"{certs_dir}/{name}").st_mode) == 0o600
    revision = Rollout.objects.get(pk=result["rollouts"][-1]).revision
    assert "PRIVATE KEY" not in revision.text and "PRIVATE KEY" not in str(revision.snapshot)


def _system(local: LocalFleet):
    from apps.accounts.principal import Principal

    return Principal(org=local.lb.org, role="admin")


def test_verify_finds_every_proxy_the_bundle_declares_and_names_the_ones_the_worker_lacks(
    fleet3: LocalFleet, tiny_backend
) -> None:
    """verify() reads the worker's frontends (`show stat -1 1 -1`) and backends (`show backend`), not the whole
    `show stat` with every server: the rolled-out bundle passes on every node, and one that declares a proxy the
    running worker does not have is named."""
    new = tiny_backend("new")
    add_route(fleet3.lb, add_pool(fleet3.lb, "new", (new.address, new.port)), "/new", 10)
    reconcile(fleet3.fleet)
    for node in Node.objects.filter(fleet=fleet3.fleet).select_related("applied_revision"):
        bundle = render(selectors.revision_snapshot(node.applied_revision), selectors.node_spec(node))
        assert len(bundle.rendered_manifest.backends) >= 2 and bundle.rendered_manifest.frontends
        transport = transport_for(selectors.node_conn(node))
        try:
            assert verify(transport, bundle, node.address) is None, node.name
            manifest = bundle.rendered_manifest
            ghost = replace(bundle, manifest=replace(manifest, frontends=(*manifest.frontends, "fe_ghost"),
                                                     backends=(*bundle.rendered_manifest.backends, "p999_ghost")))
            worker = MasterSocket(f"{node.runtime_dir}/master.sock").show_proc().current_worker.pid
            problem = verify(transport, ghost, node.address, worker)
            # The failure says what the node itself shows: who answered, and whether its files on disk are the bundle's.
            assert problem == ("the worker does not list frontend fe_ghost, backend p999_ghost (answered by worker "
                               f"{worker}, the one expected; the node's files on disk are the bundle's)"), problem
            assert f"not worker {worker + 1} as expected" in verify(transport, ghost, node.address, worker + 1)
            # Files that moved on disk without a reload: the node's files are no longer the bundle's.
            config = Path(node.config_dir) / "current" / "haproxy.cfg"
            served = config.read_bytes()
            moved = config.with_name("haproxy.cfg.moved")
            moved.write_bytes(served + b"\nbackend p999_ghost\n  server s 127.0.0.1:9\n")
            moved.replace(config)  # by rename: sets share unchanged files through hard links
            try:
                problem = verify(transport, ghost, node.address, worker)
                assert "; the node's files on disk are not the bundle's (" in problem, problem
            finally:
                moved.write_bytes(served)
                moved.replace(config)
        finally:
            transport.close()
