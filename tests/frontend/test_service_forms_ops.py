"""Node (add, move, decommission), certificate upload and cloud target forms: the operator's or the owner's,
through the API's serializers and services, errors by the field."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.balancers.models import Region
from apps.cloud.models import CloudTarget
from apps.fleets.models import Certificate, Fleet, Node
from tests.fleets.fleetkit import self_signed
from tests.personas import HTMX, web

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleets():
    us = Region.objects.create(slug="us-east", name="US East")
    return Fleet.objects.create(name="edge-a", region=us), Fleet.objects.create(name="edge-b", region=us)


def _node(fleet: str, **extra) -> dict:
    return {"fleet": fleet, "name": "n3", "address": "127.0.0.1", "transport": "local",
            "runtime_dir": "/run/spw-ui/n3", "config_dir": "/etc/spw-ui/n3", "enabled": "on", **extra}


def test_operator_adds_moves_and_decommissions_a_node(otto, fleets):
    a, b = fleets
    client = web(otto)
    form = client.get(reverse("node-new") + "?fleet=edge-a").content.decode()
    assert '<option value="edge-a" selected>' in form
    bad = client.post(reverse("node-new"), _node("edge-a", runtime_dir="relative/dir"), **HTMX)
    assert bad.status_code == 422 and 'id="f-runtime_dir-err"' in bad.content.decode()
    created = client.post(reverse("node-new"), _node("edge-a"))
    assert created.status_code == 302
    node = Node.objects.get(name="n3")
    assert node.fleet == a and node.enabled
    moved = client.post(reverse("node-edit", args=[node.pk]), _node("edge-b", address="127.0.0.2"))
    assert moved.status_code == 302 and moved["Location"].startswith(reverse("fleet-detail", args=[b.pk]))
    node.refresh_from_db()
    assert (node.fleet, node.address) == (b, "127.0.0.2")
    assert client.post(reverse("node-decommission", args=[node.pk])).status_code == 302
    assert not Node.objects.filter(pk=node.pk).exists()
    assert AuditEvent.objects.filter(action="node.delete", actor_label="otto (ops)").exists()


def test_customers_cannot_touch_nodes(alice, fleets):
    node = Node.objects.create(fleet=fleets[0], name="n1", address="127.0.0.1", runtime_dir="/run/spw-ui/n1",
                               config_dir="/etc/spw-ui/n1")
    client = web(alice)
    assert client.get(reverse("node-new")).status_code == 403
    assert client.post(reverse("node-edit", args=[node.pk]), _node("edge-a")).status_code == 403
    assert client.post(reverse("node-decommission", args=[node.pk])).status_code == 403
    assert Node.objects.filter(pk=node.pk, name="n1").exists()


def test_owner_uploads_a_certificate_teammate_replaces_outsider_cannot(alice, bob, vera, charlie):
    cert_pem, key_pem = self_signed(30)
    client = web(alice)
    mismatched = client.post(reverse("certificate-upload"), {"name": "shop", "cert_pem": cert_pem,
                                                             "key_pem": self_signed(30)[1]}, **HTMX)
    assert mismatched.status_code == 422
    assert 'id="f-key_pem-err"' in mismatched.content.decode() or 'id="form-errors"' in mismatched.content.decode()
    assert client.post(reverse("certificate-upload"), {"name": "shop", "cert_pem": cert_pem,
                                                       "key_pem": key_pem}).status_code == 302
    cert = Certificate.objects.get(name="shop")
    assert cert.org == alice.org and cert.dns_names == ["shop.acme.example"]
    page = client.get(reverse("certificates")).content.decode()
    assert "shop.acme.example" in page and "day" in page and "not used" in page
    new_cert, new_key = self_signed(90)
    assert web(bob).post(reverse("certificate-replace", args=[cert.pk]),
                         {"cert_pem": new_cert, "key_pem": new_key}).status_code == 302
    cert.refresh_from_db()
    assert (cert.not_after - cert.not_before).days >= 89
    assert web(vera).get(reverse("certificate-upload")).status_code == 403
    assert web(charlie).post(reverse("certificate-replace", args=[cert.pk]),
                             {"cert_pem": cert_pem, "key_pem": key_pem}).status_code == 404


def test_operator_creates_a_cloud_target(otto, alice):
    Region.objects.create(slug="us-east", name="US East")
    assert web(alice).get(reverse("cloud-target-new")).status_code == 403
    client = web(otto)
    empty = client.get(reverse("cloud")).content.decode()
    assert "No cloud target yet" in empty and reverse("cloud-target-new") in empty
    bad = client.post(reverse("cloud-target-new"), {"name": "Bad!", "provider": "gcp",
                                                    "project_or_account": "p"}, **HTMX)
    assert bad.status_code == 422 and 'id="f-name-err"' in bad.content.decode()
    ok = client.post(reverse("cloud-target-new"), {"name": "gcp-prod", "provider": "gcp",
                                                   "project_or_account": "proj-1", "regions_text": "us-east"})
    assert ok.status_code == 302, ok.content.decode()[:400]
    target = CloudTarget.objects.get(name="gcp-prod")
    assert target.regions == ["us-east"] and target.region_map.get("us-east")


def test_operator_creates_a_fleet_and_places_an_lb_customer_creates_its_own_lb(otto, alice, charlie):
    Region.objects.create(slug="us-east", name="US East")
    client = web(otto)
    assert web(alice).get(reverse("fleet-new")).status_code == 403
    assert client.post(reverse("fleet-new"), {"name": "edge-us", "region": "us-east",
                                              "auto_rollout": "on"}).status_code == 302
    fleet = Fleet.objects.get(name="edge-us")
    assert fleet.auto_rollout and fleet.vrrp_secret_encrypted  # the service's defaults, not the form's
    placed = client.post(reverse("lb-new"), {"name": "shop", "org": "acme", "fleet": str(fleet.pk), "shared": ""})
    assert placed.status_code == 302
    from apps.balancers.models import LoadBalancer

    lb = LoadBalancer.objects.get(name="shop")
    assert (lb.org.slug, lb.fleet_id, lb.shared) == ("acme", fleet.pk, False)
    # A customer's form has no fleet, org or shared inputs, and a forged one is refused by the serializer.
    form = web(alice).get(reverse("lb-new")).content.decode()
    assert 'name="fleet"' not in form and 'name="shared"' not in form
    assert web(alice).post(reverse("lb-new"), {"name": "own"}).status_code == 302
    own = LoadBalancer.objects.get(name="own")
    assert own.org == alice.org and own.fleet_id is None
    assert web(charlie).get(reverse("lb-edit", args=[own.pk])).status_code == 404
