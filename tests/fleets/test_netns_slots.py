"""Namespace topologies that run at once (the lead's whole suite and a targeted run of the same module,
or a benchmark) never share a name or a subnet, and a run that died leaves its slot free (tests/netns.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests import netns


def names(topo: netns.Topology) -> set[str]:
    return {topo.bridge, *(h.netns for h in topo.hosts), *(h.veth for h in topo.hosts)}


def test_two_live_topologies_of_one_prefix_share_no_name_or_subnet(tmp_path: Path) -> None:
    a = netns.Topology(prefix="s15z", subnet=100, count=3, base=tmp_path / "a")
    b = netns.Topology(prefix="s15z", subnet=100, count=3, base=tmp_path / "b")
    try:
        assert not names(a) & names(b)
        assert a.network != b.network and a.vip(1) != b.vip(1)
        # Every interface name fits the kernel's 15 characters, the veth's peer ("...p") included.
        assert all(len(n) <= 15 for n in names(a) | {f"{h.veth}p" for h in a.hosts})
        assert all(len(Path(h.haproxy_bin).name) <= 15 for h in a.hosts)  # track_process follows the comm
    finally:
        a.down()
        b.down()
    again = netns.Topology(prefix="s15z", subnet=100, count=3, base=tmp_path / "c")
    try:
        assert again.slot == a.slot  # down() gave the slot back
    finally:
        again.down()


def test_a_slot_held_by_another_process_is_skipped_and_freed_when_it_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, '.'); from tests import netns; "
         "slot, fd = netns.claim_slot('s15y'); print(slot, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        held = int(holder.stdout.readline())
        mine = netns.Topology(prefix="s15y", subnet=100, count=1, base=tmp_path / "m")
        assert mine.slot != held
        mine.down()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.05)
    after = netns.Topology(prefix="s15y", subnet=100, count=1, base=tmp_path / "n")
    try:
        assert after.slot == held  # the kernel dropped the dead process's lock
    finally:
        after.down()
