"""The tenancy contract (tests/api_contract.py) on every fleets endpoint.

Fleets, nodes and config revisions are the operator's machinery: a customer finds none of them (404,
absent from lists). Certificates are tenant-owned. Rollouts are read by customers whose LBs the fleet
serves, and created only by operators.
"""

from __future__ import annotations

from apps.balancers.models import Region
from apps.core import crypto
from apps.fleets.models import Certificate, ConfigRevision, Fleet, Node, Rollout
from tests.api_contract import TenancyContract

from .fleetkit import self_signed


def _fleet(name: str = "edge-c") -> Fleet:
    region, _ = Region.objects.get_or_create(slug="us-east", defaults={"name": "US East"})
    return Fleet.objects.get_or_create(name=name, defaults={"region": region})[0]


class TestFleets(TenancyContract):
    url = "/api/v1/fleets/"
    update = {"batch_size": 3}
    writer = "otto"

    def make(self, request):
        return _fleet()

    def payload(self, request):
        _fleet()
        return {"name": "eu", "region": "us-east"}


class TestNodes(TenancyContract):
    url = "/api/v1/nodes/"
    update = {"enabled": False}
    writer = "otto"

    def make(self, request):
        return Node.objects.create(fleet=_fleet(), name="n9", address="127.0.0.1", runtime_dir="/run/spw/n9",
                                   config_dir="/etc/spw/n9")

    def payload(self, request):
        fleet = _fleet("edge-p")
        return {"fleet": fleet.name, "name": "n1", "address": "127.0.0.1", "runtime_dir": "/run/spillway/n1",
                "config_dir": "/etc/spillway/n1"}


class TestConfigRevisions(TenancyContract):
    url = "/api/v1/config-revisions/"
    writer = "otto"
    creatable = deletable = False

    def make(self, request):
        return ConfigRevision.objects.create(fleet=_fleet(), number=1, text="global\n", sha256="0" * 64,
                                             validation_ok=True)

    def payload(self, request):
        return {"number": 2}


class TestRollouts(TenancyContract):
    url = "/api/v1/rollouts/"
    writer = "otto"
    creatable = deletable = False

    def make(self, request):
        revision = ConfigRevision.objects.create(fleet=_fleet(), number=1, text="global\n", sha256="0" * 64,
                                                 validation_ok=True)
        return Rollout.objects.create(fleet=revision.fleet, revision=revision)

    def payload(self, request):
        return {"fleet": "edge-c"}


class TestCertificates(TenancyContract):
    url = "/api/v1/certificates/"

    def make(self, request):
        cert_pem, key_pem = self_signed(days=30)
        return Certificate.objects.create(org=request.getfixturevalue("acme"), name="shop", cert_pem=cert_pem,
                                          key_encrypted=crypto.encrypt(key_pem))

    def payload(self, request):
        cert_pem, key_pem = self_signed(days=30, name="api.acme.example")
        return {"name": "api", "cert_pem": cert_pem, "key_pem": key_pem}
