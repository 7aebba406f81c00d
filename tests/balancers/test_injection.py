"""Every string field that can ever reach haproxy.cfg refuses the injection corpus with a field error.

HAPROXY.md: `haproxy -c` accepts a path such as "/api }\\nbind ..." and a space in a path
silently adds a match-everything pattern, so the API is the defence.
"""

from __future__ import annotations

import pytest

from apps.balancers.models import Listener, Member, Pool, Route

CORPUS = [
    "/api\nbind :1",
    "/api\r\nx",
    "/a\u2028b",
    "/a\u2029b",
    "/a\x00b",
    "/a b",
    "/a#b",
    "/a{b",
    "/a}b",
    '/a"b',
    "/a'b",
    "/a\\b",
    "/a\tb",
    "/" + "a" * 10_000,
]


def _hostish(value: str) -> str:
    # The same hostile characters inside a hostname-shaped value.
    return "app" + value.lstrip("/") + ".acme.test"


def _cases(world):
    lb, pool = world.acme_lb, world.acme_pool
    route = {"lb": lb.pk, "hosts": ["acme.example.com"], "path": "/", "priority": 900,
             "targets": [{"pool": pool.pk, "weight": 100}]}
    return [
        ("/api/v1/routes/", "path", lambda v: {**route, "path": v}),
        ("/api/v1/routes/", "hosts", lambda v: {**route, "hosts": [_hostish(v)]}),
        ("/api/v1/routes/", "redirect_url",
         lambda v: {**route, "targets": [], "redirect_url": "https://acme.example.com" + v}),
        ("/api/v1/pools/", "name", lambda v: {"lb": lb.pk, "name": "p" + v.lstrip("/")}),
        ("/api/v1/pools/", "health_path", lambda v: {"lb": lb.pk, "name": "hp", "health_path": v}),
        ("/api/v1/members/", "name", lambda v: {"pool": pool.pk, "region": "us-east", "name": "m" + v.lstrip("/"),
                                                "address": "127.0.0.9", "port": 80}),
        ("/api/v1/members/", "address", lambda v: {"pool": pool.pk, "region": "us-east", "name": "mm",
                                                   "address": "127.0.0.9" + v, "port": 80}),
        ("/api/v1/listeners/", "name", lambda v: {"lb": lb.pk, "name": "l" + v.lstrip("/"), "port": 8081}),
        ("/api/v1/load-balancers/", "name", lambda v: {"name": "lb" + v.lstrip("/")}),
        ("/api/v1/hostname-claims/", "hostname",
         lambda v: {"hostname": _hostish(v).replace(".acme.test", ".newzone.test")}),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("value", CORPUS, ids=[repr(v[:12]) for v in CORPUS])
def test_injection_corpus_is_rejected_on_every_config_field(world, alice, value):
    before = (Route.objects.count(), Pool.objects.count(), Member.objects.count(), Listener.objects.count())
    for url, field, body in _cases(world):
        response = alice.client.post(url, body(value), format="json")
        assert response.status_code == 400, (url, field, value[:20], response.content[:200])
        payload = response.json()
        assert field in payload["fields"], (url, field, payload)
        assert payload["code"].startswith("invalid") or payload["code"] in {
            "max_length", "max_string_length", "null_characters_not_allowed"}
    after = (Route.objects.count(), Pool.objects.count(), Member.objects.count(), Listener.objects.count())
    assert before == after


@pytest.mark.django_db
def test_a_clean_value_passes_the_same_fields(world, alice):
    # Guard against a validator that refuses everything: the corpus test would pass vacuously.
    for index, (url, _field, body) in enumerate(_cases(world)):
        clean = body("/ok")
        if "priority" in clean:
            clean["priority"] = 900 + index
            clean["path"] = f"/ok{index}" if clean["path"] == "/" else clean["path"]
        if url.endswith("members/") and clean.get("address", "").endswith("/ok"):
            clean["address"] = "127.0.0.19"
        response = alice.client.post(url, clean, format="json")
        assert response.status_code == 201, (url, response.content[:300])
