"""One ACME (RFC 8555) order, start to finish, with Certbot's `acme` library. No Django.

`issue()` registers (or finds) the account, opens an order for the hostnames, hands every challenge
of the chosen type to a Solver in one batch (so HTTP-01 answers reach all nodes in one runtime call
each, and DNS-01 records go out in one update), answers them, waits for the CA, and returns the
issued chain with its fresh private key. What the CA said when a challenge failed comes back in
`AcmeFailure.reason` as the CA's own words, per hostname.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Protocol

import josepy as jose
from acme import challenges, client, errors, messages
from acme import crypto_util as acme_crypto
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from apps.core import outbound

USER_AGENT = "spillway-acme"
# Seconds between polls of a pending authorization or a processing order: soon first (a CA often
# validates within milliseconds), then backing off to once a second.
POLL_STEPS_S = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)


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
            contact_email: str, timeout_s: float) -> tuple[_Client, str]:
    jwk, alg = _jwk(account_key_pem)
    net = client.ClientNetwork(jwk, alg=alg, user_agent=USER_AGENT, timeout=int(timeout_s),
                               verify_ssl=ca_bundle or True)  # type: ignore[arg-type]
    directory = client.ClientV2.get_directory(directory_url, net)
    acme = _Client(directory, net)
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


class _Client(client.ClientV2):
    """ClientV2 that polls soon and then less often instead of sleeping a fixed second per poll.

    Certbot's client sleeps 1 s before each authorization poll and before the first finalization
    poll; a CA that validates in tens of milliseconds then costs ~2 s of pure waiting per order.
    A Retry-After the CA sends is still honoured (RFC 8555 7.5.1, 7.4).
    """

    def _pause(self, attempt: int, response: object, deadline: dt.datetime) -> None:
        wait = POLL_STEPS_S[min(attempt, len(POLL_STEPS_S) - 1)]
        header = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
        if header is not None:
            wait = (min(self.retry_after(response, 1), deadline) - dt.datetime.now()).total_seconds()
        time.sleep(max(0.0, min(wait, (deadline - dt.datetime.now()).total_seconds())))

    def poll_authorizations(self, orderr: messages.OrderResource,
                            deadline: dt.datetime) -> messages.OrderResource:
        responses = []
        for authzr in orderr.authorizations:
            attempt = 0
            while True:
                authzr, response = self.poll(authzr)
                if authzr.body.status != messages.STATUS_PENDING:
                    responses.append(authzr)
                    break
                if dt.datetime.now() >= deadline:
                    raise errors.TimeoutError()
                self._pause(attempt, response, deadline)
                attempt += 1
        failed = [a for a in responses if a.body.status != messages.STATUS_VALID]
        if failed:
            raise errors.ValidationError(failed)
        return orderr.update(authorizations=responses)

    def poll_finalization(self, orderr: messages.OrderResource, deadline: dt.datetime,
                          fetch_alternative_chains: bool = False) -> messages.OrderResource:
        attempt = 0
        body, response = orderr.body, None
        while True:
            if body.status == messages.STATUS_INVALID:
                if body.error is not None:
                    raise errors.IssuanceError(body.error)
                raise errors.Error("The certificate order failed. No further information was provided by the CA.")
            if body.status == messages.STATUS_VALID and body.certificate is not None:
                chain = self._post_as_get(body.certificate)
                return orderr.update(body=body, fullchain_pem=chain.text)
            if body.status == messages.STATUS_READY:
                self.begin_finalization(orderr)
            if dt.datetime.now() >= deadline:
                raise errors.TimeoutError()
            if response is not None or body.status != messages.STATUS_READY:
                self._pause(attempt, response, deadline)
                attempt += 1
            response = self._post_as_get(orderr.uri)
            body = messages.Order.from_json(response.json())

    def finalize_order(self, orderr: messages.OrderResource, deadline: dt.datetime,
                       fetch_alternative_chains: bool = False) -> messages.OrderResource:
        try:
            orderr = self.begin_finalization(orderr)
        except messages.Error as exc:
            if exc.code != "orderNotReady":
                raise
        return self.poll_finalization(orderr, deadline)


@dataclass
class Pending:
    """An order placed with the CA whose challenges are known but not yet answered."""

    acme: _Client
    order: messages.OrderResource
    key_pem: str
    account_uri: str
    challenges: list[Challenge]
    answers: list[tuple[object, object]]


def begin(*, directory_url: str, account_key_pem: str, account_uri: str, hostnames: list[str], kind: str,
          ca_bundle: str | None = None, contact_email: str = "", timeout_s: float = 60.0) -> Pending:
    """Open an order for `hostnames` and work out its `kind` challenges (nothing published yet)."""
    jwk, _ = _jwk(account_key_pem)
    try:
        with outbound.deadline(timeout_s, "reaching the CA"):
            acme, account_uri = _client(directory_url, account_key_pem, account_uri, ca_bundle, contact_email,
                                        timeout_s)
    except (errors.Error, messages.Error, OSError) as exc:
        raise AcmeFailure("ca_unreachable", f"The CA at {directory_url} could not be reached or refused "
                          f"the account: {exc}") from exc
    key_pem = new_private_key_pem()
    csr_pem = acme_crypto.make_csr(key_pem.encode(), hostnames)
    try:
        with outbound.deadline(timeout_s, "placing the order"):
            order = acme.new_order(csr_pem)
    except messages.Error as exc:
        code = "rate_limited" if "rateLimited" in str(exc.typ) else "order_refused"
        raise AcmeFailure(code, f"The CA refused the order: {exc.detail or exc}") from exc
    except (errors.Error, OSError) as exc:
        raise AcmeFailure("ca_unreachable", f"The CA at {directory_url} failed while ordering: {exc}") from exc
    pending = _challenges(order, kind, jwk)
    return Pending(acme, order, key_pem, account_uri, [c for c, _ in pending], [a for _, a in pending])


def complete(pending: Pending, timeout_s: float = 60.0, timings: dict[str, float] | None = None) -> Issued:
    """Tell the CA the published challenges are ready, wait for validation, finalize, fetch the chain.
    `timings`, when given, receives authorize_s (answers until every authorization is valid) and
    finalize_s (CSR until the chain is fetched)."""
    acme = pending.acme
    steps = timings if timings is not None else {}
    started = time.monotonic()
    try:
        # The CA's own polling deadline bounds the waits between requests; the outbound one bounds the
        # requests themselves (a CA that trickles an answer is cut), a little later so the CA's fires first.
        with outbound.deadline(timeout_s + 10.0, "validating and finalizing the order"):
            for chall, response in pending.answers:
                acme.answer_challenge(chall, response)  # type: ignore[arg-type]
            deadline = dt.datetime.now() + dt.timedelta(seconds=timeout_s)
            order = acme.poll_authorizations(pending.order, deadline)  # what poll_and_finalize does, timed
            steps["authorize_s"] = time.monotonic() - started
            started = time.monotonic()
            order = acme.finalize_order(order, deadline)
            steps["finalize_s"] = time.monotonic() - started
    except errors.ValidationError as exc:
        raise AcmeFailure("challenge_failed", _failure_reason(exc)) from exc
    except errors.TimeoutError as exc:
        raise AcmeFailure("ca_timeout", f"The CA did not finish the order within {timeout_s:.0f} s.") from exc
    except errors.IssuanceError as exc:
        raise AcmeFailure("order_refused", f"The CA refused to issue: {exc.error.detail or exc}") from exc
    except messages.Error as exc:
        raise AcmeFailure("order_refused", f"The CA refused the order: {exc.detail or exc}") from exc
    except (errors.Error, OSError) as exc:
        raise AcmeFailure("ca_unreachable", f"The CA failed while validating the order: {exc}") from exc
    return Issued(fullchain_pem=order.fullchain_pem, key_pem=pending.key_pem, account_uri=pending.account_uri)


def issue(*, directory_url: str, account_key_pem: str, account_uri: str, hostnames: list[str], solver: Solver,
          ca_bundle: str | None = None, contact_email: str = "", timeout_s: float = 60.0) -> Issued:
    """Order a certificate for `hostnames` start to finish; raises AcmeFailure with the CA's reason."""
    pending = begin(directory_url=directory_url, account_key_pem=account_key_pem, account_uri=account_uri,
                    hostnames=hostnames, kind=solver.kind, ca_bundle=ca_bundle, contact_email=contact_email,
                    timeout_s=timeout_s)
    try:
        solver.present(pending.challenges)
        return complete(pending, timeout_s)
    finally:
        solver.cleanup(pending.challenges)
