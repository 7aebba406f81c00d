"""A small world for capacity-run tests: acme's LB with a pool, a shared LB, globex's LB, and the
loopback allowlist the demo also installs (capacity tests only ever send traffic to 127.0.0.0/8)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from apps.balancers.models import IpPool, Listener, LoadBalancer, Member, Pool, PoolRegion, Region, StaticIP
from apps.capacity.models import TargetAllowlist
from tests import deps
from tests.factories import (
    HostnameClaimFactory,
    LoadBalancerFactory,
    MemberFactory,
    PoolFactory,
    PoolRegionFactory,
    RegionFactory,
)
from tests.processes import process_env, reap_leaving, start_python, stop_processes


@pytest.fixture(autouse=True)
def _fast_password_hashing(request) -> None:
    # Personas get real passwords; PBKDF2's deliberate slowness only costs seconds per test here.
    # Pure tests (engine, knee) are left alone: they may run without Django at all.
    if request.node.get_closest_marker("django_db") is not None:
        request.getfixturevalue("settings").PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass
class World:
    us: Region
    acme_lb: LoadBalancer
    edge: LoadBalancer  # shared, owned by the operator org
    globex_lb: LoadBalancer
    pool: Pool  # acme's pool on acme_lb: 2 active members in us-east, 1 drained
    pool_region: PoolRegion
    vip: StaticIP  # 127.0.0.1

    def listener(self, port: int, *, lb: LoadBalancer | None = None, name: str | None = None,
                 address: StaticIP | None = None) -> Listener:
        lb = lb or self.acme_lb
        return Listener.objects.create(lb=lb, name=name or f"http-{port}", port=port,
                                       static_ip=address or self.vip)


@pytest.fixture
def world(acme, globex, ops) -> World:
    us = RegionFactory(slug="us-east")
    acme_lb = LoadBalancerFactory(name="acme-lb", org=acme)
    edge = LoadBalancerFactory(name="edge", org=ops, shared=True)
    globex_lb = LoadBalancerFactory(name="globex-lb", org=globex)
    pool = PoolFactory(lb=acme_lb, org=acme, name="web")
    pool_region = PoolRegionFactory(pool=pool, region=us, max_rate_per_member=100)
    MemberFactory(pool=pool, region=us, name="a")
    MemberFactory(pool=pool, region=us, name="b")
    MemberFactory(pool=pool, region=us, name="c", admin_state=Member.AdminState.DRAIN)
    HostnameClaimFactory(org=acme, hostname="acme.example.com")
    HostnameClaimFactory(org=globex, hostname="globex.example.com")
    ip_pool = IpPool.objects.create(name="loop", cidr="127.0.0.0/24")
    vip = StaticIP.objects.create(pool=ip_pool, address="127.0.0.1", org=None, state=StaticIP.State.ASSIGNED)
    TargetAllowlist.objects.create(cidr="127.0.0.0/8", ports="1024-65535", note="tests send load to loopback only")
    return World(us=us, acme_lb=acme_lb, edge=edge, globex_lb=globex_lb, pool=pool, pool_region=pool_region,
                 vip=vip)


@pytest.fixture(scope="module")
def cap_workers(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[list[subprocess.Popen]]:
    """Two REAL Celery workers (the same command as tests/conftest.py's celery_worker_factory), started
    once per module: each start/stop costs ~5 s on this 2-core machine, so per-test workers would
    push the run tests past a minute. Tests using them need `django_db(transaction=True)`."""
    if not os.environ.get("REDIS_URL"):
        deps.missing("real Celery workers need REDIS_URL (make test sets it)")
    logs = tmp_path_factory.mktemp("cap-workers")
    procs: list[subprocess.Popen] = []
    with django_db_blocker.unblock():
        env = process_env()
    reap_leaving()  # an earlier test's workers still exiting put their unacked messages back: gone before --purge
    try:
        for name in ("cap-a", "cap-b"):
            argv = ["-m", "celery", "-A", "controlplane", "worker", "--pool", "prefork", "--concurrency", "1",
                    "--hostname", f"{name}@%h", "--without-gossip", "--without-mingle", "--purge", "--loglevel", "INFO"]
            procs.append(start_python(argv, env, logs / f"{name}.log"))
        for name, proc in zip(("cap-a", "cap-b"), procs, strict=True):
            deadline = time.monotonic() + 30
            while b"ready." not in (logs / f"{name}.log").read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((logs / f"{name}.log").read_text())
                time.sleep(0.1)
        yield procs
    finally:
        stop_processes(procs)  # both warm-shut-down at once, then waited for by PID
