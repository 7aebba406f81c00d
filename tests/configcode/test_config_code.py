"""Config as code: export → apply round trip, dry-run plans with sides, all-or-nothing, If-Match, tenancy."""

from __future__ import annotations

import copy

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.balancers.models import Listener, Member, Pool, Route
from apps.capacity.models import CapacityTest
from apps.scheduling.models import Job
from tests.factories import (
    LoadBalancerFactory,
    MemberFactory,
    PoolFactory,
    PoolRegionFactory,
    RegionFactory,
    RouteFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def estate(acme):
    region = RegionFactory(slug="eu-west")
    lb = LoadBalancerFactory(org=acme, name="web")
    pool = PoolFactory(lb=lb, name="api")
    PoolRegionFactory(pool=pool, region=region, max_rate_per_member=250)
    MemberFactory(pool=pool, region=region, name="m1", address="127.0.0.11", port=8080)
    MemberFactory(pool=pool, region=region, name="m2", address="127.0.0.12", port=8080)
    RouteFactory(lb=lb, priority=10, path="/api", pool=pool)
    RouteFactory(lb=lb, priority=20, path="/old", pool=pool)
    # Params as the noop kind stores them (what the API would have saved).
    Job.objects.create(org=acme, name="nightly", kind="noop", schedule_type="cron", cron="0 3 * * *",
                       timezone="Europe/Berlin",
                       params={"fail": False, "fail_attempts": 0, "message": "", "sleep_s": 0})
    CapacityTest.objects.create(org=acme, name="api-load", listener=Listener.objects.create(
        lb=lb, name="http", port=8080, default_pool=pool), pool=pool, region=region, steps=[10, 20])
    return lb


def export(persona, **params):
    response = persona.client.get("/api/v1/export/", params)
    assert response.status_code == 200, response.content
    return response


def apply(persona, doc, *, dry_run=False, if_match=None):
    headers = {"HTTP_IF_MATCH": if_match} if if_match else {}
    return persona.client.post("/api/v1/apply/", {"document": doc, "dry_run": dry_run}, format="json", **headers)


def test_round_trip_changes_nothing_and_plans_stay_empty(estate, alice):
    doc = export(alice).json()
    assert [m["name"] for m in doc["members"]] == ["m1", "m2"] and doc["pool_regions"][0]["max_rate_per_member"] == 250
    as_yaml = export(alice, output="yaml").content.decode()
    assert yaml.safe_load(as_yaml) == doc  # the YAML and JSON exports are one document
    for _ in range(2):  # a plan on unchanged input is always empty
        assert apply(alice, as_yaml, dry_run=True).json()["changes"] == []
    applied = apply(alice, doc)
    assert applied.status_code == 200, applied.content
    assert applied.json()["changes"] == [] and applied.json()["etag"] == doc["etag"]
    assert export(alice).json() == doc


def test_dry_run_says_which_side_has_each_difference_and_changes_nothing(estate, alice):
    doc = export(alice).json()
    edited = copy.deepcopy(doc)
    edited["members"][0]["weight"] = 50                       # update
    edited["members"].append({**doc["members"][0], "name": "m3", "address": "127.0.0.13"})  # create
    edited["routes"] = [r for r in edited["routes"] if r["priority"] != 20]                   # delete
    edited["jobs"][0]["cron"] = "30 4 * * *"                                                  # update
    plan = apply(alice, edited, dry_run=True)
    assert plan.status_code == 200, plan.content
    changes = {(c["action"], c["kind"], tuple(sorted(c["key"].items()))): c for c in plan.json()["changes"]}
    assert set(changes) == {
        ("update", "members", (("lb", "web"), ("name", "m1"), ("pool", "api"))),
        ("create", "members", (("lb", "web"), ("name", "m3"), ("pool", "api"))),
        ("delete", "routes", (("lb", "web"), ("priority", "20"))),
        ("update", "jobs", (("name", "nightly"),)),
    }
    assert changes[("update", "members", (("lb", "web"), ("name", "m1"), ("pool", "api")))]["fields"] == {
        "weight": {"spillway": 100, "file": 50}}
    assert changes[("create", "members", (("lb", "web"), ("name", "m3"), ("pool", "api")))]["side"] == \
        "missing in Spillway"
    assert changes[("delete", "routes", (("lb", "web"), ("priority", "20")))]["side"] == "missing in the file"
    assert export(alice).json() == doc  # a dry run writes nothing

    applied = apply(alice, edited, if_match=doc["etag"])
    assert applied.status_code == 200, applied.content
    assert Member.objects.get(name="m1").weight == 50 and Member.objects.filter(name="m3").exists()
    assert not Route.objects.filter(priority=20).exists()
    assert Job.objects.get(name="nightly").cron == "30 4 * * *"
    assert apply(alice, edited, dry_run=True).json()["changes"] == []


def test_a_concurrent_edit_refuses_the_apply(estate, alice, bob):
    doc = export(alice).json()
    member = Member.objects.get(name="m2")
    assert bob.client.patch(f"/api/v1/members/{member.pk}/", {"weight": 7}, format="json").status_code == 200
    edited = copy.deepcopy(doc)
    edited["members"][0]["weight"] = 50
    refused = apply(alice, edited)  # the document still carries the etag of the first export
    assert refused.status_code == 412 and refused.json()["code"] == "stale_revision"
    assert Member.objects.get(name="m1").weight == 100 and Member.objects.get(name="m2").weight == 7
    del edited["etag"]
    assert apply(alice, edited).status_code == 428  # no If-Match at all: refused, not a blind overwrite


def test_apply_is_all_or_nothing(estate, alice):
    doc = export(alice).json()
    edited = copy.deepcopy(doc)
    edited["members"][0]["weight"] = 50
    edited["members"][1]["address"] = "169.254.169.254"  # refused by the member address policy
    refused = apply(alice, edited, if_match=doc["etag"])
    assert refused.status_code == 400, refused.content
    assert "m2" in refused.json()["detail"]
    assert Member.objects.get(name="m1").weight == 100  # the valid change was rolled back too


def test_tenants_cannot_export_or_apply_another_org(estate, alice, charlie, vera):
    assert charlie.client.get("/api/v1/export/", {"org": "acme"}).status_code == 404
    assert charlie.client.get("/api/v1/export/", {"org": "no-such-org"}).status_code == 404
    doc = export(alice).json()
    assert charlie.client.post("/api/v1/apply/?org=acme", {"document": doc}, format="json").status_code == 404
    # Charlie's own org, naming acme's LB: the name resolves like a missing one.
    theirs = export(charlie).json()
    theirs["pools"] = [{**doc["pools"][0]}]
    response = apply(charlie, theirs, if_match=theirs["etag"])
    assert response.status_code == 400 and response.json()["code"] == "unknown_reference"
    assert "web" not in str(export(charlie).json()["pools"])
    assert apply(vera, doc, if_match=doc["etag"]).status_code == 403


def test_the_command_exports_plans_and_applies_for_pipelines(estate, ops, tmp_path, capsys):
    """GIVEN an exported file, WHEN a pipeline adds a pool and plans, THEN plan exits 2 listing it, apply
    creates it for the tenant (not for the operator running the command), and the next plan is empty."""
    path = tmp_path / "acme.yaml"
    call_command("spillway", "export", str(path), org="acme")
    call_command("spillway", "plan", str(path), org="acme")  # unchanged: exit 0
    doc = yaml.safe_load(path.read_text())
    # A deep copy: a shallow one shares the pool's lists (preferred_regions), which PyYAML writes as an anchor
    # and Spillway's parser refuses (yaml_alias).
    doc["pools"].append({**copy.deepcopy(doc["pools"][0]), "name": "batch"})
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SystemExit) as exited:
        call_command("spillway", "plan", str(path), org="acme")
    out = capsys.readouterr().out
    assert exited.value.code == 2 and "+ create pools web/batch (missing in Spillway)" in out, out
    with pytest.raises(SystemExit):
        call_command("spillway", "plan", str(path), org="acme", json=True)
    assert '"name": "batch"' in capsys.readouterr().out  # --json for other programs
    call_command("spillway", "apply", str(path), org="acme")
    assert Pool.objects.get(name="batch").org.slug == "acme"
    capsys.readouterr()
    call_command("spillway", "plan", str(path), org="acme")
    # The file's etag is from before the apply: the plan says so before apply refuses it.
    assert "warning: acme changed since this file was exported" in capsys.readouterr().err
    with pytest.raises(CommandError, match="stale_revision"):
        call_command("spillway", "apply", str(path), org="acme")


def _foreign_estate(globex) -> None:
    from apps.core import crypto
    from apps.fleets.models import Certificate
    from tests.fleets.fleetkit import self_signed

    lb = LoadBalancerFactory(org=globex, name="globex-lb")
    pool = PoolFactory(lb=lb, org=globex, name="gweb")
    Listener.objects.create(lb=lb, name="http", port=8081, default_pool=pool)
    cert_pem, key_pem = self_signed(days=90, name="globex.example")
    Certificate.objects.create(org=globex, name="globex-cert", cert_pem=cert_pem, key_encrypted=crypto.encrypt(key_pem))


# (section, the row acme adds, the name under attack: globex's, then a missing one)
FOREIGN_NAMES = [
    ("listeners", lambda name: {"lb": "web", "name": "https", "protocol": "https", "port": 9443,
                                "default_pool": None, "certificate": name}, "globex-cert", "no-such-cert"),
    ("routes", lambda name: {"lb": name, "priority": 99, "hosts": [], "path_match": "prefix", "path": "/g",
                             "redirect_url": "", "targets": []}, "globex-lb", "no-such-lb"),
    ("capacity_tests", lambda name: {"name": "probe", "listener": f"{name}/http", "steps": [10]}, "globex-lb",
     "no-such-lb"),
]


@pytest.mark.parametrize("section,row,foreign,missing", FOREIGN_NAMES,
                         ids=[f"{s}.{f}" for s, _, f, _ in FOREIGN_NAMES])
def test_a_file_naming_another_tenants_object_is_answered_like_a_missing_name(estate, alice, globex, section, row,
                                                                              foreign, missing):
    """Names in a config file resolve among what the applier may use: another tenant's certificate, pool or LB
    reads exactly like one that does not exist, and nothing is applied."""
    _foreign_estate(globex)
    doc = export(alice).json()

    def attempt(name: str) -> tuple[int, str]:
        edited = copy.deepcopy(doc)
        edited[section] = [*edited[section], row(name)]
        response = apply(alice, edited, if_match=doc["etag"])
        return response.status_code, response.content.decode().replace(name, "<sent>")

    attacked, absent = attempt(foreign), attempt(missing)
    assert attacked[0] == 400 and "unknown_reference" in attacked[1], attacked
    assert attacked == absent
    assert export(alice).json()["etag"] == doc["etag"]  # nothing applied
