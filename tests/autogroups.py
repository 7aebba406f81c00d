"""Whether this machine lets a test run set a session of processes ahead of the others (the standard library only:
scripts/test-workers asks it before the suite's virtualenv is in use).

Linux shares the CPU between sessions first (autogroups: sched_autogroup_enabled), then between the processes of a
session by their nice. Setting a session below nice 0 takes CAP_SYS_NICE (root on CI's machines)."""

from __future__ import annotations

CAP_SYS_NICE = 23


def can_boost() -> bool:
    """Whether this machine lets the suite set a session ahead of the others."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as handle:
            if handle.read().strip() != "1":
                return False
        with open("/proc/self/status") as handle:
            caps = next(line for line in handle if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> CAP_SYS_NICE & 1)
