"""Strict allowlist validators for every user value that can reach a rendered HAProxy config.

Pure module (no Django): the API layer uses it to answer 400s with a stable code, and the renderer
re-checks the same values as a second line of defence. Everything here is an allowlist; a value is
either accepted whole or rejected, never cleaned up, because a "cleaned" value is a value the user
did not ask for. HAProxy's own `-c` does not catch directive injection (see shared/HAPROXY.md).
"""

from __future__ import annotations

import ipaddress
import re

MAX_HOSTNAME_LEN = 253
MAX_LABEL_LEN = 63
MAX_PATH_LEN = 1024
MAX_SLUG_LEN = 63
MAX_URL_LEN = 2048
MAX_WEIGHT = 256  # HAProxy's server weight range is 0..256

# Characters that are never acceptable anywhere, checked first so the error names the real problem
# (a path with a newline is "unsafe_character", not merely "does not look like a path").
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f-\x9f\u2028\u2029#{}\"'`\\]")

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_WILDCARD_RE = re.compile(rf"^\*\.{_LABEL}(?:\.{_LABEL})+$")
# RFC 3986 pchar minus the quote; '%' only as a complete escape so "%" + "{...}" games are impossible.
_PATH_CHARS = r"(?:[A-Za-z0-9._~!$&()*+,;=:@/-]|%[0-9A-Fa-f]{2})"
_PATH_RE = re.compile(rf"^/{_PATH_CHARS}*$")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_IPV4_RE = re.compile(rf"^{_OCTET}(?:\.{_OCTET}){{3}}\Z")
_SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_URL_RE = re.compile(
    rf"^(?P<scheme>https?)://(?P<host>[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{{1,5}}))?"
    rf"(?P<path>/{_PATH_CHARS}*)?(?:\?(?:{_PATH_CHARS}|\?)*)?$"
)


class InvalidValue(ValueError):
    """A user value failed an allowlist check. `code` is stable for API clients."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _check_text(value: object, *, code: str, what: str, max_len: int) -> str:
    if not isinstance(value, str):
        raise InvalidValue(code, f"{what} must be a string, got {type(value).__name__}.")
    if not value:
        raise InvalidValue(code, f"{what} must not be empty.")
    if len(value) > max_len:
        raise InvalidValue(code, f"{what} is {len(value)} characters long; the maximum is {max_len}.")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise InvalidValue(
            code,
            f"{what} contains the forbidden character {bad.group()!r} at position {bad.start()} "
            "(whitespace, control characters, '#', braces, quotes and backslashes are never allowed).",
        )
    return value


def validate_hostname(s: object, allow_wildcard: bool = True) -> str:
    """RFC 1123 hostname, optionally with a leading `*.`; returns it lower-cased (DNS is case-blind)."""
    value = _check_text(s, code="invalid_hostname", what="Hostname", max_len=MAX_HOSTNAME_LEN).lower()
    if value.startswith("*."):
        if not allow_wildcard:
            raise InvalidValue("invalid_hostname", "Wildcard hostnames are not allowed here.")
        if not _WILDCARD_RE.match(value):
            raise InvalidValue(
                "invalid_hostname",
                f"{value!r} is not a valid wildcard: use '*.' followed by a domain of at least two labels.",
            )
        return value
    if not _HOSTNAME_RE.match(value):
        raise InvalidValue(
            "invalid_hostname",
            f"{value!r} is not a valid hostname: labels of letters, digits and inner hyphens (max 63), "
            "separated by dots, with no trailing dot.",
        )
    return value


def validate_path(s: object) -> str:
    value = _check_text(s, code="invalid_path", what="Path", max_len=MAX_PATH_LEN)
    if not _PATH_RE.match(value):
        raise InvalidValue(
            "invalid_path",
            f"{value!r} is not a valid path: it must start with '/' and contain only letters, digits, "
            "'-._~!$&()*+,;=:@/' and complete %XX escapes ('?' starts a query, which routes do not match).",
        )
    return value


def validate_slug(s: object) -> str:
    value = _check_text(s, code="invalid_slug", what="Name", max_len=MAX_SLUG_LEN)
    if not _SLUG_RE.match(value):
        raise InvalidValue(
            "invalid_slug",
            f"{value!r} is not a valid name: lower-case letters, digits and inner hyphens only.",
        )
    return value


def _check_int(n: object, *, code: str, what: str, low: int, high: int) -> int:
    # bool is an int subclass; True as a port is always a bug upstream.
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidValue(code, f"{what} must be an integer, got {type(n).__name__}.")
    if not low <= n <= high:
        raise InvalidValue(code, f"{what} {n} is out of range {low}..{high}.")
    return n


def validate_port(n: object) -> int:
    return _check_int(n, code="invalid_port", what="Port", low=1, high=65535)


def validate_weight(n: object) -> int:
    return _check_int(n, code="invalid_weight", what="Weight", low=0, high=MAX_WEIGHT)


def validate_ip(s: object) -> str:
    """IPv4 or IPv6 literal, returned in canonical form (so two spellings never render differently)."""
    if isinstance(s, str) and _CANONICAL_IPV4_RE.match(s):
        return s  # already canonical: skips ipaddress, which is slow on 20k-member snapshots
    value = _check_text(s, code="invalid_ip", what="IP address", max_len=45)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InvalidValue("invalid_ip", f"{value!r} is not an IPv4 or IPv6 address.") from None


def validate_address_port(s: object) -> tuple[str, int]:
    """`address:port` (IPv6 as `[address]:port`) as (canonical address, port)."""
    value = _check_text(s, code="invalid_address_port", what="Address and port", max_len=64)
    address, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or len(port) > 5:
        raise InvalidValue("invalid_address_port", f"{value!r} is not address:port (e.g. 10.0.0.5:5514).")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return validate_ip(address), validate_port(int(port))


def validate_redirect_url(s: object) -> str:
    value = _check_text(s, code="invalid_redirect_url", what="Redirect URL", max_len=MAX_URL_LEN)
    match = _URL_RE.match(value)
    if not match:
        raise InvalidValue(
            "invalid_redirect_url",
            f"{value!r} is not an accepted redirect URL: http:// or https://, a hostname, an optional "
            "port, then path and query characters only (no fragment, no spaces, no quotes).",
        )
    try:
        validate_hostname(match.group("host"), allow_wildcard=False)
    except InvalidValue as exc:
        raise InvalidValue("invalid_redirect_url", f"Redirect URL host: {exc.message}") from None
    if match.group("port") is not None:
        try:
            validate_port(int(match.group("port")))
        except InvalidValue as exc:
            raise InvalidValue("invalid_redirect_url", f"Redirect URL port: {exc.message}") from None
    return value


MAX_MESSAGE_LEN = 200
# Letters, digits, single spaces and plain punctuation: literal inside a double-quoted HAProxy string
# (no quotes, backslashes, `$` for environment expansion, `%` or `#`).
_MESSAGE_RE = re.compile(r"^[A-Za-z0-9.,:;!?()/_-]+(?: [A-Za-z0-9.,:;!?()/_-]+)*$")
NO_ROUTE_STATUSES = (404, 421, 503)


def validate_plain_message(s: object) -> str:
    if not isinstance(s, str) or not 0 < len(s) <= MAX_MESSAGE_LEN or not _MESSAGE_RE.match(s):
        raise InvalidValue(
            "invalid_message",
            f"A message is 1-{MAX_MESSAGE_LEN} characters of letters, digits, single spaces and .,:;!?()/_- only.",
        )
    return s


def validate_no_route_status(n: object) -> int:
    if n not in NO_ROUTE_STATUSES or isinstance(n, bool):
        raise InvalidValue("invalid_status", f"The no-route status is one of {', '.join(map(str, NO_ROUTE_STATUSES))}.")
    return n  # type: ignore[return-value]
