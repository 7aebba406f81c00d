"""The LB workspace's route tester: host + path (+ method) -> route, pools, regions and why (htmx partial)."""

from __future__ import annotations

from django.shortcuts import render

from apps.balancers.models import LoadBalancer
from apps.core.ui import PrincipalView, errors_of
from apps.fleets.api.serializers import RouteTestQuerySerializer
from apps.fleets.selectors import route_test


class RouteTestView(PrincipalView):
    def get(self, request, pk: int):
        lb = self.get_scoped(LoadBalancer, pk=pk)
        query = RouteTestQuerySerializer(data=request.GET)
        if not query.is_valid():
            return render(request, "partials/route_test.html", {"lb": lb, "errors": errors_of(query.errors)},
                          status=422)
        result = route_test(lb=lb, principal=self.principal, **query.validated_data)
        return render(request, "partials/route_test.html", {"lb": lb, "result": result, "errors": {}})
