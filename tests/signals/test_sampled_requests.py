"""The sampled request log: bounded per LB and second whatever the flood, failed requests first; a tenant reads
its own routes' requests on a shared LB and never a node's name; filters answer bad input with a stable code."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apps.accounts.models import Membership
from apps.signals import sampling, services
from apps.signals.aggregate import Dims, Resolved
from apps.signals.logline import parse
from apps.signals.models import RequestSample
from apps.signals.sampling import Sampler
from tests.factories import LoadBalancerFactory, PoolFactory, RouteFactory


def _request(status: int = 200, path: str = "/a", termination: str = "----"):
    line = f"spw1 f/n1 fe_lb.http p1_us-east s1 {status} 0 1 5 6 0 {termination} 120 {path} shop.example"
    return parse(line.encode())


def _resolved(lb_id: int, org_id: int = 1, route: int | None = None) -> Resolved:
    return Resolved((1, Dims(org_id, lb_id, None, "us-east")), (route, Dims(org_id, lb_id)) if route else None, None)


def test_a_flood_keeps_at_most_the_share_of_each_second_failed_requests_first():
    sampler = Sampler()
    for i in range(5_000):
        sampler.offer(_request(503, termination="SC--"), _resolved(1), 1000.0 + i / 10_000)
        sampler.offer(_request(200), _resolved(1), 1000.0 + i / 10_000)
        sampler.offer(_request(200), _resolved(2), 1000.0 + i / 10_000)  # another LB has its own share
    kept = sampler.take()
    by = {(s.lb_id, s.request.status) for s in kept}
    assert len(kept) == sampling.ERRORS_PER_S + 2 * sampling.OTHERS_PER_S
    assert by == {(1, 503), (1, 200), (2, 200)}
    sampler.offer(_request(503), _resolved(1), 1001.0)  # the next second starts a new share
    assert len(sampler.take()) == 1 and sampler.dropped == 3 * 5_000 - len(kept)


@pytest.mark.django_db
class TestTheApi:
    @pytest.fixture
    def shared(self, ops, acme, globex):
        lb = LoadBalancerFactory(org=ops, shared=True)
        acme_route = RouteFactory(lb=lb, org=acme, path="/a", pool=PoolFactory(lb=lb, org=acme))
        globex_route = RouteFactory(lb=lb, org=globex, path="/g", pool=PoolFactory(lb=lb, org=globex))
        sampler = Sampler()
        now = datetime.now(UTC).timestamp()
        sampler.offer(_request(500, "/a/x"), _resolved(lb.pk, acme.pk, acme_route.pk), now)
        sampler.offer(_request(200, "/a/y"), _resolved(lb.pk, acme.pk, acme_route.pk), now)
        sampler.offer(_request(503, "/g/secret", "SC--"), _resolved(lb.pk, globex.pk, globex_route.pk), now)
        services.samples_write(sampler.take())
        return lb, acme_route, globex_route

    def test_a_tenant_reads_its_own_routes_requests_and_no_node_names(self, shared, alice, otto):
        lb, acme_route, _ = shared
        mine = alice.client.get("/api/v1/signals/requests/", {"scope": "lb", "id": lb.pk}).json()["requests"]
        assert sorted(r["path"] for r in mine) == ["/a/x", "/a/y"]
        assert all("node" not in r and r["region"] == "us-east" for r in mine)
        failed = alice.client.get("/api/v1/signals/requests/", {"scope": "route", "id": acme_route.pk,
                                                                "status": "5xx"}).json()["requests"]
        assert [(r["status"], r["path"]) for r in failed] == [(500, "/a/x")]
        everything = otto.client.get("/api/v1/signals/requests/", {"scope": "lb", "id": lb.pk,
                                                                   "status": "failed"}).json()["requests"]
        assert sorted(r["path"] for r in everything) == ["/a/x", "/g/secret"]
        assert {r["node"] for r in everything} == {"f/n1"}

    def test_foreign_objects_and_bad_filters(self, shared, alice, charlie, acme):
        _, acme_route, globex_route = shared
        get = alice.client.get
        assert get("/api/v1/signals/requests/", {"scope": "route", "id": globex_route.pk}).json()["code"] == "not_found"
        foreign = charlie.client.get("/api/v1/signals/requests/", {"scope": "route", "id": acme_route.pk})
        assert foreign.status_code == 404
        for params, code in (({"status": "5x"}, "invalid_status"), ({"node": "f/n1"}, "node_filter_operators_only"),
                             ({"since": "yesterday"}, "invalid_since"), ({"scope": "nope"}, "invalid_scope")):
            answer = get("/api/v1/signals/requests/", {"scope": "route", "id": acme_route.pk, **params})
            assert (answer.status_code, answer.json()["code"]) == (400, code), params
        Membership.objects.filter(user=alice.user, org=acme).delete()
        assert get("/api/v1/signals/requests/", {"scope": "route", "id": acme_route.pk}).status_code in (401, 403)

    def test_old_samples_go_with_the_rollup(self, shared):
        RequestSample.objects.update(at=datetime.now(UTC) - services.SAMPLE_KEEP - services.FINE_KEEP / 6)
        services.signals_rollup()
        assert not RequestSample.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("params", [{"id": "²"}, {"id": "9" * 5000}, {"since": "nan"}, {"until": "inf"},
                                    {"since": "1e300"}, {"status": "²²²"}, {"limit": "many"}])
def test_hostile_parameters_answer_400_with_a_code_never_500(params, otto, ops):
    lb = LoadBalancerFactory(org=ops)
    answer = otto.client.get("/api/v1/signals/requests/", {"scope": "lb", "id": str(lb.pk), **params})
    assert answer.status_code == 400 and answer.json()["code"], (params, answer.content)
    chart = otto.client.get("/api/v1/signals/", {"scope": "lb", "id": params.get("id", str(lb.pk))})
    assert chart.status_code in (200, 400, 404)  # the chart reads only scope, id and range


def test_failed_means_a_5xx_no_response_or_a_refusal_not_a_redirect_or_a_client_leaving():
    from apps.signals.sampling import failed

    assert failed(_request(503, termination="SC--")) and failed(_request(403, termination="PR--"))
    assert failed(_request(-1, termination="CR--"))  # the client left before any response
    assert not failed(_request(302, termination="LR--"))  # HAProxy's own redirect
    assert not failed(_request(200, termination="CD--"))  # the client left while the body was sent
    backend_500_unread = _request(500, termination="CD--")
    assert failed(backend_500_unread) and not backend_500_unread.by_proxy  # the backend's 500, not HAProxy's
