"""The fleet lease across a database restart: a reconcile whose release failed (the database went away under it)
does not leave its fleet stuck for LEASE_S (bench-chaos: every PostgreSQL restart held rollouts 30-40 s), and a
lease a reconcile of this process still holds is never taken."""

from __future__ import annotations

import contextlib

import pytest
from django.db import OperationalError

from apps.balancers.models import Region
from apps.fleets.models import Fleet
from apps.fleets.rollout import lease

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet() -> Fleet:
    return Fleet.objects.create(name="edge", region=Region.objects.create(slug="us-east", name="US East"))


def test_a_lease_whose_release_failed_is_taken_over_at_once_by_the_next_reconcile_of_the_process(
    fleet, monkeypatch
) -> None:
    first = lease.new_owner()
    assert lease.claim(fleet.pk, first)

    @contextlib.contextmanager
    def database_gone():
        raise OperationalError("server closed the connection unexpectedly")
        yield

    with monkeypatch.context() as patched:
        patched.setattr(lease, "asynchronous_commit", database_gone)
        with pytest.raises(OperationalError):
            lease.release(fleet.pk, first)
    assert Fleet.objects.get(pk=fleet.pk).lease_owner == first  # left behind, valid for LEASE_S

    second = lease.new_owner()
    assert lease.claim(fleet.pk, second)
    assert Fleet.objects.get(pk=fleet.pk).lease_owner == second


def test_a_lease_a_reconcile_of_this_process_holds_is_not_taken(fleet) -> None:
    holder = lease.new_owner()
    assert lease.claim(fleet.pk, holder)
    assert not lease.claim(fleet.pk, lease.new_owner())
    assert not lease.is_free(fleet.pk)
    lease.release(fleet.pk, holder)
    assert lease.is_free(fleet.pk)


def test_a_fresh_lease_is_renewed_without_a_write_and_an_older_one_is_written_and_can_be_found_lost(
    fleet, monkeypatch
) -> None:
    """A route change's rollout renewed a lease its reconcile claimed milliseconds before (a transaction on the
    change's path). Within RENEW_AFTER_S of its claim the lease has LEASE_S - RENEW_AFTER_S left at least and only
    its live holder can write it: renew() answers without a write. Past that it writes, and a lease someone else
    holds by then is reported lost."""
    holder = lease.new_owner()
    assert lease.claim(fleet.pk, holder)
    claimed_until = Fleet.objects.get(pk=fleet.pk).lease_until
    assert lease.renew(fleet.pk, holder)
    assert Fleet.objects.get(pk=fleet.pk).lease_until == claimed_until  # nothing written

    monkeypatch.setattr(lease, "RENEW_AFTER_S", 0.0)  # as if RENEW_AFTER_S had passed
    assert lease.renew(fleet.pk, holder)
    assert Fleet.objects.get(pk=fleet.pk).lease_until > claimed_until
    Fleet.objects.filter(pk=fleet.pk).update(lease_owner="someone-else")
    assert not lease.renew(fleet.pk, holder)
