"""apps.core.bulk.bulk_set: one UPDATE … FROM (VALUES …) writes each row's own values exactly as the ORM's
bulk_update would, for every column type the fleet engine records (inet, foreign keys, NULLs, timestamps,
floats, booleans, text with quotes and backslashes), and touches no row it was not given."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.balancers.models import Region
from apps.core.bulk import bulk_set
from apps.fleets.models import ConfigRevision, Fleet, Node, NodeResult, Rollout

pytestmark = pytest.mark.django_db

FIELDS = ["address", "bind_address", "applied_revision", "applied_sha256", "worker_pid", "status",
          "status_detail", "last_seen", "enabled", "ssh_port"]
HOSTILE = "it's \\ \"quoted\"; DROP TABLE fleets_node; -- ünïcode\n\tnext line"


def _fields(node: Node) -> dict:
    return {name: getattr(node, Node._meta.get_field(name).attname) for name in FIELDS}


def test_each_row_gets_its_own_values_of_every_type_as_bulk_update_writes_them() -> None:
    region = Region.objects.create(slug="bk", name="bk")
    fleet = Fleet.objects.create(name="bulk", region=region)
    revision = ConfigRevision.objects.create(fleet=fleet, number=1, text="x", sha256="a" * 64)
    nodes = [Node.objects.create(fleet=fleet, name=f"n{i}", address=f"10.0.0.{i}", runtime_dir=f"/r{i}",
                                 config_dir=f"/c{i}") for i in range(5)]
    untouched = nodes.pop()
    before_untouched = _fields(untouched)
    values = [
        {"address": "10.1.0.1", "bind_address": None, "applied_revision": revision, "applied_sha256": "b" * 64,
         "worker_pid": 4242, "status": "up", "status_detail": "", "last_seen": datetime(2026, 11, 24, tzinfo=UTC),
         "enabled": True, "ssh_port": 22},
        {"address": "fd00::1", "bind_address": "127.0.0.9", "applied_revision": None, "applied_sha256": "",
         "worker_pid": None, "status": "down", "status_detail": HOSTILE, "last_seen": None, "enabled": False,
         "ssh_port": 65535},
    ]
    ours, theirs = nodes[:2], nodes[2:4]
    with CaptureQueriesContext(connection) as ctx:
        written = bulk_set(Node, [Node(pk=n.pk, **v) for n, v in zip(ours, values, strict=True)], FIELDS)
    assert written == 2
    if connection.vendor == "postgresql":
        assert len(ctx.captured_queries) == 1 and "FROM (VALUES" in ctx.captured_queries[0]["sql"]
    Node.objects.bulk_update([Node(pk=n.pk, **v) for n, v in zip(theirs, values, strict=True)], FIELDS)

    for mine, reference in zip(ours, theirs, strict=True):
        assert _fields(Node.objects.get(pk=mine.pk)) == _fields(Node.objects.get(pk=reference.pk))
    assert Node.objects.get(pk=ours[1].pk).status_detail == HOSTILE
    assert Node.objects.get(pk=ours[0].pk).applied_revision_id == revision.pk
    assert _fields(Node.objects.get(pk=untouched.pk)) == before_untouched
    assert bulk_set(Node, [], FIELDS) == 0


def test_a_rollouts_node_results_floats_and_nulls_are_written_as_bulk_update_writes_them() -> None:
    region = Region.objects.create(slug="bk", name="bk")
    fleet = Fleet.objects.create(name="bulk", region=region)
    revision = ConfigRevision.objects.create(fleet=fleet, number=1, text="x", sha256="a" * 64)
    rollout = Rollout.objects.create(fleet=fleet, revision=revision)
    nodes = [Node.objects.create(fleet=fleet, name=f"n{i}", address=f"10.0.0.{i}", runtime_dir=f"/r{i}",
                                 config_dir=f"/c{i}") for i in range(4)]
    results = [NodeResult.objects.create(rollout=rollout, node=n) for n in nodes]
    fields = ["status", "error", "unreachable", "duration_ms", "push_ms", "reload_ms", "finished_at"]
    values = [
        {"status": "succeeded", "error": "", "unreachable": False, "duration_ms": 37.123456789, "push_ms": 1e-9,
         "reload_ms": None, "finished_at": datetime(2026, 11, 24, 7, 0, 0, 123456, tzinfo=UTC)},
        {"status": "failed", "error": HOSTILE, "unreachable": True, "duration_ms": 0.0, "push_ms": None,
         "reload_ms": 1066.5, "finished_at": None},
    ]
    assert bulk_set(NodeResult, [NodeResult(pk=r.pk, **v) for r, v in zip(results[:2], values, strict=True)],
                    fields) == 2
    NodeResult.objects.bulk_update([NodeResult(pk=r.pk, **v) for r, v in zip(results[2:], values, strict=True)],
                                   fields)

    def row(result: NodeResult) -> dict:
        return {f: getattr(NodeResult.objects.get(pk=result.pk), f) for f in fields}

    for mine, reference, wanted in zip(results[:2], results[2:], values, strict=True):
        assert row(mine) == row(reference) == wanted
