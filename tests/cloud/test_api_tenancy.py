"""The tenancy contract (tests/api_contract.py) on the cloud endpoints (the cloud APIs themselves are not
called: synthesis and plans are queued on commit and never run here)."""

from __future__ import annotations

from apps.cloud.models import CloudApply, CloudCredential, CloudTarget
from tests.api_contract import TenancyContract

TARGET = {"provider": "gcp", "project_or_account": "acme-prod", "regions": ["us-east1"]}


def _target(request, name: str = "acme-gcp") -> CloudTarget:
    return CloudTarget.objects.create(org=request.getfixturevalue("acme"), name=name, **TARGET)


class TestCloudTargets(TenancyContract):
    url = "/api/v1/cloud-targets/"
    update = {"project_or_account": "acme-staging"}

    def make(self, request):
        return _target(request)

    def payload(self, request):
        return {"name": "new-gcp", **TARGET}


class TestCloudApplies(TenancyContract):
    url = "/api/v1/cloud-applies/"
    creatable = deletable = False

    def make(self, request):
        from apps.balancers.models import LoadBalancer

        target = _target(request)
        lb = LoadBalancer.objects.create(org=target.org, name="acme-cloud", kind="gcp", cloud_target=target)
        return CloudApply.objects.create(target=target, lb=lb)

    def payload(self, request):
        return {"target": 1, "lb": 1}


class TestCloudCredentials(TenancyContract):
    url = "/api/v1/cloud-credentials/"
    update = {"for_all_orgs": True}
    writer = "otto"

    def make(self, request):
        credential = CloudCredential.objects.create(name="acme-creds", provider="gcp", credentials_ref="ACME_GCP")
        credential.orgs.set([request.getfixturevalue("acme")])
        return credential

    def payload(self, request):
        return {"name": "ops-gcp", "provider": "gcp", "credentials_ref": "OPS_GCP"}
