"""The LB workspace's routing aids: the preview warns about a route that could never serve."""

from __future__ import annotations

import pytest

from apps.balancers.models import Route

from .test_workspace import _route, edge, web

__all__ = ["edge"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.django_db


def test_the_preview_warns_before_saving_a_route_another_route_shadows(edge, alice, acme):
    lb = edge["lb"]
    root = _route(lb, acme, "acme.example.com", 20, edge["acme_pool"])
    routes = Route.objects.count()
    response = web(alice).post(f"/load-balancers/{lb.pk}/routes/preview/", {
        "hosts": "acme.example.com", "path": "/api", "path_match": "prefix", "priority": "60",
        "pool": edge["acme_pool"].pk}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 422
    assert 'id="rf-priority-err"' in body and "would never serve a request" in body
    assert f"route {root.pk} (priority 20" in body
    assert Route.objects.count() == routes
