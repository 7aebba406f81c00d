"""A real ACME CA on loopback for tests and benchmarks: Debian's pebble + pebble-challtestsrv.

pebble-challtestsrv serves only as pebble's DNS (`-dnsserver`): its management API maps each test
hostname to the loopback address of a fleet node, so pebble's HTTP-01 validation reaches a real
HAProxy node on the listener's port (pebble's `httpPort`). pebble's own HTTPS certificate is a fresh
self-signed one (the Debian package ships none); the ACME client trusts it through `ca_bundle`.
Pebble regenerates its root and intermediate on every start; `root_pem()` fetches them from the
management endpoint so tests can verify what the fleet serves. No Django, no pytest.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.netutil import pick_free_port

PEBBLE_BIN = shutil.which("pebble") or "/usr/bin/pebble"
CHALLTESTSRV_BIN = shutil.which("pebble-challtestsrv") or "/usr/bin/pebble-challtestsrv"


def _self_signed_localhost(directory: str) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pebble-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = f"{directory}/cert.pem", f"{directory}/key.pem"
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return cert_path, key_path


def _tail(log: str) -> str:
    with open(log) as fh:
        return fh.read()[-2000:]


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{proc.args[0]} did not listen on {port}: {_tail(log)}")


@dataclass
class Pebble:
    http_port: int
    dns_server: str = ""  # default: a pebble-challtestsrv of its own (see resolve())
    validity_s: int = 3600  # short-lived certificates, so renewal times are near and checkable
    base: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="spw-pebble-"))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    acme_port: int = 0
    mgmt_port: int = 0
    dns_port: int = 0
    chall_mgmt_port: int = 0
    ca_bundle: str = ""

    @property
    def directory_url(self) -> str:
        return f"https://127.0.0.1:{self.acme_port}/dir"

    def _spawn(self, argv: list[str], name: str,
               env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
        log = f"{self.base}/{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, cwd=self.base, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc, log

    def start(self, extra_env: dict[str, str] | None = None) -> Pebble:
        self.dns_port, self.chall_mgmt_port = pick_free_port(), pick_free_port()
        chall, chall_log = self._spawn(
            [CHALLTESTSRV_BIN, "-dns01", f"127.0.0.1:{self.dns_port}", "-http01", "", "-https01", "",
             "-tlsalpn01", "", "-management", f"127.0.0.1:{self.chall_mgmt_port}",
             "-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""], "challtestsrv")
        _wait_port(self.chall_mgmt_port, chall, chall_log)
        cert_path, key_path = _self_signed_localhost(self.base)
        self.ca_bundle = cert_path
        for attempt in range(3):  # a picked port taken before pebble binds it: pick again
            self.acme_port, self.mgmt_port = pick_free_port(), pick_free_port()
            try:
                self._start_pebble(cert_path, key_path, extra_env)
                return self
            except RuntimeError:
                if attempt == 2:
                    raise
        return self

    def _start_pebble(self, cert_path: str, key_path: str, extra_env: dict[str, str] | None) -> None:
        config = {"pebble": {
            "listenAddress": f"127.0.0.1:{self.acme_port}",
            "managementListenAddress": f"127.0.0.1:{self.mgmt_port}",
            "certificate": cert_path, "privateKey": key_path,
            "httpPort": self.http_port, "tlsPort": pick_free_port(),
            "ocspResponderURL": "", "externalAccountBindingRequired": False,
            "certificateValidityPeriod": self.validity_s,
        }}
        with open(f"{self.base}/pebble.json", "w") as fh:
            json.dump(config, fh)
        # NOSLEEP: validate at once (pebble otherwise waits up to 15 s per authorization);
        # NONCEREJECT=0: no random badNonce answers (a real CA rarely sends them; the client retries once).
        env = {"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0", "PEBBLE_AUTHZREUSE": "0",
               **(extra_env or {})}
        proc, log = self._spawn([PEBBLE_BIN, "-config", f"{self.base}/pebble.json",
                                 "-dnsserver", self.dns_server or f"127.0.0.1:{self.dns_port}"], "pebble", env)
        try:
            _wait_port(self.acme_port, proc, log)
            self._wait_directory(proc, log)
        except RuntimeError:
            proc.kill()
            proc.wait()
            self.procs.remove(proc)
            raise

    def _wait_directory(self, proc: subprocess.Popen[bytes], log: str, timeout_s: float = 15.0) -> None:
        """An open port is not enough: a picked port can be taken by another process of a parallel run
        before pebble binds it (a full-suite run then failed with an SSL EOF from whatever listened
        there). Ready means pebble itself answers its directory over TLS with its own certificate."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"pebble exited with {proc.returncode}: {_tail(log)}")
            try:
                if requests.get(self.directory_url, verify=self.ca_bundle, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"pebble did not answer {self.directory_url}: {_tail(log)}")

    def _mgmt_get(self, path: str) -> str:
        answer = requests.get(f"https://127.0.0.1:{self.mgmt_port}{path}", verify=self.ca_bundle, timeout=5)
        answer.raise_for_status()
        return answer.text

    def root_pem(self) -> str:
        return self._mgmt_get("/roots/0")

    def _chall(self, path: str, body: dict) -> None:
        requests.post(f"http://127.0.0.1:{self.chall_mgmt_port}{path}", json=body, timeout=5).raise_for_status()

    def resolve(self, hostname: str, address: str) -> None:
        """Answer A queries for `hostname` with `address` (pebble validates HTTP-01 there)."""
        self._chall("/add-a", {"host": hostname, "addresses": [address]})

    def log(self) -> str:
        with open(f"{self.base}/pebble.log") as fh:
            return fh.read()

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()
        shutil.rmtree(self.base, ignore_errors=True)


KNOTD_BIN = shutil.which("knotd") or "/usr/sbin/knotd"
TSIG_SECRET = "c3BpbGx3YXktdGVzdC10c2lnLWtleS0zMi1ieXRlcyE="  # a test-only key


@dataclass
class Knot:
    """Knot DNS, authoritative for `zone` on loopback, accepting RFC 2136 updates signed with TSIG."""

    zone: str
    base: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="spw-knot-"))
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    key_name: str = "spillway"

    def start(self) -> Knot:
        self.port = pick_free_port()
        os.makedirs(f"{self.base}/db", exist_ok=True)  # knotd keeps its journal there and creates no parents
        with open(f"{self.base}/{self.zone}.zone", "w") as fh:
            fh.write(f"$ORIGIN {self.zone}.\n$TTL 60\n@ SOA ns hostmaster 1 60 60 3600 60\n@ NS ns\n"
                     "ns A 127.0.0.1\n")
        with open(f"{self.base}/knot.conf", "w") as fh:
            fh.write(f"""server:
    listen: 127.0.0.1@{self.port}
    rundir: {self.base}
database:
    storage: {self.base}/db
key:
  - id: {self.key_name}
    algorithm: hmac-sha256
    secret: {TSIG_SECRET}
acl:
  - id: update
    key: {self.key_name}
    action: update
zone:
  - domain: {self.zone}
    storage: {self.base}
    file: {self.zone}.zone
    acl: update
    zonefile-sync: -1
log:
  - target: stderr
    any: warning
""")
        log = f"{self.base}/knot.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([KNOTD_BIN, "-c", f"{self.base}/knot.conf"], stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        import dns.message
        import dns.query
        while True:
            try:
                answer = dns.query.udp(dns.message.make_query(f"{self.zone}.", "SOA"), "127.0.0.1",
                                       port=self.port, timeout=0.5)
                if answer.answer:
                    return self
            except Exception:  # not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"knotd did not start: {_tail(log)}") from None
            time.sleep(0.05)

    def provider_settings(self) -> dict:
        return {"kind": "rfc2136", "server": "127.0.0.1", "port": self.port, "key_name": self.key_name,
                "key_secret": TSIG_SECRET, "algorithm": "hmac-sha256"}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.base, ignore_errors=True)
