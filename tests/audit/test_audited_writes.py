"""One audited write: every app's create, update and delete go through `audited_save` / `audited_delete`
(or write their own domain event), and what the log keeps of an object is what its model declares
(`audit_fields`, `audit_exclude`, `audit_extra`): never a secret, always the same fields."""

from __future__ import annotations

import json

import pytest

from apps.audit.models import AuditEvent
from apps.audit.services import AuditAction, audit_snapshot, audited_delete, audited_save
from apps.balancers.models import Pool
from apps.core.errors import Conflict
from apps.fleets.models import Fleet, Node
from tests.factories import PoolFactory, RegionFactory, RouteFactory

pytestmark = pytest.mark.django_db

SECRET = "s3cret-signing-key-0123"


def test_a_subscription_is_audited_on_create_update_and_delete_and_its_secret_never_is(alice) -> None:
    created = alice.client.post("/api/v1/event-subscriptions/", {
        "name": "chat", "url": "https://hooks.example.com/x", "secret": SECRET}, format="json")
    assert created.status_code == 201, created.content
    url = f"/api/v1/event-subscriptions/{created.json()['id']}/"
    assert alice.client.patch(url, {"enabled": False}, format="json").status_code == 200
    assert alice.client.delete(url).status_code == 204

    events = list(AuditEvent.objects.filter(object_type="subscription").order_by("id"))
    assert [e.action for e in events] == ["subscription.create", "subscription.update", "subscription.delete"]
    assert events[0].before is None and events[0].after["secret_set"] is True
    assert (events[1].before["enabled"], events[1].after["enabled"]) == (True, False)
    assert events[2].before["name"] == "chat" and events[2].after is None
    assert SECRET not in json.dumps([[e.before, e.after] for e in events])


def test_what_the_log_keeps_is_what_the_model_declares(acme) -> None:
    pool = PoolFactory(lb__org=acme, org=acme)
    route = RouteFactory(lb=pool.lb, pool=pool)
    # Default: every editable field, plus what the model adds (a route's targets).
    kept = audit_snapshot(route)
    assert kept["path"] == "/" and kept["targets"] == [{"pool": pool.pk, "weight": 100}]
    # Declared fields only: a node's SSH key is never among them.
    fleet = Fleet.objects.create(name="edge", region=RegionFactory())
    node = Node(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/tmp/n1", config_dir="/tmp/n1/etc",
                ssh_private_key_encrypted="sealed-key")
    assert set(audit_snapshot(node)) == set(Node.audit_fields)
    assert audit_snapshot(fleet)["region"] == fleet.region_id and audit_snapshot(fleet)["serves"] == []


def test_a_save_that_hits_a_unique_constraint_is_a_conflict_and_leaves_no_audit_row(alice, acme) -> None:
    principal = alice.principal
    pool = PoolFactory(lb__org=acme, org=acme, name="web")
    before = AuditEvent.objects.count()
    with pytest.raises(Conflict) as refused:
        audited_save(principal=principal, obj=Pool(lb=pool.lb, org=acme), data={"name": "web"})
    assert refused.value.code == "conflict"
    assert AuditEvent.objects.count() == before

    saved = audited_save(principal=principal, obj=Pool(lb=pool.lb, org=acme), data={"name": "api"})
    audited_delete(principal=principal, obj=saved)
    actions = list(AuditEvent.objects.filter(object_type="pool").values_list("action", flat=True).order_by("id"))
    assert actions == [f"pool.{AuditAction.CREATE}", f"pool.{AuditAction.DELETE}"]
