"""The operator's shared infrastructure page: regions, the distances between them, and IP pools."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from apps.balancers.models import IpPool, Region, RegionDistance
from apps.core.ui import PrincipalView


class InfrastructureView(PrincipalView):
    def get(self, request):
        if not self.principal.is_operator:
            raise PermissionDenied("Only the operator manages regions and IP pools.")
        return render(request, "infrastructure.html", {
            "regions": Region.objects.order_by("slug"),
            "distances": RegionDistance.objects.select_related("src", "dst").order_by("src__slug", "dst__slug"),
            "ip_pools": IpPool.objects.select_related("region").order_by("name"),
            "can_write": self.principal.can_write,
        })
