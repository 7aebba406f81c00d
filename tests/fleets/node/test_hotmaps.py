"""Which map changes a node takes key by key (apps.fleets.node.mapdelta) and which it takes as a whole-map swap."""

from __future__ import annotations

from apps.fleets.node.mapdelta import MAX_DELTA_KEYS, MapDelta, map_delta, parse_get_map

OLD = [("a.t/x?", "p1"), ("a.t/y/", "p2"), ("a.t/z/", "u3")]


def test_a_route_change_is_the_keys_it_added_changed_and_removed() -> None:
    new = [("a.t/x?", "p1"), ("a.t/y/", "p9"), ("b.t/", "p2")]
    assert map_delta("maps/web.http.routes.map", OLD, new) == MapDelta(
        added=(("b.t/", "p2"),), changed=(("a.t/y/", "p9"),), removed=("a.t/z/",))
    assert len(map_delta("maps/web.http.routes.map", OLD, OLD)) == 0


def test_order_dependent_duplicate_key_or_large_changes_are_swapped_whole() -> None:
    assert map_delta("maps/web.http.wildcards.map", [(".b.t", "*.b.t")], []) is None  # map_end: order matters
    assert map_delta("maps/web.http.routes.map", OLD, [*OLD, ("a.t/x?", "p2")]) is None  # a key twice
    many = [(f"h{i}.t/", "p1") for i in range(MAX_DELTA_KEYS + 1)]
    assert map_delta("maps/web.http.routes.map", OLD, OLD + many) is None


def test_get_map_answers_are_read_as_the_matched_entry() -> None:
    found = 'type=beg, case=sensitive, found=yes, idx=tree, key="a.t/y/", value="p2", type="str"\n'
    assert parse_get_map(found) == ("a.t/y/", "p2")
    assert parse_get_map("type=beg, case=sensitive, found=no\n") is None
