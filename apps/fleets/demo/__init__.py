"""The demo fleet: two regions, two local HAProxy nodes each, serving the demo LB `edge`.

`load_demo()` (called by `manage.py loaddemo`, idempotent) creates the fleets and nodes;
`start_demo_processes()` (called by `manage.py runall`, i.e. `make run`) starts the four HAProxy
masters and the demo backends and rolls the fleet out; `stop_demo_processes()` stops them again by
the PIDs it recorded. Everything listens on 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F

from apps.balancers.demo import DEMO_BACKENDS
from apps.balancers.models import LoadBalancer, Region
from apps.fleets.models import Fleet, Node, revision_deferred

BACKEND_SCRIPT = Path(__file__).with_name("backend.py")  # the demo backends' process

DEMO_NODES = {"us-east": ["127.0.40.1", "127.0.40.2"], "eu-west": ["127.0.41.1", "127.0.41.2"]}
DEMO_HEALTH_PORT = 8404  # each node's health endpoint: curl http://127.0.40.1:8404/spillway/healthz
DEMO_LB = "edge"
NOT_INSTALLED = "haproxy not installed: demo fleet not started"


def demo_dir() -> Path:
    """var/demo-fleet, or a short /tmp path when VAR_DIR is too long for unix socket paths."""
    base = Path(settings.VAR_DIR) / "demo-fleet"
    if len(str(base)) > 60:
        digest = hashlib.sha256(str(base).encode()).hexdigest()[:8]
        base = Path("/tmp") / f"spillway-demo-{digest}"
    return base


def _pid_file() -> Path:
    return demo_dir() / "pids.json"


def fleet_name(region: str) -> str:
    return f"demo-{region}"


@transaction.atomic
def load_demo() -> str | None:
    edge = LoadBalancer.objects.filter(name=DEMO_LB).first()
    if edge is None:
        return "demo fleet skipped: the demo load balancer `edge` is missing"
    base = demo_dir()
    fleets = []
    for region_slug, addresses in DEMO_NODES.items():
        region = Region.objects.get(slug=region_slug)
        fleet, _ = Fleet.objects.get_or_create(name=fleet_name(region_slug), defaults={"region": region})
        fleets.append(fleet)
        for i, address in enumerate(addresses, start=1):
            root = base / fleet.name / f"n{i}"
            Node.objects.get_or_create(fleet=fleet, name=f"n{i}", defaults={
                "address": address, "bind_address": address, "transport": Node.Transport.LOCAL,
                "runtime_dir": str(root / "run"), "config_dir": str(root / "etc"), "health_port": DEMO_HEALTH_PORT})
    # The LB's FK names one fleet; the other region's fleet serves it too (Fleet.serves).
    if edge.fleet_id is None:
        LoadBalancer.objects.filter(pk=edge.pk).update(fleet=fleets[0])
    for fleet in fleets:
        if edge.fleet_id != fleet.pk:
            fleet.serves.add(edge)
    nodes = ", ".join(f"{r}: {' '.join(a)}" for r, a in DEMO_NODES.items())
    return f"demo fleet: 2 regions x 2 local HAProxy nodes ({nodes}) serving `{DEMO_LB}`"


def demo_addresses() -> list[tuple[str, int]]:
    """Every address:port the demo fleet and its backends listen on (checked free before `make run`)."""
    nodes = [(a, port) for addrs in DEMO_NODES.values() for a in addrs for port in (8080, DEMO_HEALTH_PORT)]
    return nodes + sorted({ep for endpoints in DEMO_BACKENDS.values() for ep in endpoints})


def _backend_specs() -> list[str]:
    specs = []
    for (org, region), endpoints in sorted(DEMO_BACKENDS.items()):
        for n, (address, port) in enumerate(endpoints, start=1):
            specs.append(f"{org}-{region}-{n}={address}:{port}")
    return specs


def start_demo_processes() -> str | None:
    """Start 4 HAProxy masters and the demo backends, then roll the demo fleets out."""
    if shutil.which(settings.HAPROXY_BIN) is None:
        return NOT_INSTALLED
    from apps.fleets import services
    from apps.fleets.demo.localnodes import start_local_node

    stop_demo_processes()  # leftovers of a previous run that was not stopped cleanly
    fleets = list(Fleet.objects.filter(name__in=[fleet_name(r) for r in DEMO_NODES]))
    if not fleets:
        return "demo fleet not started: run `manage.py loaddemo` first"
    base = demo_dir()
    base.mkdir(parents=True, exist_ok=True)
    pids: dict[str, list[int]] = {"masters": [], "backends": []}
    log = (base / "backends.log").open("ab")
    backends = subprocess.Popen(
        [sys.executable, str(BACKEND_SCRIPT), *_backend_specs()],
        cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        # By path, not `-m`: running it as a module would import this package, which needs Django.
        env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)}, start_new_session=True)
    log.close()
    pids["backends"].append(backends.pid)
    problems = []
    try:
        for node in Node.objects.filter(fleet__in=fleets, transport=Node.Transport.LOCAL).select_related(
                "fleet__region"):
            try:
                pids["masters"].append(start_local_node(node).pid)
            except Exception as exc:  # one broken node must not keep `make run` from starting
                problems.append(f"{node}: {exc}")
    finally:
        _pid_file().write_text(json.dumps(pids))
    # The masters just started run whatever config was on disk and hold no worker Spillway verified; the
    # previous run's record (its PIDs are gone) would have the drift check report every node as "reloaded
    # outside Spillway" seconds after each restart. Forget it, so the roll-out below delivers to them and
    # verifies them as on a first run (a converge of the desired revision, run by the reconcile, when there
    # is one; a new render supersedes it).
    Node.objects.filter(fleet__in=fleets, transport=Node.Transport.LOCAL).update(
        applied_revision=None, applied_sha256="", worker_pid=None, status=Node.Status.UNKNOWN, status_detail="")
    for fleet in fleets:
        Fleet.objects.filter(pk=fleet.pk).update(change_seq=F("change_seq") + 1)
        services.fleet_converge(fleet=fleet, check_drift=False, enqueue=False)
        services.fleet_reconcile(fleet_id=fleet.pk)
    return _serving_message(fleets, problems)


def _serving_message(fleets: list[Fleet], problems: list[str]) -> str:
    """What the console says after the roll-out: only nodes that took it count as serving."""
    nodes = list(Node.objects.filter(fleet__in=fleets).select_related("fleet", "applied_revision")
                 .defer(*revision_deferred("applied_revision")))
    serving = [n for n in nodes if n.status == Node.Status.UP and n.applied_revision_id is not None
               and n.applied_revision.number == n.fleet.desired_revision and n.fleet.desired_revision > 0]
    failed = [n for n in nodes if n not in serving]
    served = ", ".join(f"http://{n.address}:8080/" for n in serving)
    if serving:
        message = (f"demo fleet: {len(serving)}/{len(nodes)} HAProxy nodes serving `{DEMO_LB}` at {served} "
                   f"(try: curl -H 'Host: acme.example.com' http://{serving[0].address}:8080/)")
    else:
        message = f"demo fleet NOT serving: 0/{len(nodes)} HAProxy nodes took the roll-out"
    for node in failed:
        detail = (node.status_detail or node.status).strip().splitlines()
        problems.append(f"{node.fleet.name}/{node.name} ({node.address}): {detail[-1] if detail else node.status}")
    if problems:
        message += "\n  not serving: " + "\n  not serving: ".join(problems)
    return message


def _is_ours(pid: int) -> bool:
    """The PID still runs a process we started (haproxy with our config dir, or our backends)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return str(demo_dir()) in cmdline or str(BACKEND_SCRIPT) in cmdline


def _stop_pids(pids: list[int], soft: signal.Signals, timeout_s: float) -> None:
    """Each signal to every PID still ours at once, then wait for them together: four nodes stop in the time of
    one (one by one, a node still finishing a connection held the next one's stop back)."""
    left = [pid for pid in pids if _is_ours(pid)]
    for sig, wait_s in ((soft, timeout_s), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
            left = [pid for pid in left if Path(f"/proc/{pid}").exists() and _is_ours(pid)]
            if left:
                time.sleep(0.02)
        if not left:
            return


def stop_demo_processes() -> None:
    """Stop what start_demo_processes started, by the PIDs it recorded."""
    path = _pid_file()
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    _stop_pids(pids.get("masters", []), signal.SIGUSR1, 2.0)  # soft stop: workers finish their connections
    _stop_pids(pids.get("backends", []), signal.SIGTERM, 2.0)
    with contextlib.suppress(OSError):
        path.unlink()
