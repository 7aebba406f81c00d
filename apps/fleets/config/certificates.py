"""TLS certificates uploaded as PEM: validated, private key encrypted at rest, rendered into `ssl crt`.

Checks before anything is stored: the PEM parses, the private key is unencrypted PEM and belongs to
the leaf certificate, each chain certificate issued the one before it, and the leaf is valid now.
Expiry within EXPIRY_WARNING_DAYS is accepted with a warning (shown in the API and UI).
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtensionOID, NameOID
from django.db import transaction

from apps.accounts.principal import Principal
from apps.audit.services import audit_record
from apps.core import crypto
from apps.core.errors import Conflict, DomainError, save_or_conflict
from apps.fleets.models import Certificate

EXPIRY_WARNING_DAYS = 30
MAX_PEM_BYTES = 256 * 1024


@dataclass(frozen=True)
class CertInfo:
    cert_pem: str  # leaf, then chain, normalised PEM
    key_pem: str
    subject: str
    issuer: str
    dns_names: list[str]
    not_before: dt.datetime
    not_after: dt.datetime
    fingerprint_sha256: str
    warnings: list[str] = field(default_factory=list)


def _load_certs(text: str, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(text.encode())
    except ValueError as exc:
        raise DomainError("invalid_certificate", f"The {what} is not PEM certificate text: {exc}",
                          field="cert_pem" if what == "certificate" else "chain_pem") from exc
    return certs


def _name(name: x509.Name) -> str:
    return name.rfc4514_string()[:500]


def expiry_warnings(not_after: dt.datetime | None, now: dt.datetime | None = None) -> list[str]:
    if not_after is None:
        return []
    now = now or dt.datetime.now(dt.UTC)
    days = (not_after - now).total_seconds() / 86400
    if days < 0:
        return ["expired"]
    if days < EXPIRY_WARNING_DAYS:
        return [f"expires in {int(days)} day(s)"]
    return []


def parse_certificate(cert_pem: str, key_pem: str, chain_pem: str = "",
                      now: dt.datetime | None = None) -> CertInfo:
    """Validate an upload; raises DomainError naming the field at fault."""
    if max(len(cert_pem), len(key_pem), len(chain_pem)) > MAX_PEM_BYTES:
        raise DomainError("too_large", "PEM uploads are limited to 256 KiB each.")
    certs = _load_certs(cert_pem, "certificate")
    if chain_pem.strip():
        certs += _load_certs(chain_pem, "chain")
    if not certs:
        raise DomainError("invalid_certificate", "No certificate found in the PEM text.", field="cert_pem")
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except TypeError as exc:
        raise DomainError("encrypted_key", "The private key is passphrase-protected; upload it unencrypted "
                          "(Spillway encrypts it at rest itself).", field="key_pem") from exc
    except ValueError as exc:
        raise DomainError("invalid_key", f"The private key is not PEM key text: {exc}", field="key_pem") from exc
    leaf = certs[0]
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != leaf.public_key().public_bytes(
            serialization.Encoding.DER, spki):
        raise DomainError("key_mismatch", "The private key does not belong to the certificate.", field="key_pem")
    for child, parent in itertools.pairwise(certs):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise DomainError("broken_chain", f"'{_name(child.subject)}' was not issued by the next certificate "
                              f"in the chain ('{_name(parent.subject)}'); order: leaf, then intermediates.",
                              field="chain_pem") from exc
    now = now or dt.datetime.now(dt.UTC)
    if leaf.not_valid_before_utc > now:
        raise DomainError("not_yet_valid", f"The certificate is valid only from {leaf.not_valid_before_utc}.",
                          field="cert_pem")
    if leaf.not_valid_after_utc <= now:
        raise DomainError("expired", f"The certificate expired on {leaf.not_valid_after_utc}.", field="cert_pem")
    try:
        san = leaf.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
        dns_names = [str(n) for n in san.get_values_for_type(x509.DNSName)]
    except x509.ExtensionNotFound:
        dns_names = [str(a.value) for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    pem = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)
    key_text = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()
    return CertInfo(
        cert_pem=pem, key_pem=key_text, subject=_name(leaf.subject), issuer=_name(leaf.issuer),
        dns_names=dns_names, not_before=leaf.not_valid_before_utc, not_after=leaf.not_valid_after_utc,
        fingerprint_sha256=leaf.fingerprint(hashes.SHA256()).hex(),
        warnings=expiry_warnings(leaf.not_valid_after_utc, now),
    )


def certificate_save(*, principal: Principal, cert: Certificate, org, name: str, cert_pem: str | None,
                     key_pem: str | None, chain_pem: str = "", touch_lbs: bool = True) -> Certificate:
    """Create or replace a certificate; LBs whose listeners use it roll out the new one.

    A PEM left out (None) keeps the stored one: a PATCH may rename only, or renew the leaf with the
    same key. A new certificate needs both. `touch_lbs=False`: the caller bumps the LBs itself (ACME
    stores a batch of certificates and bumps each LB once for all of them).
    """
    if cert.pk is None and (cert_pem is None or key_pem is None):
        raise DomainError("required", "A new certificate needs cert_pem and key_pem.",
                          field="cert_pem" if cert_pem is None else "key_pem")
    if cert_pem is None:
        cert_pem = cert.cert_pem
    if key_pem is None:
        key_pem = crypto.decrypt(cert.key_encrypted)
    info = parse_certificate(cert_pem, key_pem, chain_pem)
    from apps.balancers.services import lb_touch

    with transaction.atomic():
        before = {"fingerprint": cert.fingerprint_sha256, "not_after": cert.not_after} if cert.pk else None
        cert.org, cert.name = org, name
        cert.cert_pem, cert.key_encrypted = info.cert_pem, crypto.encrypt(info.key_pem)
        cert.subject, cert.issuer, cert.dns_names = info.subject, info.issuer, info.dns_names
        cert.not_before, cert.not_after = info.not_before, info.not_after
        cert.fingerprint_sha256 = info.fingerprint_sha256
        save_or_conflict(cert, Conflict("name_taken", f"A certificate named '{name}' already exists.", field="name"))
        audit_record(principal=principal, org=org, action="certificate.save", obj=cert, before=before,
                     after={"fingerprint": cert.fingerprint_sha256, "not_after": cert.not_after,
                            "subject": cert.subject})
        for lb_id in sorted(set(cert.listeners.values_list("lb_id", flat=True))) if touch_lbs else []:
            lb_touch(lb_id)
    return cert


def certificate_delete(*, principal: Principal, cert: Certificate) -> None:
    from django.db.models import ProtectedError

    with transaction.atomic():
        audit_record(principal=principal, org=cert.org, action="certificate.delete", obj=cert,
                     before={"fingerprint": cert.fingerprint_sha256, "subject": cert.subject})
        try:
            with transaction.atomic():
                cert.delete()
        except ProtectedError as exc:
            raise Conflict("in_use", "This certificate is still used by a listener; change the listener first."
                           ) from exc
