"""apps.fleets.queries.fleet_ids_for_lb: which fleets a change of an LB marks changed (after every route write's
commit), in one query."""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer, Region
from apps.fleets.models import Fleet
from apps.fleets.queries import fleet_ids_for_lb

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
