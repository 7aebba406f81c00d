"""A render reads the database as of one moment: a route write committing while the fleet is read is in the
revision whole or not at all.

The render read the targets of every route, then the routes. A route created in between came out without
targets: the revision stored it as a "needs targets" problem for its owner (who had just been answered 201)
and left it out, and the problem sent the next render to the full path (the clean-clone suite caught it:
two full renders in the route lane's shard test).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from apps.accounts.principal import Principal
from apps.balancers import services as balancers
from apps.balancers.models import LoadBalancer, Route
from apps.fleets import selectors, services
from apps.fleets.config import routelane
from tests.factories import HostnameClaimFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.haproxy]


def _create_route_from_another_connection(shared, acme) -> Route:
    made: list[Route] = []

    def write() -> None:
        try:
            made.append(balancers.route_save(
                principal=Principal(org=acme, role="admin"), route=Route(),
                data={"lb": shared["lb"], "org": acme, "path_match": "prefix", "hosts": ["acme.example.com"],
                      "path": "/late", "priority": 10, "targets": [{"pool": shared["pools"]["acme"], "weight": 100}]}))
        finally:
            connection.close()

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(30)
    assert made, "the route write did not commit"
    return made[0]


def test_a_route_committed_while_the_fleet_is_read_is_rendered_whole_or_not_at_all(shared, acme) -> None:
    fleet = shared["fleet"]
    HostnameClaimFactory(org=acme, hostname="acme.example.com")
    routelane.forget(fleet.pk)  # the full render's reads are the ones under test
    late: list[Route] = []

    def between_reads(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if not late and "balancers_routetarget" in sql:
            late.append(_create_route_from_another_connection(shared, acme))
        return result

    with connection.execute_wrapper(between_reads):
        revision = services.fleet_render(fleet=fleet, reason="test")

    assert late, "the render never read the route targets"
    assert revision.validation_ok, revision.validation_output
    assert revision.problems == []
    rendered = {r.id: r for ln in selectors.revision_snapshot(revision).listeners for r in ln.routes}
    if late[0].pk in rendered:
        assert rendered[late[0].pk].targets, "the route was rendered without its targets"
    else:
        # Not read: the revision must not claim the LB revision that carries it, or nothing would render it.
        assert int(revision.lb_revisions[str(shared["lb"].pk)]) < LoadBalancer.objects.get(pk=shared["lb"].pk).revision
    following = services.fleet_render(fleet=fleet, reason="test")
    assert following.problems == []
    served = {r.id: r for ln in selectors.revision_snapshot(following).listeners for r in ln.routes}
    assert served[late[0].pk].targets
