"""Fleets API: who may read and write what, revisions with diffs, rollouts, preview, the long-poll."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from apps.balancers.models import LoadBalancer, Region, Route
from apps.core import crypto
from apps.fleets import services
from apps.fleets.models import Certificate, ConfigRevision, Fleet, Node, Rollout

from .fleetkit import self_signed

pytestmark = pytest.mark.django_db


def node_payload(**extra):
    return {"fleet": "edge", "name": "n1", "address": "127.0.0.1", "runtime_dir": "/run/spillway/n1",
            "config_dir": "/etc/spillway/n1", **extra}


def test_anonymous_callers_are_refused_everywhere(shared, anon) -> None:
    for path in ("/api/v1/fleets/", "/api/v1/nodes/", "/api/v1/config-revisions/", "/api/v1/rollouts/",
                 f"/api/v1/load-balancers/{shared['lb'].pk}/applied/?revision=1"):
        assert anon.get(path).status_code == 401, path
    assert anon.post(f"/api/v1/load-balancers/{shared['lb'].pk}/preview/").status_code == 401


def test_operators_manage_fleets_and_nodes_and_customers_find_nothing(shared, otto, alice, charlie) -> None:
    response = otto.client.post("/api/v1/fleets/", {"name": "eu", "region": "us-east", "batch_size": 2},
                                format="json")
    assert response.status_code == 201, response.json()
    assert otto.client.get("/api/v1/fleets/").json()["count"] == 2
    fleet_id = shared["fleet"].pk
    assert otto.client.get(f"/api/v1/fleets/{fleet_id}/").json()["load_balancers"] == ["edge"]

    assert alice.client.post("/api/v1/fleets/", {"name": "x", "region": "us-east"}, format="json"
                             ).status_code == 403
    assert alice.client.get("/api/v1/fleets/").json()["count"] == 0
    assert alice.client.get(f"/api/v1/fleets/{fleet_id}/").status_code == 404
    assert charlie.client.get("/api/v1/nodes/").json()["count"] == 0
    assert otto.client.post("/api/v1/nodes/", node_payload(), format="json").status_code == 201


def test_node_paths_and_ssh_material_are_validated_and_keys_never_come_back(shared, otto, sshd) -> None:
    bad = otto.client.post("/api/v1/nodes/", node_payload(runtime_dir="/run/x y"), format="json")
    assert bad.status_code == 400 and "runtime_dir" in bad.json()["fields"]
    unpinned = otto.client.post("/api/v1/nodes/", node_payload(transport="ssh", ssh_private_key=sshd.client_key),
                                format="json")
    assert unpinned.status_code == 400 and "ssh_known_hosts" in unpinned.json()["fields"]

    ok = otto.client.post("/api/v1/nodes/", node_payload(
        transport="ssh", ssh_host="127.0.0.1", ssh_port=sshd.port, ssh_private_key=sshd.client_key,
        ssh_known_hosts=sshd.host_public_key), format="json")

    assert ok.status_code == 201, ok.json()
    body = ok.json()
    assert "ssh_private_key" not in body and body["has_ssh_key"] is True
    stored = Node.objects.get(pk=body["id"]).ssh_private_key_encrypted
    assert "PRIVATE KEY" not in stored and crypto.decrypt(stored) == sshd.client_key


def test_revisions_carry_a_diff_and_are_operator_only(shared, otto, alice) -> None:
    first = services.fleet_render(fleet=shared["fleet"])
    Route.objects.filter(org=shared["pools"]["acme"].org).update(path="/shop")
    second = services.fleet_render(fleet=shared["fleet"])
    assert second.number == first.number + 1

    detail = otto.client.get(f"/api/v1/config-revisions/{second.pk}/").json()

    pool = shared["pools"]["acme"].pk
    assert f"-acme.example.com/ p{pool}" in detail["diff"] and f"+acme.example.com/shop/ p{pool}" in detail["diff"]
    assert detail["validation_ok"] is True and "frontend fe_edge.http" in detail["text"]
    assert "text" not in otto.client.get("/api/v1/config-revisions/").json()["results"][0]
    assert alice.client.get(f"/api/v1/config-revisions/{second.pk}/").status_code == 404


def test_operators_create_rollouts_and_customers_read_only_their_lbs_rollouts(
    shared, otto, alice, charlie
) -> None:
    Node.objects.create(fleet=shared["fleet"], name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                        config_dir="/etc/spw/n1")
    response = otto.client.post("/api/v1/rollouts/", {"fleet": "edge", "canary": True}, format="json")
    assert response.status_code == 201, response.json()
    rollout = response.json()
    assert rollout["status"] == "pending" and rollout["revision"] == 1 and rollout["kind"] == "deploy"
    assert [r["node"] for r in rollout["results"]] == ["n1"]
    Rollout.objects.filter(pk=rollout["id"]).update(status="failed", error="haproxy said: acme.example.com")

    seen = alice.client.get(f"/api/v1/rollouts/{rollout['id']}/")  # edge is shared: acme can see it
    assert seen.status_code == 200 and "acme.example.com" not in seen.json()["error"]
    assert alice.client.post("/api/v1/rollouts/", {"fleet": "edge"}, format="json").status_code == 403
    assert alice.client.post(f"/api/v1/rollouts/{rollout['id']}/rollback/").status_code == 403
    LoadBalancer.objects.filter(pk=shared["lb"].pk).update(shared=False)
    assert charlie.client.get(f"/api/v1/rollouts/{rollout['id']}/").status_code == 404
    assert otto.client.get(f"/api/v1/rollouts/{rollout['id']}/").json()["error"].startswith("haproxy said")


def test_rollback_action_and_rollout_to_an_earlier_revision(shared, otto) -> None:
    first = services.fleet_render(fleet=shared["fleet"])
    r1 = services.rollout_create(fleet=shared["fleet"], revision=first, enqueue=False)
    Rollout.objects.filter(pk=r1.pk).update(status="succeeded")
    Route.objects.filter(priority=100).update(path="/v2")
    r2 = otto.client.post("/api/v1/rollouts/", {"fleet": "edge"}, format="json").json()
    assert r2["revision"] == 2 and r2["from_revision"] == 1

    back = otto.client.post(f"/api/v1/rollouts/{r2['id']}/rollback/")

    assert back.status_code == 201 and back.json()["revision"] == 1 and back.json()["kind"] == "rollback"
    assert Fleet.objects.get(pk=shared["fleet"].pk).desired_revision == 1
    again = otto.client.post("/api/v1/rollouts/", {"fleet": "edge", "revision": 2}, format="json")
    assert again.status_code == 201 and again.json()["kind"] == "deploy"
    missing = otto.client.post("/api/v1/rollouts/", {"fleet": "edge", "revision": 99}, format="json")
    assert missing.status_code == 404


def test_preview_shows_the_next_diff_without_storing_or_pushing_and_hides_other_tenants(
    shared, otto, alice
) -> None:
    revision = services.fleet_render(fleet=shared["fleet"])
    services.rollout_create(fleet=shared["fleet"], revision=revision, enqueue=False)
    Route.objects.filter(priority=100).update(path="/acme-new")
    Route.objects.filter(priority=200).update(path="/globex-new")
    count = ConfigRevision.objects.count()

    as_operator = otto.client.post(f"/api/v1/load-balancers/{shared['lb'].pk}/preview/").json()
    as_customer = alice.client.post(f"/api/v1/load-balancers/{shared['lb'].pk}/preview/").json()

    assert ConfigRevision.objects.count() == count and not Rollout.objects.filter(status="running").exists()
    [op] = as_operator["fleets"]
    assert op["changed"] and op["valid"] and "/acme-new" in op["diff"] and "/globex-new" in op["diff"]
    [cu] = as_customer["fleets"]
    assert "/acme-new" in cu["diff"] and "globex" not in cu["diff"] and cu["scope"] == "own"
    assert "hidden_lines" not in cu, "no count of other tenants' changes"
    assert "validation_output" not in cu


def test_preview_of_an_invisible_lb_is_404(shared, charlie) -> None:
    LoadBalancer.objects.filter(pk=shared["lb"].pk).update(shared=False)
    assert charlie.client.post(f"/api/v1/load-balancers/{shared['lb'].pk}/preview/").status_code == 404


def _apply(node: Node, revision: ConfigRevision) -> None:
    Node.objects.filter(pk=node.pk).update(applied_revision=revision, status="up")


def test_applied_answers_202_with_node_state_then_200_once_every_node_serves_it(shared, alice) -> None:
    lb = shared["lb"]
    nodes = [Node.objects.create(fleet=shared["fleet"], name=f"n{i}", address="127.0.0.1",
                                 runtime_dir=f"/run/spw/n{i}", config_dir=f"/etc/spw/n{i}") for i in (1, 2)]
    revision = services.fleet_render(fleet=shared["fleet"])
    wanted = LoadBalancer.objects.get(pk=lb.pk).revision
    _apply(nodes[0], revision)

    started = time.monotonic()
    waiting = alice.client.get(f"/api/v1/load-balancers/{lb.pk}/applied/?revision={wanted}&timeout=0.3")
    assert waiting.status_code == 202 and time.monotonic() - started >= 0.3
    states = {n["node"]: n for n in waiting.json()["nodes"]}  # a customer: positions, not the node names
    assert states["node 1"]["done"] and not states["node 2"]["done"] and states["node 2"]["applied_revision"] is None

    _apply(nodes[1], revision)
    done = alice.client.get(f"/api/v1/load-balancers/{lb.pk}/applied/?revision={wanted}&timeout=1000")
    assert done.status_code == 200 and done.json()["applied"] is True
    assert alice.client.get(f"/api/v1/load-balancers/{lb.pk}/applied/?revision=x").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_applied_returns_as_soon_as_the_last_node_is_verified(ops, acme, globex, alice) -> None:
    region = Region.objects.create(slug="us-east", name="US East")
    fleet = Fleet.objects.create(name="edge", region=region)
    lb = LoadBalancer.objects.create(org=acme, name="shop", fleet=fleet)
    node = Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                               config_dir="/etc/spw/n1")
    revision = services.fleet_render(fleet=fleet)
    def apply_in_thread() -> None:
        try:
            _apply(node, revision)
        finally:
            connection.close()  # this thread's own connection

    timer = threading.Timer(0.4, apply_in_thread)
    timer.start()
    started = time.monotonic()
    try:
        response = alice.client.get(f"/api/v1/load-balancers/{lb.pk}/applied/?revision=1&timeout=10")
    finally:
        timer.join()
    assert response.status_code == 200 and 0.35 <= time.monotonic() - started < 2.0


def test_certificate_upload_validates_key_and_expiry_and_encrypts_the_key(alice, charlie) -> None:
    cert_pem, key_pem = self_signed(days=10)
    _, other_key = self_signed(days=10)
    mismatch = alice.client.post("/api/v1/certificates/", {"name": "shop", "cert_pem": cert_pem,
                                                           "key_pem": other_key}, format="json")
    assert mismatch.status_code == 400 and mismatch.json()["code"] == "key_mismatch"

    ok = alice.client.post("/api/v1/certificates/", {"name": "shop", "cert_pem": cert_pem, "key_pem": key_pem},
                           format="json")

    assert ok.status_code == 201, ok.json()
    body = ok.json()
    assert body["dns_names"] == ["shop.acme.example"] and body["warnings"] == ["expires in 9 day(s)"]
    assert "key_pem" not in body
    stored = Certificate.objects.get(pk=body["id"])
    assert "PRIVATE KEY" not in stored.key_encrypted and "PRIVATE KEY" in crypto.decrypt(stored.key_encrypted)
    assert charlie.client.get(f"/api/v1/certificates/{body['id']}/").status_code == 404


def test_metrics_expose_node_health_applied_vs_desired_and_durations(shared, anon) -> None:
    node = Node.objects.create(fleet=shared["fleet"], name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                               config_dir="/etc/spw/n1", status="up")
    revision = services.fleet_render(fleet=shared["fleet"])
    rollout = services.rollout_create(fleet=shared["fleet"], revision=revision, enqueue=False)
    Rollout.objects.filter(pk=rollout.pk).update(status="succeeded", duration_ms=180.0)
    rollout.results.update(status="succeeded", duration_ms=90.0, reload_ms=70.0)

    text = anon.get("/metrics").content.decode()

    assert 'spillway_fleet_desired_revision{fleet="edge"} 1.0' in text
    assert 'spillway_node_applied_revision{fleet="edge",node="n1"} 0.0' in text
    assert 'spillway_node_behind{fleet="edge",node="n1"} 1.0' in text
    assert 'spillway_node_up{fleet="edge",node="n1"} 1.0' in text
    assert 'spillway_rollout_duration_seconds_bucket{fleet="edge",le="0.25"} 1.0' in text
    assert 'spillway_node_push_duration_seconds_count{fleet="edge"} 1.0' in text
    assert 'spillway_node_applies_total{fleet="edge",method="reload"} 1.0' in text
    assert 'spillway_node_applies_total{fleet="edge",method="no_reload"} 0.0' in text
    Node.objects.filter(pk=node.pk).update(applied_revision=revision)
    assert 'spillway_node_behind{fleet="edge",node="n1"} 0.0' in anon.get("/metrics").content.decode()


def test_deleting_a_fleet_with_history_works_and_frees_its_lb(shared, otto) -> None:
    revision = services.fleet_render(fleet=shared["fleet"])
    services.rollout_create(fleet=shared["fleet"], revision=revision, enqueue=False)
    assert otto.client.delete(f"/api/v1/fleets/{shared['fleet'].pk}/").status_code == 204
    assert LoadBalancer.objects.get(pk=shared["lb"].pk).fleet_id is None


def test_saving_a_fleets_settings_leaves_what_the_engine_moved_on_its_row_meanwhile(shared, otto) -> None:
    """A PATCH reads the fleet, then saves it: every column of that read came back, so a lease a reconciler claimed in
    between was freed under it (a second reconciler could claim it and push beside the first), and change_seq,
    desired_revision and a restore hold went back too. GIVEN the fleet as a request read it WHEN the engine moves its
    row and the operator's change is saved from that read THEN only the operator's field changed."""
    import datetime as dt

    from django.utils import timezone

    from apps.accounts.principal import Principal

    fleet = Fleet.objects.get(pk=shared["fleet"].pk)  # as the request read it
    until = timezone.now() + dt.timedelta(seconds=30)
    engine = {"lease_owner": "host:123:reconciler", "lease_until": until, "change_seq": fleet.change_seq + 3,
              "rendered_seq": fleet.rendered_seq + 2, "desired_revision": fleet.desired_revision + 1,
              "reconcile_queued": True, "restore_hold": {"example_node": "n1"}}
    Fleet.objects.filter(pk=fleet.pk).update(**engine)

    services.fleet_save(principal=Principal(org=otto.org, role="admin"), fleet=fleet, data={"batch_size": 7})

    saved = Fleet.objects.get(pk=fleet.pk)
    assert saved.batch_size == 7 and saved.updated_at > fleet.created_at
    assert {key: getattr(saved, key) for key in engine} == engine
