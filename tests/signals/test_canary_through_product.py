"""A watched canary through the product: real HAProxy nodes with traffic through each, the real collector and a
real Celery worker. A member change sent through the API makes the canary answer 500: the worker's rollout sees
the 5xx rise on the canary against the other nodes, puts the canary back and stops, and the other nodes never
serve the change (their clients got nothing but 200s, their own counters say no 5xx). A harmless change then
passes its watch and reaches every node."""

from __future__ import annotations

import threading
import time

import pytest

from apps.events.models import Event
from apps.fleets import queries
from apps.fleets.models import Fleet, Node, NodeResult, Rollout
from apps.fleets.node.outside_rollout import read_state
from tests.browser import login, shot
from tests.fleets.fleetkit import LocalFleet, make_local_fleet, reconcile
from tests.netutil import free_udp_port
from tests.processes import process_env, start_python, stop_process
from tests.signals.signalkit import address_of, slow_backend
from tests.waiting import wait_until

pytestmark = [pytest.mark.haproxy, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WATCH_S = 30


class Traffic:
    """Requests through every node, round after round, until stopped: (node name, status) as answered."""

    def __init__(self, local: LocalFleet, nodes: list[Node]) -> None:
        self.local, self.nodes = local, nodes
        self.seen: list[tuple[float, str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            for node in self.nodes:
                status, _ = self.local.get(node, f"/t?n={n}")
                self.seen.append((time.monotonic(), node.name, status))
            n += 1
            time.sleep(0.005)

    def statuses(self, node: str, since: float = 0.0) -> set[int]:
        return {status for t, name, status in list(self.seen) if name == node and t >= since}


def _frontend_5xx(local: LocalFleet, node: Node) -> int:
    state = read_state(queries.node_conn(node), with_stats=True)
    return sum(int(row.raw.get("hrsp_5xx") or 0) for row in state.stats
               if row.svname == "FRONTEND" and row.pxname == f"fe_{local.lb.name}.http")


def test_a_canary_whose_5xx_rise_is_rolled_back_by_itself_before_any_other_node_sees_it(
        haproxy_bin, tmp_path, celery_worker_factory, otto, page, live_server):
    ok, broken = slow_backend("ok"), slow_backend("broken", status=500)
    port = free_udp_port()
    collector = start_python(["manage.py", "runsignals", "--listen", f"127.0.0.1:{port}"], process_env(),
                             tmp_path / "collector.log")
    local = make_local_fleet(name="can", subnet=94, node_count=3, backend_address=address_of(ok))
    traffic = None
    try:
        fleet = local.fleet
        Fleet.objects.filter(pk=fleet.pk).update(signals_target=f"127.0.0.1:{port}")
        wait_until(lambda: b"listening on" in (tmp_path / "collector.log").read_bytes(), timeout_s=20)
        reconcile(fleet)
        nodes = local.nodes
        first = {n.name: n.applied_revision.number for n in nodes}
        assert len(set(first.values())) == 1 and [local.get(n)[1] for n in nodes] == ["ok"] * 3

        # The operator turns the watch on through the API.
        answer = otto.client.patch(f"/api/v1/fleets/{fleet.pk}/", {"canary_watch_s": WATCH_S,
                                                                     "guard_5xx_rise_pct": 5}, format="json")
        assert answer.status_code == 200, answer.content
        assert (answer.json()["canary_watch_s"], answer.json()["guard_5xx_rise_pct"]) == (WATCH_S, 5.0)
        celery_worker_factory()
        traffic = Traffic(local, nodes)
        traffic.thread.start()
        time.sleep(3)  # the other nodes' baseline and the canary's minute before both exist

        member = local.listener.default_pool.members.get()
        changed_at = time.monotonic()
        answer = otto.client.patch(f"/api/v1/members/{member.pk}/", {"port": address_of(broken)[1]}, format="json")
        assert answer.status_code == 200, answer.content
        revision = first["n1"]

        def finished() -> Rollout | None:
            return (Rollout.objects.filter(fleet=fleet, revision__number__gt=revision,
                                           status__in=[Rollout.Status.SUCCEEDED, Rollout.Status.FAILED,
                                                       Rollout.Status.ROLLED_BACK]).order_by("-id").first())

        rollout = wait_until(finished, timeout_s=WATCH_S + 30, what="the watched rollout ends")
        ended_at = time.monotonic()
        assert rollout.status == Rollout.Status.ROLLED_BACK, (rollout.status, rollout.error)
        assert "5xx rose" in rollout.error and "against the other nodes" in rollout.error, rollout.error
        # It tripped on the figures, not at the end of the watch.
        assert (rollout.finished_at - rollout.started_at).total_seconds() < WATCH_S
        results = {r.node.name: r for r in rollout.results.select_related("node")}
        assert results["n1"].status == NodeResult.Status.ROLLED_BACK
        assert {results[n].status for n in ("n2", "n3")} == {NodeResult.Status.SKIPPED}

        # The canary's clients saw the 500s; nobody else's did, by their answers and the nodes' own counters.
        assert 500 in traffic.statuses("n1", changed_at)
        assert traffic.statuses("n2") == traffic.statuses("n3") == {200}
        assert _frontend_5xx(local, nodes[1]) == _frontend_5xx(local, nodes[2]) == 0
        # The canary serves what it served before, and every node is on the fleet's desired revision again.
        time.sleep(1.5)
        assert traffic.statuses("n1", ended_at) == {200}  # restored before the rollout was marked done
        fleet.refresh_from_db()
        assert fleet.desired_revision == revision
        assert {n.name: n.applied_revision.number for n in local.nodes} == first
        assert all(n.status == Node.Status.UP for n in local.nodes)
        event = Event.objects.get(type="rollout.canary_failed", object_type="fleet")
        assert event.data["node"] == "n1" and "5xx rose" in event.data["reason"]
        # The rollout's page says why it stopped, in the figures the judge used.
        otto.user.set_password("otto-pass-123")
        otto.user.save()
        login(page, "otto", "otto-pass-123")
        page.goto(f"{live_server.url}/fleets/rollouts/{rollout.pk}/")
        stopped = page.get_by_test_id("canary-stopped")
        assert "Stopped at its canary" in stopped.inner_text() and "5xx rose from" in stopped.inner_text()
        count = page.get_by_test_id("rollout-count").inner_text()
        assert count == f"0/3 nodes took revision {revision + 1}, 1 put back, 2 not attempted", count
        shot(page, "canary-stopped")

        # A harmless change (the member back on its healthy port) passes a short watch and reaches every node.
        assert otto.client.patch(f"/api/v1/fleets/{fleet.pk}/", {"canary_watch_s": 12},
                                 format="json").status_code == 200
        answer = otto.client.patch(f"/api/v1/members/{member.pk}/", {"port": address_of(ok)[1]}, format="json")
        assert answer.status_code == 200, answer.content
        passed = wait_until(lambda: Rollout.objects.filter(fleet=fleet, pk__gt=rollout.pk,
                                                           status=Rollout.Status.SUCCEEDED).first(),
                            timeout_s=40, what="the harmless change's rollout succeeds")
        canary_result = passed.results.get(node__name="n1")
        assert canary_result.error.startswith("canary watched:"), canary_result.error
        assert len({n.applied_revision.number for n in local.nodes}) == 1
        assert [local.get(n)[1] for n in local.nodes] == ["ok"] * 3
    finally:
        if traffic is not None:
            traffic.stop.set()
            traffic.thread.join(5)
        local.stop_all()
        stop_process(collector)
        for server in (ok, broken):
            server.shutdown()
            server.server_close()
