"""One tenant's broken object never blocks another tenant's deploys on a shared fleet.

GIVEN the shared LB `edge` (acme's and globex's routes and pools on one fleet) and globex's route left
pointing at a pool that is no longer on the LB (the old hole: PATCH /pools/{id} {lb} moved it), WHEN the
fleet renders, THEN the revision is valid, carries acme's route, leaves globex's route out and names it
as a problem — shown to globex, never to acme.
"""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer, Pool, Route, RouteTarget
from apps.fleets import services
from apps.fleets.models import ConfigRevision, Rollout

pytestmark = [pytest.mark.django_db, pytest.mark.haproxy]


def test_a_pool_cannot_be_moved_to_another_lb(shared, alice) -> None:
    own_lb = LoadBalancer.objects.create(org=alice.org, name="acme-own")
    pool = shared["pools"]["acme"]

    response = alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"lb": own_lb.pk}, format="json")

    assert response.status_code == 400 and response.json()["code"] == "immutable"
    assert list(response.json()["fields"]) == ["lb"]
    pool.refresh_from_db()
    assert pool.lb_id == shared["lb"].pk


def _strand_globex_route(shared) -> Route:
    """What the old API allowed: globex's pool moved off the shared LB while its route still targets it."""
    elsewhere = LoadBalancer.objects.create(org=shared["pools"]["globex"].org, name="globex-own")
    Pool.objects.filter(pk=shared["pools"]["globex"].pk).update(lb=elsewhere)
    return RouteTarget.objects.get(pool=shared["pools"]["globex"]).route


def test_a_stranded_route_is_left_out_and_the_rest_still_renders(shared, alice) -> None:
    stranded = _strand_globex_route(shared)
    acme_route = Route.objects.get(lb=shared["lb"], org=alice.org)

    revision = services.fleet_render(fleet=shared["fleet"], reason="test")

    assert revision.validation_ok, revision.validation_output
    assert "acme.example.com" in str(revision.snapshot) and "globex.example.com" not in str(revision.snapshot)
    assert [(p["kind"], p["id"], p["code"]) for p in revision.problems] == [("route", stranded.pk, "unknown_pool")]
    assert acme_route.pk not in {p["id"] for p in revision.problems}
    # The next change of another tenant deploys: a new revision, valid.
    Route.objects.filter(pk=acme_route.pk).update(path="/shop")
    assert services.fleet_render(fleet=shared["fleet"], reason="test").validation_ok
    assert ConfigRevision.objects.filter(fleet=shared["fleet"], validation_ok=False).count() == 0


def test_each_tenant_sees_only_its_own_render_problems(shared, alice, charlie, otto) -> None:
    stranded = _strand_globex_route(shared)
    url = f"/api/v1/load-balancers/{shared['lb'].pk}/preview/"

    as_acme = alice.client.post(url, {}, format="json")
    as_globex = charlie.client.post(url, {}, format="json")
    as_operator = otto.client.post(url, {}, format="json")

    assert as_acme.status_code == as_globex.status_code == 200, as_acme.content
    assert all(entry["left_out"] == [] for entry in as_acme.json()["fleets"])
    assert str(stranded.pk) not in str(as_acme.json()["fleets"][0]["left_out"])
    assert [(p["kind"], p["id"]) for e in as_globex.json()["fleets"] for p in e["left_out"]] == [
        ("route", stranded.pk)]
    assert [(p["kind"], p["id"]) for e in as_operator.json()["fleets"] for p in e["left_out"]] == [
        ("route", stranded.pk)]


def test_an_https_listener_needs_a_certificate_and_a_free_port(shared, otto) -> None:
    lb = shared["lb"]
    no_cert = otto.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "tls", "port": 18443,
                                                      "protocol": "https"}, format="json")
    other = LoadBalancer.objects.create(org=lb.org, name="edge-two", fleet=shared["fleet"])
    taken = otto.client.post("/api/v1/listeners/", {"lb": other.pk, "name": "http", "port": 18080}, format="json")

    assert no_cert.status_code == 400 and no_cert.json()["code"] == "certificate_required"
    assert taken.status_code == 409 and taken.json()["code"] == "port_in_use"
    assert "edge" not in taken.json()["detail"]


def test_the_owner_sees_what_was_left_out_in_the_workspace_and_nobody_else_does(shared, alice, charlie) -> None:
    from django.test import Client

    from apps.fleets.models import Fleet

    stranded = _strand_globex_route(shared)
    revision = services.fleet_render(fleet=shared["fleet"], reason="test")
    Fleet.objects.filter(pk=shared["fleet"].pk).update(desired_revision=revision.number)

    pages = {}
    for persona in (alice, charlie):
        client = Client()
        client.force_login(persona.user)
        pages[persona.org.slug] = client.get(f"/load-balancers/{shared['lb'].pk}/deploy/").content.decode()

    assert f"route {stranded.pk}" in pages["globex"] and "unknown_pool" in pages["globex"]
    assert "data-left-out" not in pages["acme"] and f"route {stranded.pk}" not in pages["acme"]


def test_a_customer_cannot_push_a_fleet_that_also_serves_other_tenants(shared, alice, charlie) -> None:
    """Review finding: a customer's own LB placed on a held shared fleet let it push everyone's held changes."""
    from django.test import Client

    from apps.fleets import selectors
    from apps.fleets.models import Fleet

    Fleet.objects.filter(pk=shared["fleet"].pk).update(auto_rollout=False)
    on_shared_fleet = LoadBalancer.objects.create(org=alice.org, name="acme-placed", fleet=shared["fleet"])
    alone = LoadBalancer.objects.create(org=alice.org, name="acme-alone",
                                        fleet=Fleet.objects.create(name="acme-fleet", region=shared["region"]))
    from apps.accounts.services import principal_for_user

    principal = principal_for_user(alice.user)

    assert not selectors.can_push(principal, on_shared_fleet)
    assert selectors.can_push(principal, alone)
    client = Client()
    client.force_login(alice.user)
    refused = client.post(f"/fleets/lb/{on_shared_fleet.pk}/push/", HTTP_HX_REQUEST="true")
    assert refused.status_code in (403, 404)
    assert not Rollout.objects.filter(fleet=shared["fleet"]).exists()


def test_node_level_bind_clashes_are_refused_at_write_and_left_out_at_render(shared, alice, otto) -> None:
    """Review finding: on a fleet whose nodes bind every listener on one address (bind_address), two listeners
    on one port with different static IPs passed the write check and then failed every node's render."""
    from apps.balancers.models import IpPool, Listener, StaticIP
    from apps.fleets.config.render.quarantine import quarantine
    from apps.fleets.models import Node
    from apps.fleets.selectors import fleet_snapshot

    Node.objects.create(fleet=shared["fleet"], name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                        config_dir="/etc/spw/n1", bind_address="127.0.0.1")
    pool = IpPool.objects.create(name="vips", cidr="192.0.2.0/28")
    ips = [StaticIP.objects.create(pool=pool, address=f"192.0.2.{n}", org=shared["lb"].org, state="reserved")
           for n in (2, 3)]
    first = otto.client.post("/api/v1/listeners/", {"lb": shared["lb"].pk, "name": "a", "port": 18081,
                                                    "static_ip": ips[0].pk}, format="json")
    neighbour = LoadBalancer.objects.create(org=shared["lb"].org, name="edge-two", fleet=shared["fleet"])
    second = otto.client.post("/api/v1/listeners/", {"lb": neighbour.pk, "name": "b", "port": 18081,
                                                     "static_ip": ips[1].pk}, format="json")
    assert first.status_code == 201, first.content
    assert second.status_code == 409 and second.json()["code"] == "port_in_use"

    # Written past the API, the clash is left out at render instead of failing the fleet.
    Listener.objects.create(lb=neighbour, name="c", port=18081, static_ip=ips[1])
    snap, _ = fleet_snapshot(shared["fleet"], 99)
    _, problems = quarantine(snap, shared_bind=True)
    assert [(p.kind, p.code) for p in problems] == [("listener", "port_in_use")]


def test_a_customer_listener_may_not_take_the_nodes_own_ports(alice, otto, settings) -> None:
    lb = LoadBalancer.objects.create(org=alice.org, name="acme-own")
    ssh = alice.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "ssh", "port": 22}, format="json")
    web = alice.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "web", "port": 8080}, format="json")
    assert ssh.status_code == 400 and ssh.json()["code"] == "port_not_allowed"
    assert web.status_code == 201, web.content


def test_a_customer_can_put_back_its_lb_after_an_operator_placed_it(shared, alice, otto) -> None:
    lb = LoadBalancer.objects.create(org=alice.org, name="acme-own")
    assert otto.client.patch(f"/api/v1/load-balancers/{lb.pk}/", {"fleet": shared["fleet"].pk},
                             format="json").status_code == 200
    body = alice.client.get(f"/api/v1/load-balancers/{lb.pk}/").json()
    put = alice.client.put(f"/api/v1/load-balancers/{lb.pk}/", {k: body[k] for k in ("name", "kind", "shared",
                                                                                      "fleet", "cloud_target")},
                           format="json")
    assert put.status_code == 200, put.content


def test_a_customer_never_sees_who_else_rolled_out_a_shared_fleet(shared, alice, otto) -> None:
    revision = ConfigRevision.objects.create(fleet=shared["fleet"], number=1, text="x", sha256="0" * 64,
                                             validation_ok=True)
    rollout = Rollout.objects.create(fleet=shared["fleet"], revision=revision, actor="token:4242")

    as_customer = alice.client.get(f"/api/v1/rollouts/{rollout.pk}/").json()
    as_operator = otto.client.get(f"/api/v1/rollouts/{rollout.pk}/").json()

    assert "4242" not in as_customer["actor"] and as_operator["actor"] == "token:4242"
