"""revision_diff matches sections separately (fast on 100k-route texts); its diff must still turn the old
text into the new one, hunk by hunk, on random edits around map section titles."""

from __future__ import annotations

import difflib
import random

from apps.fleets.config.stored import revision_diff, strip_header

HEADER = "# a\n# b\n# c\n\n"


def patched(old: list[str], diff: str) -> list[str]:
    """`old` with the unified diff applied (its hunk headers give where each hunk starts)."""
    out, at = [], 0
    for line in diff.splitlines(keepends=True)[2:]:
        if line.startswith("@@"):
            start, _, count = line.split()[1][1:].partition(",")
            begin = int(start) if count == "0" else int(start) - 1
            out += old[at:begin]
            at = begin
        elif line[0] == " ":
            out.append(line[1:])
            at += 1
        elif line[0] == "-":
            at += 1
        else:
            out.append(line[1:])
    return out + old[at:]


def test_the_diff_turns_the_old_text_into_the_new_one() -> None:
    rng = random.Random(14)
    differs_from_difflib = 0
    for _ in range(2000):
        old = [f"l{rng.randrange(30)}\n" for _ in range(rng.randrange(0, 40))]
        for k in range(rng.randrange(0, 4)):
            old.insert(rng.randrange(len(old) + 1), f"# ---- maps/m{k}.map ----\n")
        new = list(old)
        for _ in range(rng.randrange(0, 5)):
            roll = rng.random()
            if roll < 0.4 and new:
                del new[rng.randrange(len(new))]
            elif roll < 0.8:
                new.insert(rng.randrange(len(new) + 1), f"n{rng.randrange(30)}\n")
            elif new:
                new[rng.randrange(len(new))] = f"r{rng.randrange(9)}\n"
        diff = revision_diff(HEADER + "".join(old), HEADER + "".join(new), "old", "new")
        assert patched(old, diff) == new, diff
        assert bool(diff) == (old != new)
        reference = "".join(difflib.unified_diff(old, new, fromfile="old", tofile="new", n=3))
        differs_from_difflib += diff != reference
    assert differs_from_difflib < 200, "mostly the very same text as difflib's"


def test_a_one_route_change_in_a_large_map_is_a_small_hunk() -> None:
    body = "frontend fe\n" + "\n# ---- maps/r.map ----\n" + "".join(f"h{i}/ p1\n" for i in range(50_000))
    after = body.replace("h25000/ p1\n", "h25000/ p1\nh25000/x/ u7\n")
    diff = revision_diff(HEADER + body, HEADER + after, "r1", "r2")
    assert diff.count("\n") == 2 + 1 + 7 and "+h25000/x/ u7\n" in diff
    assert patched(strip_header(HEADER + body).splitlines(keepends=True), diff) == after.splitlines(keepends=True)
