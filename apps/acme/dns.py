"""DNS providers for DNS-01 (RFC 8555 8.4): publish `_acme-challenge.<domain> TXT <value>` and remove it.

A provider is any object with `kind = "dns-01"`, `present(challenges)` and `cleanup(challenges)`
(apps.acme.client.Solver). RFC 2136 dynamic update with a TSIG key is the one shipped and tested (against
Knot DNS on loopback); it works with BIND, Knot, PowerDNS and most self-hosted authoritative servers.
Cloud DNS APIs would be further entries in PROVIDERS.

Configured by settings.ACME_DNS_PROVIDER, e.g. {"kind": "rfc2136", "server": "10.0.0.53", "port": 53,
"key_name": "spillway", "key_secret": "<base64>", "algorithm": "hmac-sha256"}.
"""

from __future__ import annotations

import contextlib
from typing import Any

import dns.exception
import dns.name
import dns.query
import dns.rcode
import dns.resolver
import dns.tsigkeyring
import dns.update
from django.conf import settings

from apps.acme.client import AcmeFailure, Challenge

TTL_S = 60


class Rfc2136Provider:
    kind = "dns-01"

    def __init__(self, *, server: str, key_name: str, key_secret: str, port: int = 53,
                 algorithm: str = "hmac-sha256", timeout_s: float = 5.0) -> None:
        self.server, self.port, self.timeout_s = server, int(port), timeout_s
        self.keyring = dns.tsigkeyring.from_text({key_name: key_secret})
        self.key_name, self.algorithm = key_name, algorithm

    def _zone(self, name: str) -> dns.name.Name:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = [self.server], self.port, self.timeout_s
        try:
            return dns.resolver.zone_for_name(name, resolver=resolver)
        except dns.exception.DNSException as exc:
            raise AcmeFailure("dns_zone_unknown", f"The DNS server {self.server}:{self.port} is not authoritative "
                              f"for any zone holding {name}: {exc}") from exc

    def _send(self, challenges: list[Challenge], add: bool) -> None:
        by_zone: dict[dns.name.Name, list[Challenge]] = {}
        for c in challenges:
            by_zone.setdefault(self._zone(c.name), []).append(c)
        for zone, items in by_zone.items():
            update = dns.update.Update(zone, keyring=self.keyring, keyname=self.key_name,
                                       keyalgorithm=self.algorithm)
            for c in items:
                relative = dns.name.from_text(c.name).relativize(zone)
                if add:
                    update.add(relative, TTL_S, "TXT", f'"{c.value}"')
                else:
                    update.delete(relative, "TXT", f'"{c.value}"')
            try:
                answer = dns.query.tcp(update, self.server, port=self.port, timeout=self.timeout_s)
            except (dns.exception.DNSException, OSError) as exc:
                raise AcmeFailure("dns_update_failed", f"The DNS update to {self.server}:{self.port} failed: "
                                  f"{exc}") from exc
            if answer.rcode() != dns.rcode.NOERROR:
                raise AcmeFailure("dns_update_refused", f"The DNS server refused the update for zone {zone}: "
                                  f"{dns.rcode.to_text(answer.rcode())}")

    def present(self, challenges: list[Challenge]) -> None:
        self._send(challenges, add=True)

    def cleanup(self, challenges: list[Challenge]) -> None:
        with contextlib.suppress(AcmeFailure):  # a leftover TXT record is harmless; the order's outcome matters
            self._send(challenges, add=False)


PROVIDERS: dict[str, type] = {"rfc2136": Rfc2136Provider}


def configured_provider() -> Any:
    config = dict(getattr(settings, "ACME_DNS_PROVIDER", None) or {})
    kind = config.pop("kind", "")
    if kind not in PROVIDERS:
        raise AcmeFailure("dns_not_configured", "No DNS provider is configured for dns-01 (ACME_DNS_PROVIDER).")
    return PROVIDERS[kind](**config)
