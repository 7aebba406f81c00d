"""Open HTTP-01 answers survive reloads and restarts: they are stored (fleets.ChallengeAnswer) and a
node reloaded by any worker takes them back at once (delivery.apply_node). Real HAProxy nodes of two
regions; the last test orders from a real ACME CA (pebble) with a reload between the answers being
published and the CA fetching them."""

from __future__ import annotations

import pytest

from apps.acme import client, services
from apps.acme.client import Challenge
from apps.acme.services import FleetHttp01Solver
from apps.balancers.models import Listener
from apps.fleets import services as fleet_services
from apps.fleets.config.render.frontends import ACME_CHALLENGE_MAP
from apps.fleets.demo.localnodes import start_local_node, stop_local_node
from apps.fleets.models import ChallengeAnswer, Node
from apps.fleets.node.runtime_api import HAProxySocket
from tests.acme.acmekit import EU_NODES, US_NODES, approve, principal_of
from tests.netutil import free_port_on, http_get

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def _answers(two_regions, token: str) -> dict[str, tuple[int, str]]:
    port = two_regions.ports.http
    return {n.name: http_get(f"http://{n.bind_address}:{port}/.well-known/acme-challenge/{token}")
            for n in two_regions.nodes}


def _force_reload(two_regions) -> None:
    """A change only a reload can apply (a new bind) rolled out to both fleets."""
    port = free_port_on(US_NODES + EU_NODES)
    Listener.objects.create(lb=two_regions.lb, name=f"extra{port}", port=port,
                            default_pool=two_regions.http.default_pool)
    two_regions.reconcile()


def test_an_open_answer_is_served_again_after_a_reload_and_a_restart_and_a_withdrawn_one_is_not(
        two_regions) -> None:
    """GIVEN an HTTP-01 answer published on every node, WHEN a rollout reloads every node, THEN each
    new worker answers it; WHEN a node's HAProxy restarts (all runtime state gone) THEN it answers from its
    own files, before and after the fleet converges; once withdrawn, a later reload does not bring it back."""
    solver = FleetHttp01Solver()
    challenge = Challenge("http-01", "shop.acme.test", "tok-durable_1", "tok-durable_1.thumb")
    solver.present([challenge])
    assert ChallengeAnswer.objects.filter(token="tok-durable_1").exists()
    pids = two_regions.worker_pids()

    _force_reload(two_regions)

    after = two_regions.worker_pids()
    assert all(after[name] != pid for name, pid in pids.items()), (pids, after)  # every node reloaded
    assert set(_answers(two_regions, "tok-durable_1").values()) == {(200, "tok-durable_1.thumb")}

    node = Node.objects.select_related("fleet").get(bind_address=EU_NODES[0])
    stop_local_node(two_regions.procs[node.pk])
    two_regions.procs[node.pk] = start_local_node(node)  # the same config from disk, no runtime state
    port = two_regions.ports.http
    # the restarted node answers from its challenge map file (the answers are written there as they are published)
    answer = http_get(f"http://{node.bind_address}:{port}/.well-known/acme-challenge/tok-durable_1")
    assert answer == (200, "tok-durable_1.thumb")
    # the periodic converge: the drift check sees the new worker started from the verified files, reads its live
    # state (the answer included) as theirs and adopts it; nothing is pushed or reloaded
    restarted = int(HAProxySocket(f"{node.runtime_dir}/stats.sock").show_info()["Pid"])
    assert restarted != node.worker_pid
    assert fleet_services.fleet_converge(fleet=node.fleet, enqueue=False) is None
    node.refresh_from_db()
    assert node.status == Node.Status.UP and node.worker_pid == restarted
    assert int(HAProxySocket(f"{node.runtime_dir}/stats.sock").show_info()["Pid"]) == restarted  # no reload
    fleet_services.fleet_reconcile(fleet_id=node.fleet_id)
    assert set(_answers(two_regions, "tok-durable_1").values()) == {(200, "tok-durable_1.thumb")}

    solver.cleanup([challenge])
    assert not ChallengeAnswer.objects.filter(token="tok-durable_1").exists()
    _force_reload(two_regions)
    assert set(_answers(two_regions, "tok-durable_1").values()) == {(200, "web")}


def test_the_drift_check_keeps_open_answers_and_puts_back_a_lost_one_without_a_reload(two_regions) -> None:
    """The challenge map is rendered empty: the periodic live drift check used to find an open answer
    "unexpected" and swap the map back to empty in the middle of an order. Now an open answer is
    kept, and one a node lost (deleted over its stats socket) is put back through the runtime API."""
    solver = FleetHttp01Solver()
    challenge = Challenge("http-01", "shop.acme.test", "tok-drift_1", "tok-drift_1.thumb")
    solver.present([challenge])
    pids = two_regions.worker_pids()
    for fleet in two_regions.fleets:
        report = fleet_services.fleet_drift_report(fleet=fleet)
        assert not report.drifted and not report.repaired, report.summary()
    assert set(_answers(two_regions, "tok-drift_1").values()) == {(200, "tok-drift_1.thumb")}

    node = Node.objects.select_related("fleet").get(bind_address=US_NODES[1])
    HAProxySocket(f"{node.runtime_dir}/stats.sock").del_map_entry(ACME_CHALLENGE_MAP, "tok-drift_1")
    report = fleet_services.fleet_drift_report(fleet=node.fleet)
    assert list(report.repaired) == [node.name] and not report.drifted, report.summary()
    assert set(_answers(two_regions, "tok-drift_1").values()) == {(200, "tok-drift_1.thumb")}
    assert two_regions.worker_pids() == pids  # put back at run time: no reload
    solver.cleanup([challenge])


def test_an_order_whose_nodes_reload_while_the_ca_validates_is_issued(
        two_regions, pebble, acme_settings, alice, monkeypatch) -> None:
    """GIVEN an order whose HTTP-01 answer is published, WHEN every node reloads before the CA fetches
    it (another change rolled out meanwhile), THEN the CA still finds the answer and the certificate
    is issued (before, the reload dropped the answer and the order failed)."""
    approve(alice.org, "reload.acme.test")
    pebble.resolve("reload.acme.test", EU_NODES[0])
    managed = services.managed_certificate_request(principal=principal_of(alice), name="reload",
                                                   hostnames=["reload.acme.test"])
    pids = two_regions.worker_pids()
    complete = client.complete

    def reload_first(pending, timeout_s, timings=None):  # type: ignore[no-untyped-def]
        _force_reload(two_regions)
        return complete(pending, timeout_s, timings)

    monkeypatch.setattr(client, "complete", reload_first)

    order = services.managed_certificate_issue(managed_id=managed.pk)

    assert order is not None and order.status == "valid", order.error
    after = two_regions.worker_pids()
    assert all(after[name] != pid for name, pid in pids.items())  # the reload did happen
    assert not ChallengeAnswer.objects.exists()  # withdrawn once the order ended


def test_answers_of_an_order_left_open_expire(db) -> None:
    """A worker killed mid-order never withdraws its answers: the renewal sweep forgets them once
    expired, and until then only unexpired ones are put back on a reload."""
    import datetime as dt

    from django.utils import timezone

    from apps.acme.tasks import renew_due_task
    from apps.fleets import selectors

    now = timezone.now()
    ChallengeAnswer.objects.create(token="old", key_authorization="old.k", expires_at=now - dt.timedelta(seconds=1))
    ChallengeAnswer.objects.create(token="open", key_authorization="open.k", expires_at=now + dt.timedelta(hours=1))
    assert selectors.challenge_answers() == (("open", "open.k"),)
    renew_due_task()
    assert list(ChallengeAnswer.objects.values_list("token", flat=True)) == ["open"]
