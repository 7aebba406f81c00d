"""One ACME (RFC 8555) order, start to finish, with Certbot's `acme` library. No Django.

`issue()` registers (or finds) the account, opens an order for the hostnames, hands every challenge
of the chosen type to a Solver in one batch (so HTTP-01 answers reach all nodes in one runtime call
each, and DNS-01 records go out in one update), answers them, waits for the CA, and returns the
issued chain with its fresh private key. What the CA said when a challenge failed comes back in
`AcmeFailure.reason` as the CA's own words, per hostname.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

import josepy as jose
from acme import challenges, client, errors, messages
from acme import crypto_util as acme_crypto
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

USER_AGENT = "spillway-acme"


@dataclass(frozen=True)
class Challenge:
    kind: str  # "http-01" | "dns-01"
    hostname: str  # as ordered, "*.shop.test" for a wildcard
    name: str  # http-01: the token; dns-01: the TXT record name (_acme-challenge.<domain>)
    value: str  # http-01: the key authorization; dns-01: the TXT value


class Solver(Protocol):
    kind: str

    def present(self, challenges: list[Challenge]) -> None: ...

    def cleanup(self, challenges: list[Challenge]) -> None: ...


class AcmeFailure(Exception):
    """The order failed; `reason` is in plain words, with the CA's own explanation where it gave one."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Issued:
    fullchain_pem: str
    key_pem: str
    account_uri: str


def new_private_key_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _jwk(account_key_pem: str) -> tuple[jose.JWK, jose.JWASignature]:
    key = serialization.load_pem_private_key(account_key_pem.encode(), password=None)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return jose.JWKEC(key=key), jose.ES256
    return jose.JWKRSA(key=key), jose.RS256


def _client(directory_url: str, account_key_pem: str, account_uri: str, ca_bundle: str | None,
            contact_email: str, timeout_s: float) -> tuple[client.ClientV2, str]:
    jwk, alg = _jwk(account_key_pem)
    net = client.ClientNetwork(jwk, alg=alg, user_agent=USER_AGENT, timeout=int(timeout_s),
                               verify_ssl=ca_bundle or True)  # type: ignore[arg-type]
    directory = client.ClientV2.get_directory(directory_url, net)
    acme = client.ClientV2(directory, net)
    if account_uri:
        net.account = messages.RegistrationResource(uri=account_uri, body=messages.Registration())
        return acme, account_uri
    contact = (f"mailto:{contact_email}",) if contact_email else ()
    try:
        regr = acme.new_account(messages.NewRegistration(contact=contact, terms_of_service_agreed=True))
    except errors.ConflictError as exc:  # the key is registered already: that account is ours
        regr = messages.RegistrationResource(uri=exc.location, body=messages.Registration())
        net.account = regr
    return acme, regr.uri


def _challenges(order: messages.OrderResource, kind: str, jwk: jose.JWK) -> list[tuple[Challenge, object]]:
    wanted = challenges.HTTP01 if kind == "http-01" else challenges.DNS01
    out = []
    for authz in order.authorizations:
        if authz.body.status == messages.STATUS_VALID:
            continue  # the CA remembers this name was proven recently
        domain = authz.body.identifier.value
        hostname = f"*.{domain}" if authz.body.wildcard else domain
        found = [c for c in authz.body.challenges if isinstance(c.chall, wanted)]
        if not found:
            raise AcmeFailure("challenge_unavailable",
                              f"The CA offers no {kind} challenge for {hostname} "
                              + ("(a wildcard needs dns-01)." if authz.body.wildcard else "."))
        chall = found[0]
        response, validation = chall.response_and_validation(jwk)
        # http-01: the token in the URL path; dns-01: the TXT record's name.
        name = chall.chall.encode("token") if kind == "http-01" else chall.chall.validation_domain_name(domain)
        out.append((Challenge(kind, hostname, name, validation), (chall, response)))
    return out


def _failure_reason(exc: errors.ValidationError) -> str:
    parts = []
    for authzr in exc.failed_authzrs:
        domain = authzr.body.identifier.value
        for chall in authzr.body.challenges:
            if chall.error is not None:
                detail = chall.error.detail or chall.error.description or str(chall.error.typ)
                parts.append(f"The CA could not validate {domain}: {detail}")
        if not any(c.error for c in authzr.body.challenges):
            parts.append(f"The CA could not validate {domain} (no reason given).")
    return " ".join(parts) or "The CA refused the order's challenges."


def issue(*, directory_url: str, account_key_pem: str, account_uri: str, hostnames: list[str], solver: Solver,
          ca_bundle: str | None = None, contact_email: str = "", timeout_s: float = 60.0) -> Issued:
    """Order a certificate for `hostnames`; raises AcmeFailure with the CA's reason in plain words."""
    jwk, _ = _jwk(account_key_pem)
    try:
        acme, account_uri = _client(directory_url, account_key_pem, account_uri, ca_bundle, contact_email,
                                    timeout_s)
    except (errors.Error, messages.Error, OSError) as exc:
        raise AcmeFailure("ca_unreachable", f"The CA at {directory_url} could not be reached or refused "
                          f"the account: {exc}") from exc
    key_pem = new_private_key_pem()
    csr_pem = acme_crypto.make_csr(key_pem.encode(), hostnames)
    try:
        order = acme.new_order(csr_pem)
    except messages.Error as exc:
        code = "rate_limited" if "rateLimited" in str(exc.typ) else "order_refused"
        raise AcmeFailure(code, f"The CA refused the order: {exc.detail or exc}") from exc
    pending = _challenges(order, solver.kind, jwk)
    published = [c for c, _ in pending]
    try:
        solver.present(published)
        for _, (chall, response) in pending:
            acme.answer_challenge(chall, response)
        deadline = dt.datetime.now() + dt.timedelta(seconds=timeout_s)
        order = acme.poll_and_finalize(order, deadline=deadline)
    except errors.ValidationError as exc:
        raise AcmeFailure("challenge_failed", _failure_reason(exc)) from exc
    except errors.TimeoutError as exc:
        raise AcmeFailure("ca_timeout", f"The CA did not finish the order within {timeout_s:.0f} s.") from exc
    except messages.Error as exc:
        raise AcmeFailure("order_refused", f"The CA refused the order: {exc.detail or exc}") from exc
    finally:
        solver.cleanup(published)
    return Issued(fullchain_pem=order.fullchain_pem, key_pem=key_pem, account_uri=account_uri)
