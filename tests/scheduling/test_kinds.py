"""Job kinds: strict params, objects visible to the job's org only, and the kinds backed by other apps."""

from __future__ import annotations

import pytest

from apps.accounts.principal import Principal
from apps.cloud.models import CloudTarget
from apps.core.errors import DomainError
from apps.fleets.models import Fleet
from apps.scheduling import registry, runner, services
from apps.scheduling.models import Job, JobRun
from tests.factories import LoadBalancerFactory, PoolRegionFactory, RegionFactory

pytestmark = pytest.mark.django_db


def as_org(org) -> Principal:
    return Principal(org=org, role="editor")


def refused(kind: str, params: object, principal: Principal) -> DomainError:
    with pytest.raises(DomainError) as info:
        registry.validate_params(kind, params, principal)
    return info.value


@pytest.mark.parametrize(("params", "field"), [
    ([], "params"),
    ({"sleep_s": True}, "params.sleep_s"),
    ({"sleep_s": -1}, "params.sleep_s"),
    ({"sleep_s": 3601}, "params.sleep_s"),
    ({"fail": "yes"}, "params.fail"),
    ({"message": "line\nbreak"}, "params.message"),
    ({"surprise": 1}, "params.surprise"),
])
def test_noop_params_are_checked_strictly(acme, params, field) -> None:
    assert refused("noop", params, as_org(acme)).field == field


def test_unknown_kinds_are_refused(acme) -> None:
    assert refused("rm_rf", {}, as_org(acme)).code == "unknown_kind"


def test_defaults_are_filled_in(acme) -> None:
    assert registry.validate_params("noop", {}, as_org(acme)) == {"sleep_s": 0.0, "fail": False, "fail_attempts": 0,
                                                               "message": ""}


@pytest.mark.parametrize(("params", "field"), [
    ({"capacity_scaler": 0.5}, "params.pool_region"),
    ({"pool_region": "1", "capacity_scaler": 0.5}, "params.pool_region"),
    ({"pool_region": None, "capacity_scaler": 0.05}, "params.pool_region"),
])
def test_capacity_scaler_needs_a_pool_region_id(acme, params, field) -> None:
    assert refused("pool_capacity_scaler", params, as_org(acme)).field == field


def test_capacity_scaler_range_matches_the_database_rule(acme) -> None:
    pool_region = PoolRegionFactory(pool__org=acme)
    for bad in (0.05, 1.5, -0.1):
        error = refused("pool_capacity_scaler", {"pool_region": pool_region.pk, "capacity_scaler": bad}, as_org(acme))
        assert error.field == "params.capacity_scaler"
    for good in (0, 0.1, 1):
        registry.validate_params("pool_capacity_scaler", {"pool_region": pool_region.pk, "capacity_scaler": good},
                              as_org(acme))


def test_objects_of_another_org_read_as_not_found(acme, globex) -> None:
    foreign = PoolRegionFactory(pool__org=globex)
    error = refused("pool_capacity_scaler", {"pool_region": foreign.pk, "capacity_scaler": 0.5}, as_org(acme))
    assert error.detail == f"pool region {foreign.pk} not found."
    assert refused("capacity_test", {"test": 999999}, as_org(acme)).field == "params.test"


def test_a_cloud_job_needs_a_target_and_lb_of_the_same_org(acme, globex) -> None:
    target = CloudTarget.objects.create(org=acme, name="acme-gcp", provider="gcp", project_or_account="p")
    foreign_target = CloudTarget.objects.create(org=globex, name="globex-gcp", provider="gcp",
                                                project_or_account="p")
    lb = LoadBalancerFactory(org=acme, kind="gcp")
    assert registry.validate_params("cloud_apply", {"target": target.pk, "lb": lb.pk}, as_org(acme))["approve"] is False
    assert refused("cloud_apply", {"target": foreign_target.pk, "lb": lb.pk}, as_org(acme)).field == "params.target"


def test_fleet_jobs_are_for_the_operator_org(acme, ops) -> None:
    fleet = Fleet.objects.create(name="eu-fleet", region=RegionFactory(slug="eu-west"))
    assert refused("fleet_resync", {"fleet": fleet.pk}, as_org(acme)).code == "operator_only"
    assert registry.validate_params("fleet_resync", {"fleet": fleet.pk}, as_org(ops)) == {"fleet": fleet.pk}
    assert refused("fleet_rollout", {"fleet": 424242}, as_org(ops)).field == "params.fleet"


def test_a_fleet_resync_job_asks_the_fleet_to_reconcile(ops, make_job) -> None:
    fleet = Fleet.objects.create(name="us-fleet", region=RegionFactory(slug="us-east"))
    Fleet.objects.filter(pk=fleet.pk).update(reconcile_queued=True)  # one already queued: coalesced, no message
    job = make_job(ops, "nightly-resync", kind="fleet_resync", params={"fleet": fleet.pk})
    run = services.job_run_now(principal=None, job=job)
    assert runner.run_execute(run.pk, worker="w1") == "succeeded"
    assert JobRun.objects.get(pk=run.pk).output == {"fleet": fleet.pk, "reconcile_queued": False}


def test_quick_kinds_share_messages_and_slow_ones_travel_alone() -> None:
    assert registry.is_quick("member_set_state", {"member": 1, "admin_state": "drain"})
    assert registry.is_quick("noop", {"sleep_s": 0})
    assert not registry.is_quick("noop", {"sleep_s": 5})
    assert not registry.is_quick("capacity_test", {"test": 1})
    assert not registry.is_quick("no_such_kind", {})


def test_a_job_runs_as_its_org_even_when_an_operator_created_it(acme, otto, make_job) -> None:
    foreign = PoolRegionFactory()  # some other org's pool region
    with pytest.raises(DomainError):
        services.job_save(principal=Principal(org=otto.org, role="admin", user_id=otto.user.pk), job=Job(),
                          data={"org": acme, "name": "overreach", "kind": "pool_capacity_scaler",
                                "params": {"pool_region": foreign.pk, "capacity_scaler": 0.5},
                                "schedule_type": "interval", "interval_s": 60})


def test_the_demo_jobs_load_once() -> None:
    from apps.balancers.demo import load_demo as load_balancers_demo
    from apps.scheduling.demo import load_demo

    load_balancers_demo()
    assert load_demo() == "scheduling: 5 demo job(s) created"
    assert load_demo() is None
    drain = Job.objects.get(name="maintenance-drain-start")
    assert drain.next_fire_at is not None and "Sunday" in drain.description()
