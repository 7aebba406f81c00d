"""Memberships and invitations: the API's owner/admin rules and last owner, joining only by accepting an
invitation, and the UI page and org switcher (the tenancy contract is in test_api_tenancy.py with every
accounts endpoint's; what removal ends is in test_lifecycle.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.accounts.models import Invitation, Membership, Role
from tests.factories import MembershipFactory, UserFactory
from tests.personas import persona as new_persona

URL = "/api/v1/memberships/"


INVITES = "/api/v1/invitations/"


def _join(persona_or_user, invitation_id: int, answer: str = "accept"):
    """The invited person answers on their Invitations page, signed in: they may be in no org yet."""
    user = getattr(persona_or_user, "user", persona_or_user)
    client = Client()
    client.force_login(user)
    return client.post("/invitations/", {"invitation": invitation_id, "answer": answer})


@pytest.mark.django_db
def test_admins_invite_and_the_invited_join_only_by_accepting(acme, globex, alice, bob, charlie):
    dana = UserFactory(username="dana")
    MembershipFactory(user=dana, org=globex, role=Role.VIEWER)  # dana signs in to globex today
    adam = new_persona("adam", acme, Role.ADMIN)
    invited = adam.client.post(INVITES, {"username": "dana", "role": "editor"}, format="json")
    assert invited.status_code == 201, invited.content
    assert not Membership.objects.filter(user=dana, org=acme).exists()  # nothing without her consent
    assert invited.json()["invited_by"] == "token adam-token (acme)" and invited.json()["status"] == "pending"

    owner_offer = adam.client.post(INVITES, {"username": "dana", "role": "owner"}, format="json")
    assert owner_offer.status_code == 403 and owner_offer.json()["code"] == "owner_required"
    assert bob.client.post(INVITES, {"username": "dana", "role": "viewer"}, format="json").status_code == 403
    # Someone else cannot accept it for her, through the page or the API; she can, through either.
    assert _join(charlie, invited.json()["id"]).status_code == 404
    assert charlie.client.post(f"{INVITES}{invited.json()['id']}/accept/").status_code == 404
    dana_api = new_persona("dana2", globex, Role.VIEWER).client  # a token of another person: not hers
    assert dana_api.post(f"{INVITES}{invited.json()['id']}/accept/").status_code == 404
    joined = _join(dana, invited.json()["id"])
    assert joined.status_code == 302 and joined["Location"] == "/", joined.content
    assert Membership.objects.get(user=dana, org=acme).role == "editor"
    assert b"already answered" in _join(dana, invited.json()["id"]).content
    again = adam.client.post(INVITES, {"username": "dana", "role": "viewer"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "already_member"

    membership = Membership.objects.get(user=dana, org=acme)
    promote = adam.client.patch(f"{URL}{membership.pk}/", {"role": "owner"}, format="json")
    assert promote.status_code == 403 and promote.json()["code"] == "owner_required"
    alice_membership = Membership.objects.get(user=alice.user, org=acme)
    assert adam.client.delete(f"{URL}{alice_membership.pk}/").status_code == 403
    moved = alice.client.patch(f"{URL}{membership.pk}/", {"username": "adam"}, format="json")
    assert moved.status_code == 400  # a membership's user is fixed
    direct = alice.client.post(URL, {"username": "erin", "role": "viewer"}, format="json")
    assert direct.status_code == 405  # nobody is added without consent


@pytest.mark.django_db
def test_inviting_answers_the_same_whether_or_not_the_user_exists(acme, alice):
    """`unknown_user` used to tell which usernames exist."""
    UserFactory(username="real-person")
    answers = [alice.client.post(INVITES, {"username": name, "role": "viewer"}, format="json")
               for name in ("real-person", "no-such-person")]
    assert [a.status_code for a in answers] == [201, 201]
    shapes = [{k: v for k, v in a.json().items() if k not in ("id", "username", "expires_at", "created_at")}
              for a in answers]
    assert shapes[0] == shapes[1]
    # An account made later (an SSO sign-in, an operator) finds the invitation waiting.
    late = UserFactory(username="no-such-person")
    client = Client()
    client.force_login(late)
    assert client.get("/").status_code == 302 and client.get("/")["Location"] == "/invitations/"
    assert b"acme" in client.get("/invitations/").content  # a person in no org lands on their invitations
    assert client.post("/invitations/", {"invitation": answers[1].json()["id"], "answer": "accept"}).status_code == 302
    assert client.get("/").status_code == 200 and Membership.objects.filter(user=late, org=acme).exists()


@pytest.mark.django_db
def test_declined_and_revoked_invitations_never_become_memberships(acme, alice):
    erin, fred = UserFactory(username="erin"), UserFactory(username="fred")
    to_erin = alice.client.post(INVITES, {"username": "erin", "role": "viewer"}, format="json").json()
    to_fred = alice.client.post(INVITES, {"username": "fred", "role": "viewer"}, format="json").json()
    assert b"You declined" in _join(erin, to_erin["id"], answer="decline").content
    assert alice.client.post(f"{INVITES}{to_fred['id']}/revoke/").status_code == 200
    assert _join(erin, to_erin["id"]).status_code == 400
    assert _join(fred, to_fred["id"]).status_code == 400
    assert not Membership.objects.filter(org=acme, user__in=[erin, fred]).exists()
    assert set(Invitation.objects.values_list("status", flat=True)) == {"declined", "revoked"}


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
    assert page.status_code == 200 and b'id="org-switch"' in page.content and b"Invite a member" in page.content
    sent = client.post("/members/", {"username": "erin", "role": "editor"})
    assert sent.status_code == 200 and b"erin is invited as editor" in sent.content
    assert Invitation.objects.get(username="erin").org == acme
    erin = Client()
    erin.force_login(get_user_model().objects.get(username="erin"))
    invited = erin.get("/invitations/")
    assert b"acme" in invited.content and b"Accept" in invited.content
    erin.post("/invitations/", {"invitation": Invitation.objects.get(username="erin").pk, "answer": "accept"})
    assert erin.get("/members/").status_code == 200
    assert Membership.objects.get(user__username="erin").org == acme

    switched = client.post("/switch-org/", {"org": "globex", "next": "/members/"})
    assert switched.status_code == 302 and switched["Location"] == "/members/"
    page = client.get("/members/")
    assert b"Members of globex" in page.content and b"Invite a member" not in page.content  # a viewer there
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

    for persona in (charlie, otto):
        invited = alice.client.post(INVITES, {"username": persona.user.username, "role": "editor"}, format="json")
        assert _join(persona, invited.json()["id"]).status_code == 302
    assert "Members of globex" in landing(charlie)
    assert "Members of ops" in landing(otto)
