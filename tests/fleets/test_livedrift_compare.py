"""How a drift check compares a node's live map with the wanted one (apps.fleets.livedrift.same_entries)."""

from __future__ import annotations

from apps.fleets.livedrift import same_entries


def test_live_map_comparison_counts_every_entry_in_any_order() -> None:
    """Drift checks compare a node's live map with the wanted entries (livedrift.same_entries): order does not
    matter, a missing, extra, changed or repeated entry does."""
    wanted = [(f"/p{i}", f"v{i % 3}") for i in range(1000)]
    assert same_entries(list(reversed(wanted)), wanted)
    assert not same_entries(wanted[:-1], wanted)
    assert not same_entries([*wanted, ("/x", "v0")], wanted)
    assert not same_entries([*wanted[:-1], ("/p999", "v9")], wanted)
    assert not same_entries([*wanted[:-2], wanted[0], wanted[0]], wanted)  # same length, one repeated
    repeated = [*wanted, wanted[0]]
    assert same_entries(list(reversed(repeated)), repeated)
    assert not same_entries([*wanted, wanted[1]], repeated)
