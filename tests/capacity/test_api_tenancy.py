"""The tenancy contract (tests/api_contract.py) on every capacity endpoint."""

from __future__ import annotations

from apps.capacity.models import CapacityRun, CapacityTest, Drill, TargetAllowlist
from tests.api_contract import TenancyContract


def _test(request, name: str = "knee") -> CapacityTest:
    world = request.getfixturevalue("world")
    return CapacityTest.objects.create(org=request.getfixturevalue("acme"), name=name,
                                       listener=world.listener(9100), steps=[[10, 1]])


class TestCapacityTests(TenancyContract):
    url = "/api/v1/capacity-tests/"
    update = {"slo_p99_ms": 250.0}

    def make(self, request):
        return _test(request)

    def payload(self, request):
        world = request.getfixturevalue("world")
        return {"name": "new", "listener": world.listener(9101).pk, "steps": [[10, 1]]}


class TestCapacityRuns(TenancyContract):
    url = "/api/v1/capacity-runs/"
    creatable = deletable = False

    def make(self, request):
        return CapacityRun.objects.create(test=_test(request), status="succeeded")

    def payload(self, request):
        return {"test": 1}


class TestCapacityAllowlist(TenancyContract):
    url = "/api/v1/capacity-allowlist/"
    writer = "otto"

    def make(self, request):
        request.getfixturevalue("world")
        return TargetAllowlist.objects.create(org=request.getfixturevalue("acme"), cidr="198.51.100.0/24",
                                              ports="80")

    def payload(self, request):
        request.getfixturevalue("world")
        return {"org": "acme", "cidr": "203.0.113.0/24", "ports": "80,443"}


class TestDrills(TenancyContract):
    url = "/api/v1/drills/"
    deletable = False  # a drill is stopped (POST cancel), never deleted: its report stays

    def make(self, request):
        world = request.getfixturevalue("world")
        return Drill.objects.create(pool=world.pool, region=world.us, share=0.5, duration_s=10, status="passed")

    def payload(self, request):
        world = request.getfixturevalue("world")
        return {"pool": world.pool.pk, "region": "us-east", "share": 0.5, "duration_s": 10}
