"""Config revisions name the changes they carry; a rolled-back fleet shows as pinned until moved forward."""

from __future__ import annotations

import pytest

from apps.fleets import services
from apps.fleets.config.revisions import AUTO_RENDER_REASON
from apps.fleets.models import Fleet, Rollout

pytestmark = pytest.mark.django_db


def test_a_revision_names_the_route_change_its_author_and_channel(shared, alice, acme) -> None:
    from apps.balancers.models import HostnameClaim

    HostnameClaim.objects.create(org=acme, hostname="acme.example.com", status="approved")
    first = services.fleet_render(fleet=shared["fleet"], reason=AUTO_RENDER_REASON)
    created = alice.client.post("/api/v1/routes/", {
        "lb": shared["lb"].pk, "hosts": ["acme.example.com"], "path": "/api", "priority": 10,
        "targets": [{"pool": shared["pools"]["acme"].pk, "weight": 100}]}, format="json")
    assert created.status_code == 201, created.content

    second = services.fleet_render(fleet=shared["fleet"], reason=AUTO_RENDER_REASON)

    assert second.number == first.number + 1
    assert second.reason == f"route {created.json()['id']} created by acme:alice via API"


def test_a_rolled_back_fleet_is_pinned_until_someone_pushes(shared, otto) -> None:
    fleet = shared["fleet"]
    first = services.fleet_render(fleet=fleet)
    services.rollout_create(fleet=fleet, revision=first, enqueue=False)
    shared["lb"].routes.update(path="/moved")
    second = services.fleet_render(fleet=fleet)
    services.rollout_create(fleet=fleet, revision=second, enqueue=False)

    rollback = services.fleet_rollback(fleet=fleet, number=first.number, principal=None)

    assert rollback.kind == Rollout.Kind.ROLLBACK
    detail = otto.client.get(f"/api/v1/fleets/{fleet.pk}/").json()
    assert detail["pinned"]["revision"] == first.number and detail["auto_rollout"] is False
    from django.test import Client

    browser = Client()
    browser.force_login(otto.user)
    page = browser.get(f"/fleets/{fleet.pk}/")
    assert f"Pinned to revision {first.number} after a rollback" in page.content.decode()

    services.fleet_push(fleet=Fleet.objects.get(pk=fleet.pk), principal=None)  # moves it forward
    assert otto.client.get(f"/api/v1/fleets/{fleet.pk}/").json()["pinned"] is None
