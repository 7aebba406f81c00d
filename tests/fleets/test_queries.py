"""apps.fleets.queries: which fleets a change of an LB marks changed (fleet_ids_for_lb, after every route write's
commit, in one query), and whether every node serving an LB has a revision of it (lb_applied_state, on every
`applied` long-poll and rollout)."""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer, Region
from apps.fleets.models import ConfigRevision, Fleet, Node
from apps.fleets.queries import fleet_ids_for_lb, lb_applied_state

pytestmark = pytest.mark.django_db


def test_an_haproxy_lb_is_served_by_its_own_fleet_and_those_that_serve_it_each_once_in_name_order(
        alice, django_assert_num_queries) -> None:
    region = Region.objects.create(slug="fq", name="fq")
    own, serving, other = (Fleet.objects.create(name=n, region=region) for n in ("b-own", "a-serving", "c-other"))
    lb = LoadBalancer.objects.create(org=alice.org, name="web", fleet=own)
    serving.serves.add(lb)
    own.serves.add(lb)  # both ways: still one id
    other.serves.add(LoadBalancer.objects.create(org=alice.org, name="elsewhere"))
    with django_assert_num_queries(1) as captured:
        assert fleet_ids_for_lb(lb.pk) == [serving.pk, own.pk]
    # No join of a fleet's LBs with the LBs it serves: their product grows with the square of a fleet's LBs.
    assert "JOIN" not in captured.captured_queries[0]["sql"].split(" WHERE ", 1)[0]
    alone = LoadBalancer.objects.create(org=alice.org, name="unserved")
    assert fleet_ids_for_lb(alone.pk) == []


def test_a_cloud_lb_or_a_missing_one_marks_no_fleet(alice) -> None:
    region = Region.objects.create(slug="fq", name="fq")
    fleet = Fleet.objects.create(name="edge", region=region)
    cloud = LoadBalancer.objects.create(org=alice.org, name="gcp-lb", kind=LoadBalancer.Kind.GCP, fleet=fleet)
    fleet.serves.add(cloud)
    assert fleet_ids_for_lb(cloud.pk) == []
    assert fleet_ids_for_lb(10**9) == []


def test_applied_state_reads_each_applied_revisions_lb_revisions_once_whatever_the_node_count(
        alice, django_assert_num_queries) -> None:
    """A fleet serving many LBs holds every one of them in each revision's lb_revisions: read on each node's row, a
    10,000-LB fleet's 200 nodes decoded two million entries per long-poll check (473 ms, bench-applied-state). Nodes
    on the same revision share one read; the answer per node is as before."""
    region = Region.objects.create(slug="as", name="as")
    fleet = Fleet.objects.create(name="edge", region=region)
    lb = LoadBalancer.objects.create(org=alice.org, name="web", fleet=fleet)
    others = {str(lb.pk + 1000 + i): 9 for i in range(2_000)}  # the fleet's other LBs
    older, newer = (ConfigRevision.objects.create(fleet=fleet, number=n, text="", sha256=str(n) * 64,
                                                  validation_ok=True, lb_revisions={**others, str(lb.pk): covered})
                    for n, covered in ((1, 4), (2, 5)))
    nodes = [Node(fleet=fleet, name=f"n{i:02d}", address="127.0.0.1", runtime_dir=f"/run/spw/n{i}",
                  config_dir=f"/etc/spw/n{i}", status="up", applied_revision=newer) for i in range(30)]
    nodes[3].applied_revision, nodes[7].applied_revision = older, None
    Node.objects.bulk_create(nodes)
    Node.objects.create(fleet=fleet, name="off", address="127.0.0.1", runtime_dir="/run/spw/off",
                        config_dir="/etc/spw/off", enabled=False, applied_revision=None)

    with django_assert_num_queries(2) as captured:
        done, states = lb_applied_state(lb, 5)
    revision_reads = [q["sql"] for q in captured.captured_queries if '"lb_revisions"' in q["sql"]]
    assert len(revision_reads) == 1 and "fleets_node" not in revision_reads[0]
    assert not done
    by_node = {s["node"]: s for s in states}
    assert list(by_node) == [f"n{i:02d}" for i in range(30)]  # enabled nodes only, in name order
    assert by_node["n00"] == {"fleet": "edge", "node": "n00", "status": "up", "applied_revision": 2,
                              "lb_revision": 5, "done": True}
    fields = ("applied_revision", "lb_revision", "done")
    assert [by_node["n03"][f] for f in fields] == [1, 4, False]
    assert [by_node["n07"][f] for f in fields] == [None, 0, False]
    # A finished rollout passes its own revision, whose lb_revisions it holds: only the others are read.
    with django_assert_num_queries(1):
        assert lb_applied_state(lb, 5, known=(newer, older)) == (done, states)
    assert lb_applied_state(lb, 4)[0] is False  # n07 serves nothing yet
    Node.objects.filter(name="n07").update(applied_revision=older)
    assert lb_applied_state(lb, 4)[0] is True and lb_applied_state(lb, 5)[0] is False
