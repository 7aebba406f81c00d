"""ACME tasks have their own queue and worker: a certificate is issued and deployed while the main
`celery` queue's worker is busy, as `make run` starts them (runall: `--queues acme --concurrency 1`)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from apps.acme import services
from apps.acme.deploy import handshake_serial
from apps.acme.models import AcmeOrder
from apps.fleets.config import certificates as certs
from apps.fleets.models import Certificate
from apps.fleets.node.apply import pem_serial
from apps.scheduling import services as scheduling
from apps.scheduling.models import Job, JobRun
from controlplane.celery import app as celery_app
from tests.acme.acmekit import EU_NODES, US_NODES, approve, principal_of
from tests.fleets.fleetkit import self_signed
from tests.netutil import free_port_on
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]


def test_acme_tasks_are_routed_to_the_acme_queue_and_fleet_tasks_to_theirs() -> None:
    route = celery_app.amqp.router.route
    for name in ("acme.issue_certificate_task", "acme.issue_certificates_task", "acme.renew_due_task"):
        assert route({}, name)["queue"].name == "acme", name
    for name in ("fleets.reconcile_task", "fleets.converge_fleet_task"):
        assert route({}, name, args=(7,))["queue"].name.startswith("fleets."), name
    for name in ("fleets.converge_task", "scheduling.run_job_task"):
        assert route({}, name)["queue"].name == "celery", name


@pytest.mark.django_db(transaction=True)
def test_a_certificate_is_issued_by_the_acme_worker_while_the_celery_worker_is_busy(
        two_regions, pebble, acme_settings, alice, celery_worker_factory, tmp_path: Path) -> None:
    """GIVEN the main worker (`celery` queue, one slot) busy with a 60 s job and the acme worker idle
    WHEN alice asks for a certificate taking over the placeholder an https listener serves
    THEN the acme worker orders it and every node serves it (no reload) while the job still runs,
    and the order records how long each step took."""
    host = "queue.acme.test"
    approve(alice.org, host)
    pebble.resolve(host, US_NODES[1])
    cert_pem, key_pem = self_signed(30, host)
    placeholder = certs.certificate_save(principal=None, cert=Certificate(org=alice.org), org=alice.org,
                                         name="queue", cert_pem=cert_pem, key_pem=key_pem)
    port = free_port_on(US_NODES + EU_NODES)
    two_regions.lb.listeners.create(name="tls-queue", protocol="https", port=port,
                                    default_pool=two_regions.http.default_pool, certificate=placeholder)
    two_regions.reconcile()
    pids = two_regions.worker_pids()

    acme_env = {"ACME_DIRECTORY_URL": pebble.directory_url, "ACME_CA_BUNDLE": pebble.ca_bundle,
                "ACME_TIMEOUT_S": "30"}
    main = celery_worker_factory(name="main", queues="celery", **acme_env)
    celery_worker_factory(name="acme", queues="acme", **acme_env)
    job = scheduling.job_save(principal=None, job=Job(), data={
        "org": alice.org, "name": "hog", "kind": "noop", "params": {"sleep_s": 60},
        "schedule_type": "interval", "interval_s": 3600, "timeout_s": 120})
    run = scheduling.job_run_now(principal=None, job=job)
    assert wait_for(lambda: JobRun.objects.get(pk=run.pk).status == JobRun.Status.RUNNING, 20)

    started = time.monotonic()
    managed = services.managed_certificate_request(principal=principal_of(alice), name="queue-managed",
                                                   hostnames=[host], certificate=placeholder)
    issued = wait_for(lambda: AcmeOrder.objects.filter(managed=managed).exclude(status="running").exists(), 40)
    logs = {p.name: p.read_text() for p in tmp_path.glob("celery-*.log")}
    assert issued, logs
    order = AcmeOrder.objects.get(managed=managed)
    assert order.status == AcmeOrder.Status.VALID, order.error
    assert time.monotonic() - started < 40
    assert JobRun.objects.get(pk=run.pk).status == JobRun.Status.RUNNING  # the main worker never got free
    received = "Task acme.issue_certificate_task["  # celery's "received" / "succeeded" lines
    assert received in logs["celery-acme.log"]
    assert received not in logs["celery-main.log"]

    serial = int(pem_serial(Certificate.objects.get(pk=placeholder.pk).cert_pem.encode()), 16)
    for node in two_regions.nodes:
        assert handshake_serial(node.bind_address, port, host) == serial, node.name
    assert two_regions.worker_pids() == pids  # the placeholder was replaced hot
    assert set(order.steps) >= {"queued_s", "authorize_s", "finalize_s", "roll_out_s"}
    assert all(value >= 0 for value in order.steps.values()), order.steps
    # Done: the main worker's warm shutdown would wait out the 60 s job (the fixture's SIGKILL came after 10 s).
    main.send_signal(signal.SIGQUIT)  # Celery's cold shutdown
    main.wait(timeout=30)
