"""ETag/If-Match, Idempotency-Key, domain conflicts, revisions and audit, through the API."""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import LoadBalancer, Route
from tests.factories import RouteFactory


@pytest.mark.django_db
def test_stale_if_match_gives_412_and_changes_nothing(world, alice, bob):
    url = f"/api/v1/pools/{world.acme_pool.pk}/"
    etag = alice.client.get(url)["ETag"]
    first = bob.client.patch(url, {"algorithm": "leastconn"}, format="json", HTTP_IF_MATCH=etag)
    assert first.status_code == 200
    stale = alice.client.patch(url, {"algorithm": "source"}, format="json", HTTP_IF_MATCH=etag)
    assert stale.status_code == 412
    assert stale.json()["code"] == "stale_revision"
    world.acme_pool.refresh_from_db()
    assert world.acme_pool.algorithm == "leastconn"
    fresh = alice.client.patch(url, {"algorithm": "source"}, format="json", HTTP_IF_MATCH=first["ETag"])
    assert fresh.status_code == 200


@pytest.mark.django_db
def test_repeated_idempotency_key_creates_nothing_twice(world, alice):
    body = {"lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/once", "priority": 300,
            "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}
    first = alice.client.post("/api/v1/routes/", body, format="json", HTTP_IDEMPOTENCY_KEY="deploy-42")
    second = alice.client.post("/api/v1/routes/", body, format="json", HTTP_IDEMPOTENCY_KEY="deploy-42")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Route.objects.filter(path="/once").count() == 1
    other = alice.client.post("/api/v1/routes/", {**body, "path": "/other"}, format="json",
                              HTTP_IDEMPOTENCY_KEY="deploy-42")
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"


@pytest.mark.django_db
def test_failed_create_frees_its_idempotency_key(world, alice):
    body = {"lb": world.acme_lb.pk, "hosts": ["unclaimed.example.org"], "path": "/", "priority": 301,
            "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}
    assert alice.client.post("/api/v1/routes/", body, format="json",
                             HTTP_IDEMPOTENCY_KEY="k1").status_code == 400
    body["hosts"] = ["acme.example.com"]
    assert alice.client.post("/api/v1/routes/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code == 201


@pytest.mark.django_db
def test_route_rules_answer_with_stable_codes(world, alice, charlie):
    base = {"lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/api", "priority": 10,
            "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}
    assert alice.client.post("/api/v1/routes/", base, format="json").status_code == 201
    taken = alice.client.post("/api/v1/routes/", {**base, "path": "/other"}, format="json")
    assert (taken.status_code, taken.json()["code"]) == (409, "priority_taken")
    same = alice.client.post("/api/v1/routes/", {**base, "priority": 11}, format="json")
    assert (same.status_code, same.json()["code"]) == (409, "route_conflict")
    unclaimed = alice.client.post("/api/v1/routes/", {**base, "priority": 12, "hosts": ["globex.example.com"]},
                                  format="json")
    assert (unclaimed.status_code, unclaimed.json()["code"]) == (400, "hostname_not_claimed")
    assert "hosts" in unclaimed.json()["fields"]
    # Wildcard claim *.acme.test covers deeper names.
    deep = alice.client.post("/api/v1/routes/", {**base, "priority": 13, "hosts": ["a.b.acme.test"]}, format="json")
    assert deep.status_code == 201, deep.content


@pytest.mark.django_db
def test_overlapping_claims_are_refused_without_naming_the_holder(world, charlie):
    for hostname in ["acme.example.com", "x.acme.test", "*.acme.test", "*.b.acme.test"]:
        response = charlie.client.post("/api/v1/hostname-claims/", {"hostname": hostname}, format="json")
        assert response.status_code == 409, hostname
        assert response.json()["code"] == "claim_overlap"
        assert "acme" not in response.json()["detail"].replace(hostname, "")


@pytest.mark.django_db
def test_customer_claims_start_pending_and_only_operators_approve(world, alice, otto):
    claim = alice.client.post("/api/v1/hostname-claims/", {"hostname": "new.acme.example"}, format="json").json()
    assert claim["status"] == "pending"
    assert alice.client.post(f"/api/v1/hostname-claims/{claim['id']}/approve/").status_code == 403
    route = {"lb": world.acme_lb.pk, "hosts": ["new.acme.example"], "path": "/", "priority": 20,
             "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}
    assert alice.client.post("/api/v1/routes/", route, format="json").json()["code"] == "hostname_not_claimed"
    assert otto.client.post(f"/api/v1/hostname-claims/{claim['id']}/approve/").json()["status"] == "approved"
    assert alice.client.post("/api/v1/routes/", route, format="json").status_code == 201


@pytest.mark.django_db
def test_every_change_bumps_the_lb_revision_and_is_audited(world, alice):
    lb = world.acme_lb
    before = lb.revision
    alice.client.post("/api/v1/members/", {"pool": world.acme_pool.pk, "region": "us-east", "name": "m1",
                                           "address": "127.0.0.9", "port": 9000}, format="json")
    route = RouteFactory(lb=lb, hosts=["acme.example.com"], priority=400, pool=world.acme_pool)
    alice.client.patch(f"/api/v1/routes/{route.pk}/", {"path": "/new"}, format="json")
    lb.refresh_from_db()
    assert lb.revision >= before + 3  # pool region row + member + route update
    actions = set(AuditEvent.objects.filter(org=alice.org).values_list("action", flat=True))
    assert {"member.create", "route.update"} <= actions
    event = AuditEvent.objects.filter(action="route.update").first()
    assert event.before["path"] == "/" and event.after["path"] == "/new"
    assert event.actor.startswith("token:") and event.request_id


@pytest.mark.django_db
def test_canary_weights_and_redirects(world, alice):
    from tests.factories import PoolFactory

    canary = PoolFactory(lb=world.acme_lb, org=alice.org, name="web-canary")
    split = alice.client.post("/api/v1/routes/", {
        "lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/", "priority": 5,
        "targets": [{"pool": world.acme_pool.pk, "weight": 90}, {"pool": canary.pk, "weight": 10}]}, format="json")
    assert split.status_code == 201
    assert sorted(t["weight"] for t in split.json()["targets"]) == [10, 90]
    both = alice.client.post("/api/v1/routes/", {
        "lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/old", "priority": 2,
        "redirect_url": "https://acme.example.com/new", "targets": [{"pool": canary.pk, "weight": 1}]},
        format="json")
    assert both.json()["code"] == "invalid_route"
    redirect = alice.client.post("/api/v1/routes/", {
        "lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/old", "priority": 2,
        "redirect_url": "https://acme.example.com/new"}, format="json")
    assert redirect.status_code == 201


@pytest.mark.django_db
def test_lists_filter_and_paginate(world, alice):
    for i in range(3):
        RouteFactory(lb=world.acme_lb, hosts=["acme.example.com"], path=f"/p{i}", priority=500 + i,
                     pool=world.acme_pool)
    page = alice.client.get("/api/v1/routes/", {"page_size": 2, "ordering": "-priority"}).json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert page["results"][0]["priority"] == 502
    assert alice.client.get("/api/v1/routes/", {"priority": 501}).json()["count"] == 1
    assert LoadBalancer.objects.count() == 2


@pytest.mark.django_db
def test_a_pending_claim_cannot_squat_a_name_another_org_then_gets(world, alice, charlie, otto):
    """Review finding: a tenant's pending claim blocked everyone until an operator rejected it. Now several orgs
    may ask; the operator approves one, and a second approval of an overlapping name is refused."""
    squat = charlie.client.post("/api/v1/hostname-claims/", {"hostname": "shop.initech.test"}, format="json")
    real = alice.client.post("/api/v1/hostname-claims/", {"hostname": "shop.initech.test"}, format="json")
    assert squat.status_code == real.status_code == 201, (squat.content, real.content)
    assert alice.client.post("/api/v1/hostname-claims/", {"hostname": "shop.initech.test"},
                             format="json").status_code == 409  # asking twice is still refused

    approved = otto.client.post(f"/api/v1/hostname-claims/{real.json()['id']}/approve/")
    second = otto.client.post(f"/api/v1/hostname-claims/{squat.json()['id']}/approve/")

    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert second.status_code == 409 and second.json()["code"] == "claim_overlap"


def test_every_write_answers_the_lb_revision_it_produced(world, alice):
    """A pipeline needs no second, racy GET: the write's own answer says which revision to wait for."""
    from apps.balancers.models import LoadBalancer

    lb = world.acme_lb
    created = alice.client.post("/api/v1/routes/", {"lb": lb.pk, "path": "/rev", "priority": 1,
                                                    "targets": [{"pool": world.acme_pool.pk}]}, format="json")
    assert created.status_code == 201, created.content
    now = LoadBalancer.objects.get(pk=lb.pk).revision
    assert created.json()["lb_revision"] == now and created["Spillway-LB-Revision"] == str(now)
    member = alice.client.post("/api/v1/members/", {"pool": world.acme_pool.pk, "region": "us-east", "name": "m9",
                                                   "address": "127.0.0.9", "port": 8080}, format="json")
    drained = alice.client.post(f"/api/v1/members/{member.json()['id']}/state/", {"admin_state": "drain"},
                                format="json")
    assert drained["Spillway-LB-Revision"] == str(LoadBalancer.objects.get(pk=lb.pk).revision) == \
        str(member.json()["lb_revision"] + 1)
    deleted = alice.client.delete(f"/api/v1/routes/{created.json()['id']}/")
    assert deleted.status_code == 204 and deleted["Spillway-LB-Revision"] == str(LoadBalancer.objects.get(
        pk=lb.pk).revision)
    read = alice.client.get(f"/api/v1/routes/?lb={lb.pk}")
    assert "Spillway-LB-Revision" not in read  # reads produce nothing


class _Killed(BaseException):
    """What a request sees when its web process is killed or its database connection cut mid-way: no `except
    Exception` runs (bench-chaos found the key then left "in progress" for good: every retry answered 409)."""


@pytest.mark.django_db
def test_a_create_killed_midway_leaves_no_key_in_progress_and_its_retry_succeeds(world, alice, monkeypatch):
    body = {"lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/killed", "priority": 302,
            "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}
    from apps.core.api import viewsets

    real = viewsets.etag_for

    def killed_once(data):  # after the route was saved, before the answer was stored
        monkeypatch.setattr(viewsets, "etag_for", real)
        raise _Killed

    monkeypatch.setattr(viewsets, "etag_for", killed_once)
    with pytest.raises(_Killed):
        alice.client.post("/api/v1/routes/", body, format="json", HTTP_IDEMPOTENCY_KEY="deploy-killed")
    assert not Route.objects.filter(path="/killed").exists()  # nothing half-done
    retry = alice.client.post("/api/v1/routes/", body, format="json", HTTP_IDEMPOTENCY_KEY="deploy-killed")
    assert retry.status_code == 201, retry.json()
    assert Route.objects.filter(path="/killed").count() == 1
