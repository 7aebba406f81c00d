"""Certificates due together are ordered together: one render and push per fleet for the batch."""

from __future__ import annotations

import pytest

from apps.acme import services
from apps.acme.deploy import handshake_serial
from apps.fleets.config.revisions import CERTIFICATES_ONLY_NOTE
from apps.fleets.models import Certificate, ConfigRevision, Rollout
from apps.fleets.node.apply import pem_serial
from tests.acme.acmekit import EU_NODES, US_NODES, approve, principal_of
from tests.netutil import free_port_on

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def test_certificates_due_together_are_deployed_in_one_rollout_per_fleet_and_a_failure_stops_none(
        two_regions, pebble, acme_settings, alice) -> None:
    """GIVEN two issued certificates serving on https listeners and a third whose name points nowhere,
    WHEN all three renew together, THEN both good ones reach every node of both regions in one
    rollout per fleet (the revision skips `haproxy -c`: only certificate contents changed), with no
    reload, and the third fails with the CA's reason without holding the others back."""
    good = []
    for name in ("a", "b"):
        host = f"{name}.batch.acme.test"
        approve(alice.org, host)
        pebble.resolve(host, EU_NODES[0] if name == "a" else US_NODES[1])
        good.append(services.managed_certificate_request(principal=principal_of(alice), name=name,
                                                         hostnames=[host]))
    first = services.managed_certificates_issue(managed_ids=[m.pk for m in good])
    assert [o.status for o in first] == ["valid", "valid"], [o.error for o in first]
    ports = {}
    for managed in good:
        managed.refresh_from_db()
        ports[managed.pk] = free_port_on(US_NODES + EU_NODES)
        two_regions.lb.listeners.create(name=f"tls-{managed.name}", protocol="https", port=ports[managed.pk],
                                        default_pool=two_regions.http.default_pool,
                                        certificate=managed.certificate)
    two_regions.reconcile()
    pids = two_regions.worker_pids()
    approve(alice.org, "gone.batch.acme.test")
    pebble.resolve("gone.batch.acme.test", "127.18.9.9")
    gone = services.managed_certificate_request(principal=principal_of(alice), name="gone",
                                                hostnames=["gone.batch.acme.test"])
    last_rollout = Rollout.objects.order_by("-pk").values_list("pk", flat=True).first()

    orders = services.managed_certificates_issue(managed_ids=[good[0].pk, gone.pk, good[1].pk], force=True)

    by_name = {o.managed.name: o for o in orders}
    assert by_name["gone"].status == "failed" and "127.18.9.9" in by_name["gone"].error
    for managed in good:
        order = by_name[managed.name]
        assert order.status == "valid", order.error
        assert len(order.deployed) == 3 and set(order.deployed.values()) == {"ok"}, order.deployed
        serial = int(pem_serial(Certificate.objects.get(pk=managed.certificate_id).cert_pem.encode()), 16)
        for node in two_regions.nodes:
            assert handshake_serial(node.bind_address, ports[managed.pk], managed.hostnames[0]) == serial
    rollouts = Rollout.objects.filter(pk__gt=last_rollout)
    assert sorted(r.fleet.name for r in rollouts) == ["eu", "us"]  # one per fleet for both certificates
    assert all(r.status == "succeeded" for r in rollouts)
    assert not any(r.canary for r in rollouts)  # certificate contents only: every node at once
    revisions = ConfigRevision.objects.filter(pk__in=[r.revision_id for r in rollouts])
    assert {r.validation_output for r in revisions} == {CERTIFICATES_ONLY_NOTE}
    assert {r.validation_kind for r in revisions} == {ConfigRevision.Validation.CERTIFICATES_ONLY}
    assert two_regions.worker_pids() == pids  # hot: not one reload
