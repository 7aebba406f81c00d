"""Property-based fuzz of config-as-code documents against a live Spillway (hypothesis, over HTTP).

Shared by the suite's bounded run (tests/configcode/test_fuzz_live.py) and `make bench-fuzz`. Every case is
one POST /api/v1/apply/ (a plan or an apply, as the case says) with a document drawn from:

- the real export of an org, edited: a section, row or field replaced by any JSON value, rows added with
  known and unknown keys, keys dropped, references pointed at names that exist elsewhere or nowhere;
- documents of any JSON shape;
- YAML text: the export as YAML, edited as text, and the hostile shapes (aliases, anchors, tags, deep
  nesting, non-text keys, .nan/.inf, dates, control characters).

The property: no answer is a server error (5xx), and every 4xx is the documented JSON error shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import requests
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEYS = ["name", "lb", "pool", "region", "priority", "targets", "hosts", "path", "path_match", "redirect_url",
        "weight", "address", "port", "admin_state", "protocol", "default_pool", "certificate", "kind", "params",
        "cron", "schedule_type", "steps", "listener", "route", "max_rate_per_member", "capacity_scaler",
        "algorithm", "org", "etag", "version", "interval_s", "timezone", "enabled", "health_path"]
SECTIONS = ["load_balancers", "pools", "pool_regions", "members", "listeners", "routes", "capacity_tests", "jobs"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=40), st.sampled_from(["web", "api", "/", "eu-west",
                    "web/api", "web/10", "*", "", "x" * 300, "a\x00b", "\u202e", "../..", "0 3 * * *"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=10)), inner,
                                                 max_size=5)), max_leaves=12)
rows = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=8)

HOSTILE_YAML = [
    "a: &a [1,2]\nb: *a\n", "load_balancers: !!binary aGk=\n", "x: !!python/object:os.system ls\n",
    "a: " + "[" * 200 + "]" * 200, "load_balancers:\n- 1: web\n", "pools:\n- name: .nan\n", "? [a]\n: b\n",
    "jobs:\n- name: j\n  start_at: 2026-12-01T00:00:00Z\n", "load_balancers: {name: web}\n", "--- 1\n--- 2\n",
    "\t: x", "%TAG ! tag:evil:\n--- !x 1\n", "a: !!set {x, y}\n", "a: 0x1F\nb: 0o17\nc: 1_000\n",
]


@dataclass
class Tally:
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    shape_errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"RESULT config_cases={self.cases} config_server_errors={len(self.server_errors)} "
                f"config_shape_errors={len(self.shape_errors)}")


def _edit(doc: dict[str, Any], data: st.DataObject) -> Any:
    """One of several edits of a real export."""
    doc = json.loads(json.dumps(doc))
    how = data.draw(st.sampled_from(["field", "row", "section", "drop", "add", "reference", "whole"]))
    section = data.draw(st.sampled_from(SECTIONS))
    items = doc.get(section) or []
    if how == "field" and items:
        row = items[data.draw(st.integers(0, len(items) - 1))]
        row[data.draw(st.sampled_from([*row.keys(), *KEYS]))] = data.draw(json_values)
    elif how == "row" and items:
        items[data.draw(st.integers(0, len(items) - 1))] = data.draw(json_values)
    elif how == "section":
        doc[section] = data.draw(json_values)
    elif how == "drop" and items:
        row = items[data.draw(st.integers(0, len(items) - 1))]
        if row:
            row.pop(data.draw(st.sampled_from(sorted(row))), None)
    elif how == "add":
        doc.setdefault(section, [])
        if isinstance(doc[section], list):
            doc[section].append(data.draw(rows))
    elif how == "reference" and items:
        row = items[data.draw(st.integers(0, len(items) - 1))]
        key = data.draw(st.sampled_from(["lb", "pool", "default_pool", "certificate", "listener", "route", "region"]))
        row[key] = data.draw(st.sampled_from(["globex-lb", "edge", "web", "nope", "globex-lb/web", "web/999",
                                              "acme-cert", "globex-cert", "eu-west", "mars"]))
    elif how == "whole":
        return data.draw(json_values)
    return doc


def run(base_url: str, token: str, org: str, examples: int, seed: int = 0) -> Tally:
    """Fuzz `examples` cases against `base_url` as `token`, applying into `org`."""
    tally = Tally()
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    # A fresh connection per case: a kept-alive one the server closes while idle would fail the next case on
    # the client's side (RemoteDisconnected), which says nothing about the server.
    session.headers["Connection"] = "close"
    export = session.get(f"{base_url}/api/v1/export/", params={"org": org}, timeout=30).json()

    def post(document: Any, dry_run: bool, as_text: bool) -> None:
        body = {"document": document if not as_text else (document if isinstance(document, str)
                                                          else yaml.safe_dump(document)), "dry_run": dry_run}
        headers = {"If-Match": "*"} if not dry_run else {}
        reply = None
        for _ in range(2):  # a connection the test server drops before reading the request is the client's luck
            try:
                reply = session.post(f"{base_url}/api/v1/apply/", params={"org": org}, json=body, headers=headers,
                                     timeout=60)
                break
            except ValueError:  # a body requests itself cannot encode: not a case the server sees
                return
            except requests.ConnectionError as exc:
                error = exc
        if reply is None:
            tally.cases += 1
            tally.server_errors.append(f"no answer twice ({error}) <- {json.dumps(body)[:300]}")
            return
        tally.cases += 1
        tally.by_status[reply.status_code] = tally.by_status.get(reply.status_code, 0) + 1
        sample = json.dumps(body)[:300]
        if reply.status_code >= 500:
            tally.server_errors.append(f"{reply.status_code} {sample}")
        elif reply.status_code >= 400:
            try:
                error = reply.json()
                assert isinstance(error["code"], str) and isinstance(error["detail"], str)
                assert isinstance(error["fields"], dict)
            except Exception:
                tally.shape_errors.append(f"{reply.status_code} {reply.text[:200]} <- {sample}")

    @hypothesis.seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["edited", "edited_yaml", "any", "hostile_yaml", "text"]))
        dry_run = data.draw(st.booleans())
        if kind == "edited":
            post(_edit(export, data), dry_run, as_text=False)
        elif kind == "edited_yaml":
            post(_edit(export, data), dry_run, as_text=True)
        elif kind == "any":
            post(data.draw(json_values), dry_run, as_text=False)
        elif kind == "hostile_yaml":
            post(data.draw(st.sampled_from(HOSTILE_YAML)), dry_run, as_text=True)
        else:
            text = yaml.safe_dump(export)
            cut = data.draw(st.integers(0, len(text)))
            post(text[:cut] + data.draw(st.text(max_size=20)) + text[cut:], dry_run, as_text=True)

    case()
    return tally
