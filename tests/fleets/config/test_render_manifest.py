"""The render manifest says what the text holds, so consumers never parse the text back.

The tests read the text here (the oracle) and hold the manifest to it: binds, frontends, backends,
map entries, and the owner of every line. Consumers (delivery, validation, hot-map detection, the
customer preview) read only the manifest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apps.fleets.config.render import render
from apps.fleets.config.render.frontends import map_bucket, routes_map_files, routes_map_name
from apps.fleets.config.spec import NodeSpec, VrrpSpec
from apps.fleets.config.stored import display_lines
from apps.fleets.node.apply import bundle_binds, bundle_proxies, floating_binds
from apps.fleets.node.hotchanges import hot_changes
from tests.fleets.config.renderkit import NODE, RULE_FORM, listener, pool, rich_snapshot, route, snapshot

VRRP = VrrpSpec(interface="eth0", address="10.215.9.11", priority=254, peers=("10.215.9.12",))


def _text_binds(text: str) -> set[tuple[str, int, bool]]:
    found = re.findall(r"^\s*bind (\[[0-9a-fA-F:.]+\]|[0-9.]+):(\d+)( transparent)?", text, re.MULTILINE)
    return {(address.strip("[]"), int(port), bool(transparent)) for address, port, transparent in found}


@pytest.mark.parametrize("threshold", [0, RULE_FORM])
@pytest.mark.parametrize("node", [NODE, NodeSpec(name="n2", runtime_dir="/run/n2", vrrp=VRRP),
                                  NodeSpec(name="n3", runtime_dir="/run/n3", bind_address="127.0.0.9")])
def test_the_manifest_names_every_bind_proxy_and_map_entry_the_text_holds(node, threshold) -> None:
    snap = rich_snapshot()
    snap = type(snap)(fleet=snap.fleet, region=snap.region, revision=1, pools=snap.pools, listeners=(
        *snap.listeners, listener(9090, id=4, name="v6", address="2001:db8::5", default_pool_id=3)))
    bundle = render(snap, node, route_map_threshold=threshold)
    facts = bundle.manifest
    text = bundle.main

    assert {(b.address, b.port, b.floating) for b in facts.binds} == _text_binds(text)
    assert bundle_binds(bundle) == sorted({(a, p) for a, p, _ in _text_binds(text)})
    assert floating_binds(bundle) == {(a, p) for a, p, f in _text_binds(text) if f}
    assert (node.vrrp is not None) == bool(floating_binds(bundle))
    assert bundle_proxies(bundle) == (sorted(re.findall(r"^frontend (\S+)", text, re.MULTILINE)),
                                      sorted(re.findall(r"^backend (\S+)", text, re.MULTILINE)))
    maps = {name for name in bundle.files if name.startswith("maps/")}
    assert set(facts.maps) == maps
    for name in maps:
        assert [f"{k} {v}" for k, v in facts.maps[name]] == bundle.files[name].decode().splitlines()
        assert len(facts.map_owners[name]) == len(facts.maps[name])
    assert bundle.body == text.split("\n\n", 1)[1]
    assert text[facts.header_len:].startswith("global\n")
    lines = bundle.body.split("\n")
    assert all(facts.runtime_dir in lines[i] for i in facts.runtime_lines)
    assert sum(facts.runtime_dir in line for line in lines) == len(facts.runtime_lines)


@pytest.mark.parametrize("threshold", [0, RULE_FORM])
def test_every_line_is_owned_by_the_route_or_pool_it_is_about(threshold) -> None:
    bundle = render(rich_snapshot(), NODE, route_map_threshold=threshold)
    lines, owners = display_lines(bundle)
    assert len(lines) == len(owners)
    section_pool = None
    for line, owner in zip(lines, owners, strict=True):
        if not line.startswith(" "):
            match = re.match(r"backend p(\d+)_", line)
            section_pool = int(match.group(1)) if match else None
        if section_pool is not None and line:
            assert owner is not None and owner.pools == (section_pool,), line
        if match := re.search(r"# route (\d+)$|acl r(\d+)_host", line):
            assert owner is not None and owner.route == int(match.group(1) or match.group(2)), line
        if match := re.search(r"# pool (\d+) \(|str\(p(\d+)\) if !\{ var\(txn.rk\) -m found \}$", line):
            assert owner is not None and owner.pools == (int(match.group(1) or match.group(2)),), line
        if line.startswith(("global", "defaults", "    timeout")):
            assert owner is None, line


def test_a_routes_map_entry_is_owned_by_its_host_class_and_its_action() -> None:
    routes = (route(1, 1, "/a", 1, hosts=("a.example.com",)), route(2, 2, "/ops", 2),
              route(3, 3, "/old", hosts=("a.example.com",), redirect="https://example.com/new"))
    bundle = render(snapshot((listener(8080, routes),), (pool(1, {"eu": ()}), pool(2, {"eu": ()}))), NODE)
    facts = bundle.manifest
    owned = {key: (o.host, o.route, o.pools, o.action) for name in routes_map_files("maps/web.http")
             for (key, _), o in zip(facts.maps[name], facts.map_owners[name], strict=True)}
    assert owned["a.example.com/a/"] == ("a.example.com", None, (1,), "p1")
    # The any-host route is listed once, under `*` (looked up when a host's own class has no match).
    assert "a.example.com/ops/" not in owned
    assert owned["*/ops/"] == ("*", None, (2,), "p2")
    assert owned["a.example.com/old?"] == ("a.example.com", 3, (), "u3")
    hosts = facts.map_owners["maps/web.http.hosts.map"]
    assert [o.host for o in hosts] == ["a.example.com"]


def test_a_route_change_is_a_hot_map_change_read_from_the_manifest() -> None:
    pools = (pool(1, {"eu": ()}),)
    before = render(snapshot((listener(8080, (route(1, 1, "/a", 1),)),), pools), NODE)
    after = render(snapshot((listener(8080, (route(1, 1, "/a", 1), route(2, 2, "/b", 1))),), pools, 2), NODE)
    changes = hot_changes(before, after)
    assert changes is not None and not changes.certs
    any_host = routes_map_name("maps/web.http", map_bucket("*"))
    assert changes.maps == {any_host: after.manifest.maps[any_host]}
    assert ("*/b/", "p1") in changes.maps[any_host]


def test_no_consumer_of_rendered_config_imports_re() -> None:
    """The modules that read a render's output learn what they need from the manifest, not by regex.
    (validate.py still reads `ss` output, HAProxy's neighbours' words, with one.)"""
    root = Path(__file__).resolve().parents[3] / "apps" / "fleets"
    for module in ("node/apply.py", "config/stored.py", "config/preview.py", "node/live.py"):
        source = (root / module).read_text()
        assert not re.search(r"^import re$|^from re import", source, re.MULTILINE), module


@pytest.mark.parametrize("after,hot", [
    ({"m1": dict(weight=7)}, {("p1_eu", "m1"): ("active", 7)}),
    ({"m1": dict(state="drain")}, {("p1_eu", "m1"): ("drain", 100)}),
    ({"m1": dict(state="maint"), "m2": dict(weight=3)},
     {("p1_eu", "m1"): ("maint", 100), ("p1_eu", "m2"): ("active", 3)}),
    ({"m1": dict(port=9999)}, None),  # a new address or port is a new server: a reload
], ids=["weight", "drain", "maint-and-weight", "port"])
def test_a_member_state_or_weight_change_is_a_hot_server_change_read_from_the_manifest(after, hot) -> None:
    from tests.fleets.config.renderkit import member

    def bundle(changes: dict, revision: int):
        members = tuple(member(name, changes.get(name, {}).get("port", port),
                               **{k: v for k, v in changes.get(name, {}).items() if k != "port"})
                        for name, port in (("m1", 8001), ("m2", 8002)))
        return render(snapshot((listener(8080, (route(1, 1, "/a", 1),)),), (pool(1, {"eu": members}),), revision),
                      NODE)

    changes = hot_changes(bundle({}, 1), bundle(after, 2))
    if hot is None:
        assert changes is None
    else:
        assert changes is not None and changes.servers == hot and not changes.certs
