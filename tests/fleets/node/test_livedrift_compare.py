"""How a live map is compared with the wanted one (apps.fleets.node.mapdelta.same_entries: drift checks, read-backs)."""

from __future__ import annotations

from apps.fleets.node.mapdelta import map_entries, same_entries


def lines(pairs: list[tuple[str, str]]) -> list[str]:
    """As `show map` prints them, each entry's reference cut off (StatsClient.show_map_lines)."""
    return [f"{key} {value}" for key, value in pairs]


def test_live_map_comparison_counts_every_entry_in_any_order() -> None:
    """Drift checks compare a node's live map with the wanted entries: order does not matter, a missing,
    extra, changed or repeated entry does."""
    wanted = [(f"/p{i}", f"v{i % 3}") for i in range(1000)]
    assert same_entries(lines(list(reversed(wanted))), wanted)
    assert not same_entries(lines(wanted[:-1]), wanted)
    assert not same_entries(lines([*wanted, ("/x", "v0")]), wanted)
    assert not same_entries(lines([*wanted[:-1], ("/p999", "v9")]), wanted)
    assert not same_entries(lines([*wanted[:-2], wanted[0], wanted[0]]), wanted)  # same length, one repeated
    repeated = [*wanted, wanted[0]]
    assert same_entries(lines(list(reversed(repeated))), repeated)
    assert not same_entries(lines([*wanted, wanted[1]]), repeated)


def test_the_map_file_gives_the_same_verdicts_as_the_entries() -> None:
    """Callers holding the map's file (a bundle's bytes) compare against its lines: every verdict above holds."""
    wanted = [(f"/p{i}", f"v{i % 3}") for i in range(1000)] + [("/empty", "")]
    content = "".join(f"{key} {value}\n" for key, value in wanted).encode()
    assert same_entries(lines(list(reversed(wanted))), wanted, content)
    assert same_entries(["/empty", *lines(wanted[:-1])], wanted, content)  # an empty value printed bare
    assert not same_entries(lines(wanted[:-1]), wanted, content)
    assert not same_entries(lines([*wanted, ("/x", "v0")]), wanted, content)
    assert not same_entries(lines([*wanted[:-2], ("/p999", "v9"), wanted[-1]]), wanted, content)
    assert not same_entries(lines([*wanted[:-2], wanted[0], wanted[0]]), wanted, content)
    repeated = [*wanted, wanted[0]]
    repeated_file = content + f"{wanted[0][0]} {wanted[0][1]}\n".encode()
    assert same_entries(lines(list(reversed(repeated))), repeated, repeated_file)
    assert not same_entries(lines([*wanted, wanted[1]]), repeated, repeated_file)


def test_values_with_spaces_or_none_read_back_as_written() -> None:
    wanted = [("/a", "deny 403 now"), ("/b", ""), ("/c", "p1")]
    assert map_entries(lines(wanted)) == wanted
    assert same_entries(["/b", "/c p1", "/a deny 403 now"], wanted)  # an empty value printed without its space
    assert not same_entries(["/b x", "/c p1", "/a deny 403 now"], wanted)


def test_the_readable_diff_names_each_missing_unexpected_and_changed_key_in_order() -> None:
    from apps.fleets.node.live import _map_lines

    wanted = [(f"/p{i:05d}", "a") for i in range(20_000)]
    live = [*wanted[:5], ("/p00005", "b"), *wanted[7:], ("/zz", "a")]  # /p00005 changed, /p00006 gone, /zz new
    assert _map_lines("m", live, wanted) == [
        "m: /p00005 -> b (should be a)", "m: missing /p00006 -> a", "m: unexpected /zz -> a"]
    assert _map_lines("m", [*wanted, wanted[0]], wanted) == ["m: duplicate keys live"]
