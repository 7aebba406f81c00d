"""The allowlist validators the API and the renderer share (pure, no database)."""

from __future__ import annotations

import pytest

from apps.core.validators import (
    InvalidValue,
    validate_hostname,
    validate_ip,
    validate_path,
    validate_port,
    validate_redirect_url,
    validate_slug,
    validate_weight,
)

# Everything that has ever broken a config line or a map file, plus a few exotic whitespaces.
HOSTILE = [
    "a\nb",
    "a\rb",
    "a\u2028b",
    "a\u2029b",
    "a\x00b",
    "a b",
    "a\tb",
    "a\x0bb",
    "a\x85b",
    "a#b",
    "a{b",
    "a}b",
    'a"b',
    "a'b",
    "a\\b",
    "a`b",
]


@pytest.mark.parametrize("bad", HOSTILE)
@pytest.mark.parametrize(
    ("check", "prefix", "code"),
    [
        (validate_hostname, "x", "invalid_hostname"),
        (validate_path, "/x", "invalid_path"),
        (validate_slug, "x", "invalid_slug"),
        (validate_redirect_url, "https://example.com/x", "invalid_redirect_url"),
        (validate_ip, "127.0.0.1", "invalid_ip"),
    ],
)
def test_hostile_characters_are_refused_everywhere(check, prefix: str, code: str, bad: str) -> None:
    with pytest.raises(InvalidValue) as excinfo:
        check(prefix + bad)
    assert excinfo.value.code == code
    assert isinstance(excinfo.value, ValueError)


def test_it_accepts_ordinary_hostnames_and_lowercases_them() -> None:
    assert validate_hostname("Example.COM") == "example.com"
    assert validate_hostname("a-b.c0.example") == "a-b.c0.example"
    assert validate_hostname("*.example.com") == "*.example.com"
    assert validate_hostname("localhost") == "localhost"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "-a.com",
        "a-.com",
        "a..com",
        "a.com.",
        "*.com",
        "a.*.com",
        "*example.com",
        "é.com",
        "a" * 64 + ".com",
        ("a" * 60 + ".") * 5 + "com",
        "a_b.com",
        "a.com:80",
    ],
)
def test_it_refuses_malformed_hostnames(bad: str) -> None:
    with pytest.raises(InvalidValue) as excinfo:
        validate_hostname(bad)
    assert excinfo.value.code == "invalid_hostname"


def test_wildcards_can_be_refused() -> None:
    with pytest.raises(InvalidValue):
        validate_hostname("*.example.com", allow_wildcard=False)


def test_paths() -> None:
    for good in ["/", "/api/v1", "/a-b_c.d~e", "/caf%C3%A9", "/x;y=1,z:@!$&()*+"]:
        assert validate_path(good) == good
    for bad in ["", "api", "/a?b", "/%zz", "/%4", "/a<b", "/a|b", "/a^b", "/" + "a" * 1024, "/a[0]"]:
        with pytest.raises(InvalidValue):
            validate_path(bad)


def test_slugs() -> None:
    assert validate_slug("eu-west-1") == "eu-west-1"
    for bad in ["", "EU", "-a", "a-", "a_b", "a.b", "a" * 64]:
        with pytest.raises(InvalidValue):
            validate_slug(bad)


def test_ports_and_weights_are_real_integers_in_range() -> None:
    assert validate_port(1) == 1 and validate_port(65535) == 65535
    assert validate_weight(0) == 0 and validate_weight(256) == 256
    for bad in [0, 65536, -1, True, "80", 80.0, None]:
        with pytest.raises(InvalidValue) as excinfo:
            validate_port(bad)
        assert excinfo.value.code == "invalid_port"
    for bad in [-1, 257, False, "1"]:
        with pytest.raises(InvalidValue):
            validate_weight(bad)


def test_ips_come_back_canonical() -> None:
    assert validate_ip("127.0.0.1") == "127.0.0.1"
    assert validate_ip("0:0:0:0:0:0:0:1") == "::1"
    for bad in ["256.0.0.1", "example.com", "1.2.3", "::g", "127.0.0.1/8"]:
        with pytest.raises(InvalidValue):
            validate_ip(bad)


def test_redirect_urls() -> None:
    for good in ["https://example.com", "http://example.com:8080/a/b?x=1&y=%20z", "https://a.b/?q=/x?y"]:
        assert validate_redirect_url(good) == good
    for bad in [
        "ftp://example.com/",
        "//example.com/",
        "https://",
        "https://exa mple.com/",
        "https://example.com/#frag",
        "https://example.com:99999/",
        "https://-a.com/",
        "javascript:alert(1)",
        "https://example.com/" + "a" * 2048,
        "https://user@example.com/",
    ]:
        with pytest.raises(InvalidValue) as excinfo:
            validate_redirect_url(bad)
        assert excinfo.value.code == "invalid_redirect_url"


def test_messages_say_what_to_fix() -> None:
    with pytest.raises(InvalidValue) as excinfo:
        validate_path("/api\n")
    assert "forbidden character" in excinfo.value.message and "'\\n'" in excinfo.value.message
