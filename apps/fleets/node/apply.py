"""What a rollout does to one node: pre-check, push, reload, verify, roll back (no Django).

Services decide *which* nodes get *which* bundle and record the outcome; this module only talks to
nodes, so it can run in worker threads (one per node of a batch) without touching the database.

A node is never left half-applied: a push writes a whole config set and swaps one symlink
(transports/base.py); a refused push changes nothing; a failed reload or verification puts the
node back on its last good bundle (re-pushed from the revision it last verified, not whatever
`previous` happens to hold) and reloads it.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from apps.fleets.config.check import HostListeners, bind_conflicts, parse_ss_listeners, remote_bind_conflicts
from apps.fleets.config.render.frontends import ACME_CHALLENGE_MAP
from apps.fleets.config.spec import KEEPALIVED_FILE, ConfigBundle
from apps.fleets.node.hotchanges import HotChanges, hot_changes
from apps.fleets.node.mapdelta import MapDelta, file_delta, same_entries
from apps.fleets.node.runtime_api import (
    MasterSocket,
    ProcInfo,
    ReloadResult,
    RuntimeApiError,
    RuntimeUnavailable,
    parse_servers_state,
)
from apps.fleets.node.transports import NodeConn, TransportError, transport_for
from apps.fleets.node.transports.base import FileSetTransport
from apps.fleets.node.transports.local import LocalTransport

RELOAD_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 1.0
_WILDCARDS = {"0.0.0.0", "::"}
# Every exception a node operation can raise when the node, its sshd or its sockets misbehave.
NODE_ERRORS = (TransportError, RuntimeUnavailable, RuntimeApiError, OSError, ValueError, TimeoutError)


def bundle_binds(bundle: ConfigBundle) -> list[tuple[str, int]]:
    """(address, port) of every listener the bundle binds (from the render manifest)."""
    return sorted({(b.address, b.port) for b in bundle.rendered_manifest.binds})


def floating_binds(bundle: ConfigBundle) -> set[tuple[str, int]]:
    """Binds on a VIP (transparent): only the node holding the VIP answers there, so they are checked
    through `show stat` like every frontend, not by a TCP connect that would reach the holder."""
    return {(b.address, b.port) for b in bundle.rendered_manifest.binds if b.floating}


# A frontend accepting connections (FULL: at its maxconn, still listening). `disable frontend` shows PAUSED
# (`enable frontend` undoes it), `shutdown frontend` STOP (only a reload undoes it); measured on 2.6.12.
SERVING_FRONTEND = frozenset({"OPEN", "FULL"})


def bundle_proxies(bundle: ConfigBundle) -> tuple[list[str], list[str]]:
    """(frontends, backends) the bundle declares: what the worker must list once it runs (verify)."""
    return sorted(bundle.rendered_manifest.frontends), sorted(bundle.rendered_manifest.backends)


def probe_address(bind: tuple[str, int], node_address: str) -> tuple[str, int]:
    """Where to connect to test a listener: a wildcard bind is reached through the node's address."""
    address, port = bind
    return (node_address if address in _WILDCARDS else address, port)


@dataclass(frozen=True)
class NodePlan:
    conn: NodeConn
    bundle: ConfigBundle  # what the node must serve
    last_good: ConfigBundle | None  # the last bundle verified on it (rollback target)
    applied_sha256: str = ""  # what the database says it verified last
    worker_pid: int | None = None  # the worker that took it
    # Both bundles passed `haproxy -c -dW` with the node's own binary already (see
    # CentrallyValidatedLocalTransport); only ever set for local nodes.
    prevalidated: bool = False
    # The database records the node as cleanly up: the last apply ended verified, so its live maps are
    # exactly last_good's. A node marked down or drifted may hold half an interrupted map update.
    recorded_clean: bool = True
    # Open ACME HTTP-01 answers (token, key authorization): a reload starts the worker on the rendered,
    # empty challenge map, so they are put back at once (with those the old worker held).
    challenges: tuple[tuple[str, str], ...] = ()
    # Written to the node's served.json as the apply starts (transports/base.py SERVED_NAME): which revision of
    # which fleet it is being given. Empty: nothing written.
    served: bytes = b""
    # Maps whose live values a running enforcement loop owns (render.chain.ENFORCER_MAPS while one runs): a hot
    # rollout changes their keys only. Without a loop, the rendered static values are the ones to serve.
    keep_live_values: frozenset[str] = frozenset()

    @property
    def already_applied(self) -> bool:
        return bool(self.applied_sha256) and self.applied_sha256 == self.bundle.sha256


@dataclass
class NodeOutcome:
    node: str
    status: str  # succeeded | failed | rolled_back
    error: str = ""
    unreachable: bool = False  # the node could not be reached (before the apply began, or it went away during it)
    # Unreachable before anything was done on it: a rollout counts the node as down (it catches up when it
    # returns), as its pre-flight would have, not as a failure of the config.
    untouched: bool = False
    reloaded: bool = False
    hot: bool = False  # served through runtime map updates, without a reload
    worker_pid: int | None = None
    sha256: str = ""  # what the node serves now (the new bundle on success, last good after rollback)
    push_ms: float = 0.0
    reload_ms: float = 0.0
    duration_ms: float = 0.0
    steps: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


class _QuickPollMaster(MasterSocket):
    """Polls `show proc` every 5 ms instead of 20 during a reload: a new worker shows up 40-90 ms
    after the command, so 20 ms steps add ~10 ms to every reload on a rollout's critical path.
    A local unix socket answers in well under a millisecond, so the extra polls cost nothing."""

    def reload_and_verify(self, timeout_s: float = 10.0, poll_s: float = 0.005) -> ReloadResult:
        return super().reload_and_verify(timeout_s, poll_s)


class CentrallyValidatedLocalTransport(LocalTransport):
    """A local node whose bundles were already checked with `haproxy -c -dW` by Spillway itself.

    A node's bundle differs from the revision's validated reference bundle only by values taken
    from the node's allowlisted settings: the header comment, runtime_dir in the `stats socket` and
    `server-state-file` lines (which validation relocates anyway) and bind IP literals. On the same
    host with the same binary, a second `haproxy -c` per node repeats the first one and would double
    a rollout's critical path, so pushes skip it. SSH nodes, whose binary may differ, always
    validate on the node.
    """

    def __init__(self, node: NodeConn, socket_timeout_s: float = 2.0) -> None:
        super().__init__(node, socket_timeout_s)
        self._pushing = False

    def master(self) -> MasterSocket:
        path = self.node.master_socket_path
        return _QuickPollMaster(path, self.socket_timeout_s, send=self._sender(path))

    def push(self, bundle, validate=True):  # type: ignore[no-untyped-def]
        self._pushing = True
        try:
            return super().push(bundle, validate)
        finally:
            self._pushing = False

    def validate_dir(self, set_dir: str) -> tuple[bool, str]:
        if self._pushing:
            return True, "validated by Spillway before the push (same host, same haproxy binary)"
        return super().validate_dir(set_dir)


def transport_of(conn: NodeConn, prevalidated: bool = False) -> FileSetTransport:
    if prevalidated and conn.transport == "local":
        return CentrallyValidatedLocalTransport(conn)
    transport = transport_for(conn)
    assert isinstance(transport, FileSetTransport)
    return transport


def verify(transport: FileSetTransport, bundle: ConfigBundle, node_address: str,
           worker_pid: int | None = None) -> str | None:
    """None when the node serves `bundle`'s listeners and backends; otherwise what is wrong.

    Called after a reload `show proc` confirmed: every bind answers a TCP connect (a reload racing a
    port conflict can leave one dead, HAPROXY.md), and the worker lists every expected proxy: frontends from
    `show stat -1 1 -1` (their rows only), backends from `show backend` (names only). The whole `show stat`
    lists every server too: at 20k pools of 2 servers, 14 MB that took ~190 ms to answer and ~680 ms to
    parse, per node and reload; these two take ~20 ms.

    `worker_pid`: the worker expected to answer (the one a reload just started), for a failure's account.
    """
    floating = floating_binds(bundle)
    binds = [probe_address(b, node_address) for b in bundle_binds(bundle) if b not in floating]
    probes = transport.probe_listeners(binds, timeout_s=PROBE_TIMEOUT_S)
    dead = sorted(f"{a}:{p}" for (a, p), ok in probes.items() if not ok)
    if dead:
        return f"listener(s) not answering after reload: {', '.join(dead)}"
    statuses = transport.stats().frontend_statuses()
    listing = transport.runtime("show backend").splitlines()
    if not listing or listing[0] != "# name":
        return f"`show backend` did not list backends: {' / '.join(listing[:3])[:300]!r}"
    present_backends = set(listing[1:])
    frontends, backends = bundle_proxies(bundle)
    missing = [f"frontend {f}" for f in frontends if f not in statuses]
    missing += [f"backend {b}" for b in backends if b not in present_backends]
    if missing:
        listed = f"{', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else "")
        return f"the worker does not list {listed} ({_whose_answer(transport, bundle, worker_pid)})"
    # A frontend stopped over the socket still answers the probe's connect: the master holds its listening
    # socket for the next reload, so the kernel completes handshakes that no worker accepts.
    closed = [f"{f} ({statuses[f]})" for f in frontends if statuses[f] not in SERVING_FRONTEND]
    return f"frontend(s) not accepting connections: {', '.join(closed)}" if closed else None


def _whose_answer(transport: FileSetTransport, bundle: ConfigBundle, worker_pid: int | None) -> str:
    """The node's own account of proxies its worker does not list: which process answered on the stats socket, and
    whether the files the node serves from disk are the bundle's (a worker that loaded other files, or an answer
    from a worker other than the expected one). Only on a failure's path: an operator, and whoever reads a failed
    rollout, learns which of the two it was."""
    said = []
    try:
        pid = transport.stats().show_info().get("Pid", "?")
        whose = "" if worker_pid is None else (
            ", the one expected" if pid == str(worker_pid) else f", not worker {worker_pid} as expected")
        said.append(f"answered by worker {pid}{whose}")
    except NODE_ERRORS as exc:
        said.append(f"`show info` failed: {exc}")
    try:
        on_disk = transport.config_sha256(fresh=True)
    except NODE_ERRORS as exc:
        said.append(f"its files could not be read: {exc}")
    else:
        said.append("the node's files on disk are the bundle's" if on_disk == bundle.sha256
                    else f"the node's files on disk are not the bundle's ({(on_disk or 'none')[:12]})")
    return "; ".join(said)


def _push(transport: FileSetTransport, bundle: ConfigBundle, outcome: NodeOutcome, validate: bool = True) -> bool:
    """Upload and switch to `bundle`; False (with the node's words in outcome.error) when refused."""
    started = time.monotonic()
    pushed = transport.push(bundle, validate)
    outcome.push_ms = (time.monotonic() - started) * 1000.0
    if not pushed.ok:
        # Nothing changed on the node: the staging copy was refused and removed.
        outcome.error = "the node refused the config (`haproxy -c -dW`):\n" + pushed.validation_output
    return pushed.ok


def _hot_apply(transport: FileSetTransport, plan: NodePlan, changes: HotChanges, outcome: NodeOutcome) -> bool:
    """Push the bundle, swap its changed maps and certificates in the running worker; True when the node
    serves it (or when the push was refused: outcome says so and the node serves last_good).

    False means "reload instead" (the reason is in outcome.steps): the files may be pushed already,
    and a reload loads the same files, so falling back is always safe. A certificate the worker did not
    take was aborted (`abort ssl cert`): the old one serves until that reload.

    The change is proven by what it moved, read back from the worker: every moved map key (`get map`, or
    `show map` for a map replaced whole) and every new certificate's serial (`show ssl cert`), without
    verify()'s listener probes and proxy listings. haproxy.cfg is last_good's and the worker is the one that
    was verified serving it (same PID, no failed reload: apply_node checks both before coming here), so its
    listeners and proxies are those already verified, and neither a map entry nor a certificate swap can
    change them; verify() would cost every route change a listener probe per bind and two proxy listings.

    A node whose bundle Spillway validated itself (plan.prevalidated: nothing on the node can refuse the
    push) takes the runtime update while the files are written: a route change at 100k routes writes and
    fsyncs a 5 MB map, as long as every other step of the node together. The node counts as serving the
    bundle only once both are done; a push that fails after the worker moved reloads the worker onto the
    files it still has (last_good's), so the live state never stays ahead of the disk.
    """
    if not plan.prevalidated and (changes.certs or changes.servers):
        if not _push(transport, plan.bundle, outcome):
            return True
        return _hot_runtime(transport, plan, changes, outcome)
    if not plan.prevalidated:
        # Only map contents moved (a route change): haproxy.cfg and every other file are the set this node
        # validated and serves, and its own worker takes each moved entry first (`add/set map`, read back), so
        # the worker is the node's check of the entries, and `haproxy -c` on the node would only parse the
        # same maps again: ~0.5-1.5 s of every route change on a busy SSH node, before anything was live. A
        # worker that refuses an entry sends the node to the reload path, which pushes with the check; a
        # push that fails after the worker moved reloads it onto the files it has, as below.
        if not _hot_runtime(transport, plan, changes, outcome):
            # The worker may hold some of the moved entries already: checked files are pushed here, so that a
            # refusal reloads it onto the files it has (last_good's) instead of leaving them live.
            if not _push(transport, plan.bundle, outcome):
                refused = outcome.error
                _reload_from_disk(transport, plan, outcome)
                outcome.error = refused
                return True
            return False  # the caller reloads onto the checked files
        if not _push_or_error(transport, plan.bundle, outcome, validate=False):
            _reload_from_disk(transport, plan, outcome)
        return True
    if isinstance(transport, LocalTransport):
        # On this host both are work of this process's own (no wait on a network): a thread beside it only added
        # lock hand-offs (fanout.parallel).
        served = _hot_runtime(transport, plan, changes, outcome)
        pushed = _push_or_error(transport, plan.bundle, outcome)
    else:
        pushing = _PUSHES.submit(_push_or_error, transport, plan.bundle, outcome)
        served = _hot_runtime(transport, plan, changes, outcome)
        pushed = pushing.result()
    if pushed:
        return served
    _reload_from_disk(transport, plan, outcome)
    return True


# The pushes _hot_apply runs beside its runtime updates (one per node of a batch; a rollout's batch runs in
# fanout.parallel's threads, and two fleets may roll out at once in one process).
_PUSHES = ThreadPoolExecutor(max_workers=32, thread_name_prefix="spillway-push")


def _beside(transport: FileSetTransport, fn, *args) -> Future:  # type: ignore[no-untyped-def]
    """`fn(*args)` beside a node's apply: on a push thread for a node reached over the network; here for a local
    one, whose work is this process's own (a thread only added lock hand-offs, fanout.parallel)."""
    if not isinstance(transport, LocalTransport):
        return _PUSHES.submit(fn, *args)
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except NODE_ERRORS as exc:
        future.set_exception(exc)
    return future


def _push_or_error(transport: FileSetTransport, bundle: ConfigBundle, outcome: NodeOutcome,
                   validate: bool = True) -> bool:
    try:
        return _push(transport, bundle, outcome, validate)
    except NODE_ERRORS as exc:
        outcome.error = f"push failed: {exc}"
        return False


def _moved_keys(name: str, entries: list[tuple[str, str]], old_entries: list[tuple[str, str]], old_file: bytes,
                bundle: ConfigBundle) -> MapDelta | None:
    """The key-by-key change of one map from what the node serves: the one the route lane carried in the bundle
    when the node serves that lane's base file (bytes compare by identity first), else computed (once per pair)."""
    carried = bundle.map_deltas.get(name)
    if carried is not None and carried[0] == old_file:
        return carried[1]  # type: ignore[return-value]
    return file_delta(name, old_entries, entries, old_file, bundle.files[name])


def _hot_runtime(transport: FileSetTransport, plan: NodePlan, changes: HotChanges, outcome: NodeOutcome) -> bool:
    """The runtime half of _hot_apply: moved map keys and certificates, each read back."""
    try:
        stats = transport.stats()
        old_maps = plan.last_good.rendered_manifest.maps if plan.last_good is not None else {}
        replaced = {}
        for name, entries in changes.maps.items():
            if name in plan.keep_live_values:
                # The enforcer's values stay: only keys come and go (static shares written here would hold for
                # up to its next run: a failed-over region took requests again at every capacity rollout).
                live = dict(stats.show_map(name))
                keys = {k for k, _ in entries}
                if live.keys() == keys:
                    continue
                stats.replace_map(name, [(k, live.get(k, v)) for k, v in entries])
                if {k for k, _ in stats.show_map(name)} != keys:  # keys only: the loop may set a value meanwhile
                    raise RuntimeApiError(f"show map {name}", f"keys differ from the {len(keys)} expected")
                continue
            # The few moved keys where that is exact (node/mapdelta.py), else the whole map in one commit.
            delta = (_moved_keys(name, entries, old_maps[name], plan.last_good.files[name], plan.bundle)
                     if plan.last_good is not None and name in old_maps else None)
            if delta is None:
                stats.replace_map(name, entries)
                replaced[name] = entries
            else:
                stats.apply_map_delta(name, delta)  # reads every moved key back with `get map`
        for name, entries in replaced.items():
            live = stats.show_map_lines(name)
            if not same_entries(live, entries, plan.bundle.files.get(name)):
                raise RuntimeApiError(f"show map {name}", f"{len(live)} live entries, {len(entries)} expected")
        for name, pem in changes.certs.items():
            serial = stats.set_ssl_cert(name, pem)  # set, commit, then `show ssl cert` reads the serial back
            if int(serial, 16) != int(pem_serial(pem), 16):
                raise RuntimeApiError(f"show ssl cert {name}", f"serial {serial}, expected {pem_serial(pem)}")
        if changes.servers:
            _hot_servers(stats, changes.servers)
    except NODE_ERRORS as exc:
        outcome.steps.append(f"runtime update failed ({exc}): reloading instead")
        return False
    outcome.status, outcome.sha256, outcome.worker_pid = "succeeded", plan.bundle.sha256, plan.worker_pid
    outcome.hot = True
    if plan.challenges:  # the worker kept them; the new set's file is rendered empty
        try:
            persist_answers(transport, dict(plan.challenges))
        except NODE_ERRORS as exc:
            outcome.steps.append(f"ACME HTTP-01 answers not written to the node's files: {exc}")
    return True


_RUNTIME_STATE = {"active": "ready", "drain": "drain", "maint": "maint"}


def _hot_servers(stats, servers: dict[tuple[str, str], tuple[str, int]]) -> None:
    """Set each server's state and weight as rendered, then read every one back (`show servers state`).
    Drain keeps the configured weight for later: HAProxy's drain state makes the effective weight 0."""
    for (backend, server), (state, weight) in servers.items():
        if state != "drain":
            stats.set_server_weight(backend, server, weight)
        stats.set_server_state(backend, server, _RUNTIME_STATE[state])  # type: ignore[arg-type]
    live = parse_servers_state(stats.show_servers_state())
    for key, (state, weight) in servers.items():
        seen = live.get(key)
        if seen is None or seen[0] != state or (state == "active" and seen[1] != weight):
            raise RuntimeApiError("show servers state", f"{key[0]}/{key[1]} is {seen}, expected {(state, weight)}")


def _reload_from_disk(transport: FileSetTransport, plan: NodePlan, outcome: NodeOutcome) -> None:
    """After a failed push beside a runtime update: the node's files are still last_good's (a push that
    fails changes nothing), its worker may serve some new map keys; a reload makes it serve the files."""
    outcome.status, outcome.hot = "failed", False
    outcome.reloaded = True  # whatever happens next, the live state was touched: the node is not clean
    try:
        held = live_challenges(transport)
        result = transport.activate(RELOAD_TIMEOUT_S)
        outcome.reload_ms = result.duration_ms
        if not result.ok:
            outcome.steps.append(f"reload onto the last good files failed: {result.error}")
            return
        restore_challenges(transport, plan, held, outcome)
        problem = (verify(transport, plan.last_good, plan.conn.address, result.new_worker_pid)
                   if plan.last_good is not None else None)
        if problem:
            outcome.steps.append(f"after reloading onto the last good files {problem}")
            return
        outcome.status, outcome.worker_pid = "rolled_back", result.new_worker_pid
        outcome.sha256 = plan.last_good.sha256 if plan.last_good is not None else ""
        outcome.steps.append("the push failed after the runtime update: reloaded onto the last good files")
    except NODE_ERRORS as exc:
        outcome.steps.append(f"reload onto the last good files failed: {exc}")


def pem_serial(pem: bytes) -> str:
    """The first certificate's serial in `show ssl cert`'s notation (upper-case hex, even length)."""
    from cryptography import x509

    serial = format(x509.load_pem_x509_certificate(pem).serial_number, "X")
    return serial if len(serial) % 2 == 0 else "0" + serial


def live_challenges(transport: FileSetTransport) -> dict[str, str]:
    """The HTTP-01 answers the running worker serves (published at runtime, in no file): read before a
    reload so that the new worker gets them too, even one published after the plan was made."""
    try:
        return dict(transport.stats().show_map(ACME_CHALLENGE_MAP))
    except NODE_ERRORS:  # no worker, or a config without the map yet: nothing to carry over
        return {}


def persist_answers(transport: FileSetTransport, answers: dict[str, str]) -> None:
    """Write the HTTP-01 answers the worker serves into the node's challenge map file, so a node restarted from
    its own files (the control plane down) answers them too: the files are the runtime state's equal."""
    transport.write_current_file(ACME_CHALLENGE_MAP, "".join(f"{t} {v}\n" for t, v in sorted(answers.items())).encode())


def restore_challenges(transport: FileSetTransport, plan: NodePlan, held: dict[str, str],
                       outcome: NodeOutcome) -> None:
    """Put the open HTTP-01 answers into a freshly reloaded worker (its map file is rendered empty).

    Entry by entry (del + add), not a map swap: an answer published on the new worker meanwhile stays.
    A failure is noted, not fatal: the config is served, and the CA's retry or the order's own retry
    with backoff follows."""
    answers = {**held, **dict(plan.challenges)}
    if not answers:
        return
    try:
        stats = transport.stats()
        for token, value in answers.items():
            stats.del_map_entry(ACME_CHALLENGE_MAP, token)
            stats.add_map_entry(ACME_CHALLENGE_MAP, token, value)
        persist_answers(transport, answers)
    except NODE_ERRORS as exc:
        outcome.steps.append(f"ACME HTTP-01 answers not restored after the reload: {exc}")


def reachable(conn: NodeConn) -> tuple[ProcInfo | None, str]:
    """(show proc, "") when the node's master answers; (None, why) otherwise."""
    transport = transport_of(conn)
    try:
        return transport.show_proc(), ""
    except NODE_ERRORS as exc:
        return None, f"node {conn.name} unreachable: {exc}"
    finally:
        transport.close()


def new_binds(bundle: ConfigBundle, last_good: ConfigBundle | None) -> list[tuple[str, int]]:
    """The binds `bundle` adds to what the node serves from `last_good`: the ones another process could hold.

    Addresses the node already serves from its last verified config are held by its own HAProxy. VIP binds
    (transparent) answer on whichever node holds the VIP: a probe would find a peer there."""
    kept = set(bundle_binds(last_good)) if last_good is not None else set()
    floating = floating_binds(bundle)
    return [b for b in bundle_binds(bundle) if b not in kept and b not in floating]


def precheck_binds(conn: NodeConn, bundle: ConfigBundle, last_good: ConfigBundle | None, *,
                   proc: ProcInfo | None = None, host: HostListeners | None = None) -> list[str]:
    """Bind addresses of `bundle` another process already holds on the node (HAPROXY.md hazard).

    Local nodes: a probe bind on this host, ignoring sockets the node's own HAProxy holds
    (validate.bind_conflicts). SSH nodes: a TCP connect from the node's side to every address the
    node does not bind yet; an answer means someone else listens there. For a local node, `proc` is its `show
    proc` when the caller has it, and `host` this host's listeners as read once for a rollout's round of nodes.
    """
    new = new_binds(bundle, last_good)
    if not new:
        return []
    if conn.transport == "local":
        owned: set[int] = set()
        if proc is None:
            proc, _ = reachable(conn)
        if proc is not None:
            owned.add(proc.master_pid)
        return [f"{a}:{p}" for a, p in bind_conflicts(new, owned, host)]
    if last_good is None:
        return _remote_listener_conflicts(conn, new)
    transport = transport_of(conn)
    try:
        probes = transport.probe_listeners([probe_address(b, conn.address) for b in new], PROBE_TIMEOUT_S)
    finally:
        transport.close()
    return sorted(f"{a}:{p}" for (a, p), answered in probes.items() if answered)


def _remote_listener_conflicts(conn: NodeConn, binds: list[tuple[str, int]]) -> list[str]:
    """A never-configured SSH node: what listens there now, from `ss -ltnpH` on the node.

    Without a verified config we do not know which addresses the node's own HAProxy holds, so a
    connect probe cannot tell it from a stranger; `ss` names the holder. Where `ss` is missing the
    post-reload listener probes remain the guard.
    """
    proc, _ = reachable(conn)
    owned = {proc.master_pid, *(w.pid for w in proc.workers)} if proc is not None else set()
    transport = transport_of(conn)
    try:
        code, output = transport.run_command(["ss", "-ltnpH"], PROBE_TIMEOUT_S * 5)
    finally:
        transport.close()
    if code != 0:
        return []
    return [f"{a}:{p}" for a, p in remote_bind_conflicts(binds, parse_ss_listeners(output), owned)]


def _rollback(transport: FileSetTransport, plan: NodePlan, outcome: NodeOutcome) -> None:
    """Put the node back on its last good bundle; records the result on `outcome`."""
    try:
        if plan.last_good is not None:
            pushed = transport.push(plan.last_good)
            if not pushed.ok:
                outcome.steps.append("rollback push refused:\n" + pushed.validation_output)
                return
            held = live_challenges(transport)
            result = transport.activate(RELOAD_TIMEOUT_S)
            target = plan.last_good
        else:
            held = live_challenges(transport)
            result = transport.rollback(RELOAD_TIMEOUT_S)
            target = None
        if not result.ok:
            outcome.steps.append(f"rollback reload failed: {result.error}")
            return
        restore_challenges(transport, plan, held, outcome)
        if target is not None:
            problem = verify(transport, target, plan.conn.address, result.new_worker_pid)
            if problem:
                outcome.steps.append(f"rollback verification failed: {problem}")
                return
            outcome.sha256 = target.sha256
            if KEEPALIVED_FILE in target.files:
                problem = transport.reload_keepalived()
                if problem:
                    outcome.steps.append(f"rollback: {problem}")
        outcome.worker_pid = result.new_worker_pid
        outcome.status = "rolled_back"
        outcome.steps.append("rolled back to the last good config")
    except NODE_ERRORS as exc:
        outcome.steps.append(f"rollback failed: {exc}")


def apply_node(plan: NodePlan) -> NodeOutcome:
    """Push, reload and verify one node; on any failure after the push, roll it back.

    Idempotent: a node that already runs the bundle (same files on disk, same worker, no failed
    reload) is only verified; one that has the files but not the worker (a run killed between push
    and reload) is reloaded without a new push.
    """
    started = time.monotonic()
    outcome = NodeOutcome(node=plan.conn.name, status="failed")
    transport = transport_of(plan.conn, plan.prevalidated)
    marking = None
    try:
        try:
            proc = transport.show_proc()
            on_disk = transport.config_sha256()
        except NODE_ERRORS as exc:
            outcome.unreachable = outcome.untouched = True
            outcome.error = f"node {plan.conn.name} unreachable: {exc}"
            return outcome
        # Beside the apply, off its critical path: a record of what the node is given. Written first, so a
        # node always records a revision at least as new as the one it serves (restore detection errs on holding).
        marking = _beside(transport, transport.write_served, plan.served) if plan.served else None
        current = proc.current_worker
        running_it = (
            on_disk == plan.bundle.sha256
            and plan.already_applied
            and current is not None
            and current.pid == plan.worker_pid
            and proc.failed_reloads == 0
        )
        if running_it:
            problem = verify(transport, plan.bundle, plan.conn.address, current.pid)
            if problem is None:
                outcome.status, outcome.sha256 = "succeeded", plan.bundle.sha256
                outcome.worker_pid = current.pid
                outcome.steps.append("already serving this config: verified, not reloaded")
                return outcome
            outcome.steps.append(f"serving this config but {problem}: reloading")
        elif (
            plan.recorded_clean
            and plan.last_good is not None
            and on_disk == plan.last_good.sha256
            and current is not None
            and current.pid == plan.worker_pid
            and proc.failed_reloads == 0
        ):
            # The worker runs last_good: a route-only change needs no reload.
            changes = hot_changes(plan.last_good, plan.bundle)
            if changes is not None:
                if _hot_apply(transport, plan, changes, outcome):
                    return outcome
                on_disk = transport.config_sha256()
        if on_disk != plan.bundle.sha256 and not _push(transport, plan.bundle, outcome):
            return outcome
        held = live_challenges(transport)
        result = transport.activate(RELOAD_TIMEOUT_S)
        outcome.reload_ms = result.duration_ms
        outcome.reloaded = True
        if not result.ok:
            outcome.error = f"reload failed: {result.error}"
        else:
            restore_challenges(transport, plan, held, outcome)
            problem = verify(transport, plan.bundle, plan.conn.address, result.new_worker_pid)
            if problem is None and KEEPALIVED_FILE in plan.bundle.files:
                problem = transport.reload_keepalived()
            if problem is None:
                outcome.status, outcome.sha256, outcome.worker_pid = (
                    "succeeded", plan.bundle.sha256, result.new_worker_pid)
                return outcome
            outcome.error = f"verification failed: {problem}"
        _rollback(transport, plan, outcome)
        return outcome
    except NODE_ERRORS as exc:
        outcome.error = outcome.error or f"node {plan.conn.name}: {exc}"
        try:
            transport.show_proc()
        except NODE_ERRORS:
            outcome.unreachable = True  # went away mid-rollout: nothing to roll back through
            return outcome
        _rollback(transport, plan, outcome)
        return outcome
    finally:
        if marking is not None:
            try:
                marking.result()
            except NODE_ERRORS as exc:
                outcome.steps.append(f"served.json not written: {exc}")
        if outcome.steps:
            outcome.error = "\n".join(filter(None, [outcome.error, *outcome.steps]))
        outcome.duration_ms = (time.monotonic() - started) * 1000.0
        with contextlib.suppress(Exception):
            transport.close()
