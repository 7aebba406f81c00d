"""Config documents cost the server bounded work, and every malformed one is a clear 400, never a 500."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from apps.configcode import parse

pytestmark = pytest.mark.django_db


def _alias_bomb(levels: int) -> str:
    """The billion-laughs shape: each level a list of nine aliases of the one before."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, levels + 1):
        lines.append(f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _post(persona, document, dry_run=True):
    return persona.client.post("/api/v1/apply/", {"document": document, "dry_run": dry_run}, format="json")


@pytest.mark.parametrize("levels", [6, 7, 9])
def test_a_yaml_alias_bomb_is_refused_before_it_expands(alice, levels):
    bomb = _alias_bomb(levels)
    assert len(bomb) < 800
    tracemalloc.start()
    started = time.monotonic()
    response = _post(alice, bomb)
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "yaml_alias"
    # Expanded, nine levels are 9**9 = 387M strings (minutes and gigabytes); refused, the request costs ~0.3 s under
    # tracemalloc. The bound leaves room for a machine of this kind at half speed beside a busy suite (1.17 s seen).
    assert elapsed < 5.0 and peak < 20 * 1024 * 1024, (elapsed, peak)


MALFORMED = {
    "targets as a string": {"routes": [{"lb": "web", "priority": 1, "targets": "api"}]},
    "targets as a list of ints": {"routes": [{"lb": "web", "priority": 1, "targets": [1, 2]}]},
    "targets as a mapping": {"routes": [{"lb": "web", "priority": 1, "targets": {"pool": "api"}}]},
    "targets without a pool": {"routes": [{"lb": "web", "priority": 1, "targets": [{"weight": 5}]}]},
    "a route without lb": {"routes": [{"priority": 1, "path": "/"}]},
    "a route with a text priority": {"routes": [{"lb": "web", "priority": "ten"}]},
    "a member without pool": {"members": [{"lb": "web", "name": "m1"}]},
    "a pool region without pool": {"pool_regions": [{"lb": "web", "region": "eu"}]},
    "a capacity test whose pool is a number": {"capacity_tests": [{"name": "t", "pool": 5}]},
    "a capacity test whose pool has no lb": {"capacity_tests": [{"name": "t", "pool": "api"}]},
    "a listener whose certificate is a list": {"listeners": [{"lb": "web", "name": "l", "certificate": ["x"]}]},
    "a section that is a mapping": {"pools": {"lb": "web", "name": "api"}},
    "a name that is a mapping": {"load_balancers": [{"name": {"x": 1}}]},
    "a document that is a list": [1, 2, 3],
}
MALFORMED_YAML = {
    "nan": "load_balancers:\n- name: web\n  weight: .nan\n",
    "inf": "load_balancers:\n- name: web\n  weight: .inf\n",
    "an int key": "load_balancers:\n- 1: web\n",
    "a null key": "load_balancers:\n- ~: web\n",
    "a bool key": "load_balancers:\n- true: web\n",
    "binary": "load_balancers:\n- name: !!binary aGVsbG8=\n",
    "a set": "load_balancers: !!set {a, b}\n",
    "a python object": "load_balancers: !!python/object:os.system ls\n",
    "nested 3,000 deep": "a: " + "[" * 3000 + "]" * 3000 + "\n",
    "nested mappings 3,000 deep": "a: " + "{k: " * 3000 + "1" + "}" * 3000 + "\n",
    "nested block mappings 300 deep": "".join(f"{' ' * i}k:\n" for i in range(300)),
    "not yaml": "load_balancers: [\n",
    "not utf-8 text": "\udcff",
}


@pytest.mark.parametrize("document", list(MALFORMED.values()), ids=list(MALFORMED))
@pytest.mark.parametrize("dry_run", [True, False], ids=["plan", "apply"])
def test_a_malformed_document_is_a_400_naming_what_is_wrong(alice, document, dry_run):
    if isinstance(document, dict):
        document = {**document, "etag": "*"}
    response = alice.client.post("/api/v1/apply/", {"document": document, "dry_run": dry_run}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] != "server_error" and response.json()["detail"]


@pytest.mark.parametrize("text", list(MALFORMED_YAML.values()), ids=list(MALFORMED_YAML))
def test_a_malformed_yaml_document_is_a_400_naming_what_is_wrong(alice, text):
    response = alice.client.generic("POST", "/api/v1/apply/",
                                    json.dumps({"document": text, "dry_run": True}, ensure_ascii=True),
                                    content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] in ("yaml_tag_not_allowed", "invalid_key", "invalid_number", "document_too_deep",
                                       "invalid_document", "parse_error"), response.json()


def test_a_number_too_long_to_read_is_refused_by_name_not_a_500(alice):
    with pytest.raises(parse.ParseRefused) as refused:
        parse.load("port: " + "9" * 5000 + "\n")
    assert refused.value.code == "invalid_number"
    response = alice.client.generic("POST", "/api/v1/apply/", json.dumps({"document": "x: " + "1" * 5000,
                                                                            "dry_run": True}),
                                    content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "invalid_number", response.content


def test_an_unquoted_date_stays_the_text_it_is():
    assert parse.load("start_at: 2026-12-01T00:00:00Z\n") == {"start_at": "2026-12-01T00:00:00Z"}


def test_a_large_but_honest_document_still_loads():
    rows = "".join(f"- lb: web\n  priority: {n}\n  path: /p{n}\n" for n in range(20_000))
    assert len(parse.load("routes:\n" + rows)["routes"]) == 20_000


def test_a_body_over_the_limit_is_a_413_not_a_500(alice, settings):
    """A 200k-host list (3.2 MB) to POST /routes/ answered 500."""
    body = json.dumps({"lb": 1, "path": "/", "hosts": [f"h{n}.acme.example" for n in range(200_000)]})
    assert len(body) > 3_000_000
    response = alice.client.generic("POST", "/api/v1/routes/", body, content_type="application/json")
    assert response.status_code == 413, response.content[:300]
    assert response.json()["code"] == "request_too_large"
    settings.API_MAX_BODY_BYTES = 10_000_000  # even when the limit lets it through, the answer is a 400
    response = alice.client.generic("POST", "/api/v1/routes/", body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
