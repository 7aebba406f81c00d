"""A membership's end ends the member's authority in the org: tokens, sessions and what acts for them.

GIVEN bob, an editor of acme with a token, a scheduled job and an event subscription he made, WHEN he is
removed (API, members page, or single sign-on dropping his groups), THEN his token answers 401 everywhere,
his job is paused, his subscription disabled, his session lands in an org he still has, and re-adding him
revives none of it. The last test walks every model that records its maker, so a new one is not forgotten.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken, Membership, Role
from apps.accounts.services import sso_user_sync
from apps.audit.models import AuditEvent
from apps.core import lifecycle
from apps.events.models import Subscription
from apps.scheduling.models import Job
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db

READS = ["/api/v1/organizations/", "/api/v1/export/", "/api/v1/routes/", "/api/v1/event-subscriptions/",
         "/api/v1/jobs/", "/api/v1/memberships/"]


@pytest.fixture
def bobs_things(bob):
    """A job and a subscription bob made through the API with his token, and a child token he minted."""
    job = bob.client.post("/api/v1/jobs/", {"name": "nightly", "kind": "noop", "schedule_type": "cron",
                                            "cron": "0 3 * * *"}, format="json")
    assert job.status_code == 201, job.content
    sub = bob.client.post("/api/v1/event-subscriptions/", {"name": "hook", "url": "https://hooks.example.com/x",
                                                           "secret": "s" * 20}, format="json")
    assert sub.status_code == 201, sub.content
    child = bob.client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["read"]}, format="json")
    child_client = APIClient()
    if child.status_code == 201:
        child_client.credentials(HTTP_AUTHORIZATION=f"Bearer {child.json()['secret']}")
    return Job.objects.get(pk=job.json()["id"]), Subscription.objects.get(pk=sub.json()["id"]), child_client


def _remove(alice, bob) -> dict:
    membership = Membership.objects.get(user=bob.user, org=bob.org)
    response = alice.client.delete(f"/api/v1/memberships/{membership.pk}/")
    assert response.status_code == 204, response.content
    return response


def test_a_removed_members_token_answers_401_everywhere_at_once(acme, alice, bob, bobs_things):
    for url in READS:
        assert bob.client.get(url).status_code == 200, url
    _remove(alice, bob)
    for url in READS:
        response = bob.client.get(url)
        assert response.status_code == 401 and response.json()["code"] == "not_authenticated", url
    assert not ApiToken.objects.filter(user=bob.user, org=acme, revoked_at__isnull=True).exists()


def test_re_adding_a_removed_member_does_not_revive_their_old_token(acme, alice, bob, bobs_things):
    _remove(alice, bob)
    MembershipFactory(user=bob.user, org=acme, role=Role.EDITOR)
    assert bob.client.get("/api/v1/routes/").status_code == 401


def test_a_token_whose_owner_is_no_longer_a_member_is_refused_even_unrevoked(acme, bob):
    """The second lock: a membership deleted without the service (a database fix, a cascade) still ends it."""
    Membership.objects.filter(user=bob.user, org=acme).delete()
    assert ApiToken.objects.filter(user=bob.user, revoked_at__isnull=True).exists()
    assert bob.client.get("/api/v1/routes/").status_code == 401


def test_a_token_has_its_owners_role_of_now_and_none_once_the_owner_is_deactivated(acme, globex, bob):
    """The token's power is read with the token on every call: demoting its owner takes writes away at once,
    deactivating the owner's account ends it (the role comes in the token's own query, not a cached copy). Bob
    owns globex too: his acme token has his acme role, never another org's."""
    MembershipFactory(user=bob.user, org=globex, role=Role.OWNER)
    body = {"name": "nightly", "kind": "noop", "schedule_type": "cron", "cron": "0 3 * * *"}
    assert bob.client.post("/api/v1/jobs/", body, format="json").status_code == 201
    Membership.objects.filter(user=bob.user, org=acme).update(role=Role.VIEWER)
    refused = bob.client.post("/api/v1/jobs/", {**body, "name": "second"}, format="json")
    assert refused.status_code == 403, refused.content
    assert bob.client.get("/api/v1/jobs/").status_code == 200
    type(bob.user).objects.filter(pk=bob.user.pk).update(is_active=False)
    assert bob.client.get("/api/v1/jobs/").status_code == 401


def test_what_a_removed_member_made_stops_and_whoever_turns_it_on_takes_it_over(acme, alice, bob, bobs_things):
    job, subscription, _ = bobs_things
    assert job.enabled and subscription.enabled
    _remove(alice, bob)
    job.refresh_from_db()
    subscription.refresh_from_db()
    assert not job.enabled and job.next_fire_at is None
    assert not subscription.enabled
    record = AuditEvent.objects.get(action="membership.offboard")
    assert record.after["stopped"] == {"events.Subscription": 1, "scheduling.Job": 1}
    assert record.after["tokens_revoked"] >= 1
    # alice takes them over by turning them on again.
    assert alice.client.post(f"/api/v1/jobs/{job.pk}/resume/").status_code == 200
    assert alice.client.patch(f"/api/v1/event-subscriptions/{subscription.pk}/", {"enabled": True},
                              format="json").status_code == 200
    job.refresh_from_db()
    subscription.refresh_from_db()
    alices = f"token:{ApiToken.objects.get(user=alice.user, name='alice-token').pk}"
    assert (job.enabled, job.created_by) == (True, alices)
    assert (subscription.enabled, subscription.created_by) == (True, alices)


def test_the_members_page_says_what_a_removal_stopped(acme, alice, bob, bobs_things):
    client = Client()
    client.force_login(alice.user)
    membership = Membership.objects.get(user=bob.user, org=acme)
    page = client.post("/members/", {"membership": membership.pk, "remove": "1"})
    text = page.content.decode()
    assert page.status_code == 200
    assert "bob was removed" in text and "1 job they made paused" in text
    assert "1 event subscription they made disabled" in text and "API token" in text
    assert bob.client.get("/api/v1/routes/").status_code == 401


def test_a_removed_members_session_lands_in_an_org_they_still_have(acme, globex, alice, bob):
    MembershipFactory(user=bob.user, org=globex, role=Role.VIEWER)
    session = Client()
    session.force_login(bob.user)
    assert session.post("/switch-org/", {"org": "acme", "next": "/members/"}).status_code == 302
    assert "Members of acme" in session.get("/members/").content.decode()
    _remove(alice, bob)
    page = session.get("/members/")
    assert page.status_code == 200 and "Members of globex" in page.content.decode()
    assert session.get("/api/v1/routes/").status_code == 200  # the API session acts in globex now
    assert session.post("/switch-org/", {"org": "acme"}).status_code == 404


def test_a_removed_members_session_with_no_org_left_acts_nowhere(acme, alice, bob):
    session = Client()
    session.force_login(bob.user)
    assert session.get("/api/v1/routes/").status_code == 200
    _remove(alice, bob)
    assert session.get("/api/v1/routes/").status_code in (401, 403)
    assert session.get("/members/").status_code in (302, 404)


def test_sso_dropping_every_group_removes_the_membership_not_only_the_sign_in(acme, settings):
    user = sso_user_sync(issuer="https://idp.example", subject="s-1", username="dana", email="",
                         grants={"acme": Role.EDITOR}, managed_orgs={"acme"})
    token = ApiToken.objects.create(org=acme, user=user, name="t", prefix="p1", secret_hash="x", scopes=["read"])
    Job.objects.create(org=acme, name="dana-job", kind="noop", schedule_type="cron", cron="0 3 * * *",
                       created_by=f"token:{token.pk}")
    from apps.accounts.services import SsoNoOrg

    with pytest.raises(SsoNoOrg):
        sso_user_sync(issuer="https://idp.example", subject="s-1", username="dana", email="", grants={},
                      managed_orgs={"acme"})
    assert not Membership.objects.filter(user=user).exists()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert not Job.objects.get(name="dana-job").enabled


def test_sso_usernames_are_stored_clean():
    from apps.accounts.services import _clean_username

    assert _clean_username("ad\u200bmin\nroot") == "adminroot"
    assert _clean_username("\uff24\uff41\uff4e\uff41") == "Dana"  # fullwidth letters, NFKC
    assert _clean_username("\u202e\u0000") == "sso-user"


def test_every_model_that_records_its_maker_says_what_happens_when_they_leave():
    recorded = {m._meta.label for m in apps.get_models() if any(f.name == "created_by" for f in m._meta.fields)}
    assert recorded, "the walk found no model with created_by"
    missing = sorted(recorded - set(lifecycle.REGISTRY))
    assert not missing, f"register these in their app's ready() with apps.core.lifecycle.register: {missing}"
    assert {"scheduling.Job", "events.Subscription"} <= {k for k, v in lifecycle.REGISTRY.items() if v.stop}
