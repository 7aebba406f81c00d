"""A real OpenID provider on loopback for the SSO tests: node-oidc-provider (tests/oidc_op/), its own process.

`scripts/setup-system test` installs its node modules (`npm ci` from the committed lockfile).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import deps
from tests.netutil import pick_free_port

OP_DIR = Path(__file__).resolve().parent / "oidc_op"
CLIENT_ID = "spillway"
CLIENT_SECRET = "spillway-test-client-secret-0123456789"  # a test OP client


def signing_jwks() -> dict[str, Any]:
    """A fresh RSA signing key as a private JWK set (what the OP signs id_tokens with)."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key))
    return {"keys": [{**jwk, "kid": f"test-{os.getpid()}-{time.monotonic_ns()}", "use": "sig", "alg": "RS256"}]}


def client(client_id: str, redirect_uri: str, secret: str = CLIENT_SECRET) -> dict[str, Any]:
    return {"client_id": client_id, "client_secret": secret, "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code"], "response_types": ["code"],
            "token_endpoint_auth_method": "client_secret_post"}


@dataclass
class OpenIdProvider:
    issuer: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_op(log_dir: Path, *, clients: list[dict[str, Any]], accounts: dict[str, dict[str, Any]],
             jwks: dict[str, Any] | None = None, ttl: dict[str, int] | None = None) -> OpenIdProvider:
    """Start the OP on a kernel-chosen loopback port; returns once its discovery document answers."""
    node = shutil.which("node")
    if node is None:
        deps.missing("node (apt-get install nodejs) for the test OpenID provider")
    if not (OP_DIR / "node_modules" / "oidc-provider").is_dir() and shutil.which("npm"):
        # A checkout that skipped scripts/setup-system (another worktree): install from the lockfile once.
        subprocess.run(["npm", "ci", "--prefix", str(OP_DIR), "--no-audit", "--no-fund", "--loglevel=error"],
                       check=False, capture_output=True, timeout=300)
    if not (OP_DIR / "node_modules" / "oidc-provider").is_dir():
        deps.missing("tests/oidc_op/node_modules (run: npm ci --prefix tests/oidc_op; scripts/setup-system does)")
    port = pick_free_port()
    issuer = f"http://127.0.0.1:{port}"
    config = {"issuer": issuer, "port": port, "clients": clients, "accounts": accounts,
              "jwks": jwks or signing_jwks(), "ttl": ttl or {}}
    log = log_dir / f"op-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([node, str(OP_DIR / "op.mjs")], cwd=OP_DIR, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OP_CONFIG": json.dumps(config), "NODE_ENV": "test"})
    op = OpenIdProvider(issuer=issuer, proc=proc, log=log)
    deadline = time.monotonic() + 30
    while b"op ready" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            op.stop()
            raise RuntimeError(f"the test OP did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return op
