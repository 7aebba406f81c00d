"""Pool members are proxied and health-checked by the (shared) fleet: where may they point?

Metadata and link-local addresses never (the fleet would hand tenants the node's cloud credentials);
private and loopback ranges only in networks an operator allowed (globally in settings, or per org).
"""

from __future__ import annotations

import pytest

from apps.balancers.models import Member
from apps.fleets.config.render.quarantine import quarantine
from apps.fleets.config.spec import FleetSnapshot, MemberSpec, PoolRegionSpec, PoolSpec

pytestmark = pytest.mark.django_db

URL = "/api/v1/members/"


def _post(persona, world, address: str, name: str = "m1"):
    return persona.client.post(URL, {"pool": world.acme_pool.pk, "region": "us-east", "name": name,
                                     "address": address, "port": 8080}, format="json")


@pytest.mark.parametrize("address", ["169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254", "fe80::1",
                                     "169.254.10.1", "0.0.0.0", "224.0.0.1"])
def test_metadata_and_link_local_members_are_refused_for_everyone(world, alice, otto, address):
    for persona in (alice, otto):
        response = _post(persona, world, address)
        assert response.status_code == 400, response.content
        assert response.json()["code"] in ("member_forbidden_address", "invalid")
    assert not Member.objects.exists()


def test_private_ranges_need_an_operator_allowance_for_the_org(world, alice, otto, settings):
    settings.MEMBER_NETWORKS = []
    refused = _post(alice, world, "10.1.2.3")
    assert refused.status_code == 400 and refused.json()["code"] == "member_forbidden_address"
    assert "operator" in refused.json()["detail"]

    allowed = otto.client.patch(f"/api/v1/organizations/{world.acme_pool.org.pk}/",
                                {"member_networks": ["10.1.0.0/16"]}, format="json")
    assert allowed.status_code == 200, allowed.content

    assert _post(alice, world, "10.1.2.3").status_code == 201
    assert _post(alice, world, "10.2.0.1", name="m2").status_code == 400  # outside the allowed network
    assert _post(alice, world, "198.51.100.7", name="m3").status_code == 201  # public: fine
    assert _post(otto, world, "192.168.1.1", name="m4").status_code == 201  # operators run private backends


def test_a_customer_cannot_widen_its_own_member_networks(world, alice):
    response = alice.client.patch(f"/api/v1/organizations/{world.acme_pool.org.pk}/",
                                  {"member_networks": ["0.0.0.0/0"]}, format="json")
    assert response.status_code == 403
    world.acme_pool.org.refresh_from_db()
    assert world.acme_pool.org.member_networks == []


def test_the_renderer_leaves_out_a_pool_whose_member_was_written_past_the_api():
    bad = PoolSpec(id=1, name="evil", algorithm="roundrobin", health=None, chain=(),
                   regions=(PoolRegionSpec(region="us-east", members=(
                       MemberSpec(name="m1", address="169.254.169.254", port=80, weight=1, admin_state="active"),)),))
    good = PoolSpec(id=2, name="fine", algorithm="roundrobin", health=None, chain=(),
                    regions=(PoolRegionSpec(region="us-east", members=(
                        MemberSpec(name="m1", address="127.0.0.1", port=80, weight=1, admin_state="active"),)),))
    snap = FleetSnapshot(fleet="f", region="us-east", revision=1, listeners=(), pools=(bad, good))

    clean, problems = quarantine(snap)

    assert [p.id for p in clean.pools] == [2]
    assert [(p.kind, p.id, p.code) for p in problems] == [("pool", 1, "member_forbidden_address")]
