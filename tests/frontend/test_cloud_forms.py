"""Cloud in the UI: a target's per-region networks (what a plan needs) and starting a run of a cloud LB,
through the API's serializers and services, errors by the field, runs signed as people talk."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.balancers.models import LoadBalancer, Region
from apps.cloud.models import CloudApply, CloudTarget
from tests.cloud.cloudkit import demo_aws_lb, demo_gcp_lb
from tests.cloud.dbdemo import build_db_lb
from tests.personas import HTMX, web

pytestmark = pytest.mark.django_db


def test_operator_gives_a_target_its_networks_as_the_api_takes_them(otto):
    Region.objects.create(slug="us-east", name="US East")
    client = web(otto)
    base = {"name": "gcp-prod", "provider": "gcp", "project_or_account": "proj-1", "regions_text": "us-east"}
    bad = client.post(reverse("cloud-target-new"), {**base, "networks_text": "{us-east: default}"}, **HTMX)
    assert bad.status_code == 422 and 'id="f-networks-err"' in bad.content.decode()
    assert not CloudTarget.objects.exists()
    ok = client.post(reverse("cloud-target-new"),
                     {**base, "networks_text": '{"us-east": {"network": "default", "zone": "us-east1-b"}}'})
    assert ok.status_code == 302, ok.content.decode()[:400]
    target = CloudTarget.objects.get(name="gcp-prod")
    assert target.networks == {"us-east": {"network": "default", "zone": "us-east1-b"}}
    form = client.get(reverse("cloud-target-edit", args=[target.pk])).content.decode()
    assert "us-east1-b" in form  # shown again for editing


def test_a_customer_plans_its_cloud_lb_from_the_cloud_page(alice, vera, charlie):
    gcp_lb, gcp_target = build_db_lb(alice.org, demo_gcp_lb())
    aws_lb, _ = build_db_lb(alice.org, demo_aws_lb(), lb_name="demo-aws")
    LoadBalancer.objects.create(org=alice.org, name="on-a-fleet")
    client = web(alice)
    page = client.get(reverse("cloud")).content.decode()
    assert reverse("cloud-run-new") in page and "No run yet" in page
    form = client.get(reverse("cloud-run-new")).content.decode()
    assert f">{gcp_lb.name} (gcp)</option>" in form and ">gcp-target (gcp, " in form
    assert "on-a-fleet" not in form  # only cloud LBs are planned

    # An AWS LB on a GCP target: refused by the service, said next to the LB.
    wrong = client.post(reverse("cloud-run-new"), {"lb": aws_lb.pk, "target": gcp_target.pk}, **HTMX)
    assert wrong.status_code == 422 and 'id="f-lb-err"' in wrong.content.decode() and "is of kind aws" in \
        wrong.content.decode()
    started = client.post(reverse("cloud-run-new"), {"lb": gcp_lb.pk, "target": gcp_target.pk})
    run = CloudApply.objects.get()
    assert started.status_code == 302 and started["Location"] == reverse("cloud-apply", args=[run.pk])
    assert (run.lb, run.target, run.status) == (gcp_lb, gcp_target, CloudApply.Status.PENDING)
    assert "by alice (acme)" in client.get(started["Location"]).content.decode()
    assert "alice (acme)" in client.get(reverse("cloud")).content.decode()

    # A viewer cannot start one; another tenant cannot even name acme's LB or target.
    assert web(vera).get(reverse("cloud-run-new")).status_code == 403
    foreign = web(charlie).post(reverse("cloud-run-new"), {"lb": gcp_lb.pk, "target": gcp_target.pk}, **HTMX)
    assert foreign.status_code == 422 and CloudApply.objects.count() == 1
