"""Region mapping per cloud target: Spillway's region slugs become each provider's region names, filled
from the well-known table at save, refused when unmapped or shaped for the wrong provider, and the
synthesized Terraform names provider regions only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.cloud import selectors, services
from apps.cloud.models import CloudApply
from apps.cloud.regions import UnmappedRegion, complete_region_map
from deploy.model import CloudLB
from tests.cloud.cloudkit import demo_aws_lb, demo_gcp_lb
from tests.cloud.dbdemo import build_db_lb

SLUGS = {"us-central1": "us-central", "europe-west1": "eu-west", "us-east-1": "us-east", "eu-west-1": "eu-west"}


@pytest.mark.parametrize(("provider", "expected"), [
    ("gcp", {"us-east": "us-east1", "eu-west": "europe-west1"}),
    ("aws", {"us-east": "us-east-1", "eu-west": "eu-west-1"}),
])
def test_well_known_regions_are_filled_in_at_save(provider, expected, otto, db) -> None:
    created = otto.client.post("/api/v1/cloud-targets/", {
        "name": f"t-{provider}", "provider": provider, "project_or_account": "p", "regions": ["us-east", "eu-west"],
    }, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["region_map"] == expected


@pytest.mark.parametrize(("provider", "region_map", "bad"), [
    ("gcp", {}, "mars-north"),  # no mapping, no well-known name
    ("aws", {}, "mars-north"),
    ("gcp", {"mars-north": "us-east-1"}, "mars-north"),  # an AWS name on a GCP target
    ("aws", {"mars-north": "us-east1"}, "mars-north"),  # a GCP name on an AWS target
    ("gcp", {"mars-north": "us-east1\nregion = x"}, "mars-north"),
])
def test_an_unmapped_or_foreign_region_is_refused_at_save(provider, region_map, bad, otto, db) -> None:
    response = otto.client.post("/api/v1/cloud-targets/", {
        "name": "t", "provider": provider, "project_or_account": "p", "regions": [bad], "region_map": region_map,
    }, format="json")
    assert response.status_code == 400, response.content
    assert "region_map" in response.json()["fields"]


def test_a_mapping_for_a_region_the_target_does_not_have_is_refused() -> None:
    with pytest.raises(UnmappedRegion):
        complete_region_map("gcp", ["us-east"], {"us-east": "us-east4", "eu-west": "europe-west4"})
    assert complete_region_map("gcp", ["us-east"], {"us-east": "us-east4"}) == {"us-east": "us-east4"}


def with_slugs(model: CloudLB) -> CloudLB:
    """The demo LB as Spillway names its regions (us-east...), not as the provider does."""
    return replace(
        model, regions=tuple(SLUGS[r] for r in model.regions),
        pools=tuple(replace(p, regions=tuple(replace(pr, region=SLUGS[pr.region]) for pr in p.regions))
                    for p in model.pools),
        networks=tuple(replace(n, region=SLUGS[n.region]) for n in model.networks))


@pytest.mark.django_db
@pytest.mark.parametrize(("demo", "provider_key"), [(demo_gcp_lb, "google"), (demo_aws_lb, "aws")],
                         ids=["gcp", "aws"])
def test_synthesis_uses_the_provider_region_names(demo, provider_key, alice, cdktf_worker, settings,
                                                  tmp_path) -> None:
    settings.VAR_DIR = tmp_path
    provider_model = demo()
    lb, target = build_db_lb(alice.org, with_slugs(provider_model))
    target.region_map = {SLUGS[r]: r for r in provider_model.regions}
    target.save()
    assert selectors.cloud_lb(lb, target).regions == provider_model.regions
    doc = services.synthesize_apply(CloudApply.objects.create(target=target, lb=lb))
    assert doc["provider"][provider_key][0]["region"] == provider_model.regions[0]
    text = str(doc)
    for slug in ("'us-east'", "'eu-west'", "'us-central'"):
        assert slug not in text
