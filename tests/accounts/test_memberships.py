"""Memberships: the API's owner/admin rules and last owner, and the UI page and org switcher (the tenancy
contract is in test_api_tenancy.py with every accounts endpoint's)."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.models import Membership, Role
from tests.conftest import _persona
from tests.factories import MembershipFactory, UserFactory

URL = "/api/v1/memberships/"


@pytest.mark.django_db
def test_admins_manage_members_but_only_owners_touch_owners(acme, alice, bob):
    dana = UserFactory(username="dana")
    adam = _persona("adam", acme, Role.ADMIN)
    added = adam.client.post(URL, {"username": "dana", "role": "editor"}, format="json")
    assert added.status_code == 201, added.content
    assert Membership.objects.get(user=dana, org=acme).role == "editor"
    again = adam.client.post(URL, {"username": "dana", "role": "viewer"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "already_member"
    promote = adam.client.patch(f"{URL}{added.json()['id']}/", {"role": "owner"}, format="json")
    assert promote.status_code == 403 and promote.json()["code"] == "owner_required"
    alice_membership = Membership.objects.get(user=alice.user, org=acme)
    assert adam.client.delete(f"{URL}{alice_membership.pk}/").status_code == 403
    assert bob.client.post(URL, {"username": "dana", "role": "viewer"}, format="json").status_code == 403  # editor
    unknown = adam.client.post(URL, {"username": "nobody", "role": "viewer"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_user"
    moved = alice.client.patch(f"{URL}{added.json()['id']}/", {"username": "adam"}, format="json")
    assert moved.status_code == 400  # a membership's user is fixed


@pytest.mark.django_db
def test_the_last_owner_stays(acme, alice):
    mine = Membership.objects.get(user=alice.user, org=acme)
    demote = alice.client.patch(f"{URL}{mine.pk}/", {"role": "admin"}, format="json")
    assert demote.status_code == 409 and demote.json()["code"] == "last_owner"
    assert alice.client.delete(f"{URL}{mine.pk}/").json()["code"] == "last_owner"
    other = MembershipFactory(user=UserFactory(), org=acme, role=Role.VIEWER)
    assert alice.client.patch(f"{URL}{other.pk}/", {"role": "owner"}, format="json").status_code == 200
    assert alice.client.patch(f"{URL}{mine.pk}/", {"role": "admin"}, format="json").status_code == 200


@pytest.mark.django_db
def test_members_page_and_org_switcher(acme, globex, alice, charlie):
    MembershipFactory(user=alice.user, org=globex, role=Role.VIEWER)  # alice is in two orgs
    UserFactory(username="erin")
    client = Client()
    client.force_login(alice.user)
    page = client.get("/members/")
    assert page.status_code == 200 and b'id="org-switch"' in page.content and b"Add a member" in page.content
    assert client.post("/members/", {"username": "erin", "role": "editor"}).status_code == 200
    assert Membership.objects.get(user__username="erin").org == acme

    switched = client.post("/switch-org/", {"org": "globex", "next": "/members/"})
    assert switched.status_code == 302 and switched["Location"] == "/members/"
    page = client.get("/members/")
    assert b"Members of globex" in page.content and b"Add a member" not in page.content  # a viewer there
    assert client.post("/members/", {"username": "erin", "role": "editor"}).status_code == 403
    # Not a member: refused; an off-site next is not followed.
    assert client.post("/switch-org/", {"org": "no-such"}).status_code == 404
    assert client.post("/switch-org/", {"org": "acme", "next": "https://evil.example/"})["Location"] == "/"


@pytest.mark.django_db
def test_being_added_to_another_org_does_not_change_where_you_sign_in(acme, globex, alice, charlie, otto):
    """A hostile admin may add anyone it can name to its org, but that must not move them: charlie keeps
    landing in globex (or he would upload his certificates into acme unawares), and the operator's admin
    keeps landing in the operator org. Their own org comes first until they switch."""

    def landing(persona) -> str:
        client = Client()
        client.force_login(persona.user)
        return client.get("/members/").content.decode()

    for username in ("charlie", "otto"):
        added = alice.client.post(URL, {"username": username, "role": "editor"}, format="json")
        assert added.status_code == 201, added.content
    assert "Members of globex" in landing(charlie)
    assert "Members of ops" in landing(otto)
