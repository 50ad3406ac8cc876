"""CPU seconds a run costs: this process's tree (the loop, the drain child, the qcluster
processes) and our PostgreSQL's, read from /proc.

``snapshot`` records, for every live process under the roots, ``utime + stime + cutime +
cstime``: its own CPU plus that of children it has already reaped (PostgreSQL's
postmaster reaps its backends; this process reaps the drain child). ``delta`` adds up,
over the processes alive at the second snapshot, what each used since the first (all of
it for a process started in between). A process that went away in between counts
nothing: its CPU shows in its parent's ``cutime`` if the parent is ours, and a leftover
of an earlier run (a killed cluster's worker that init reaps) cannot make a delta
negative. The result is the CPU the run used across however many processes did the
work, less sensitive than wall seconds to the rest of the machine's load. The
benchmark's own polling (20 Hz) is included; it is small.
"""

from __future__ import annotations

import os
import time

from harness.procs import pids, stat_fields

_TICK = os.sysconf("SC_CLK_TCK")

Key = tuple[int, int]  # (pid, start time): a reused pid is another process
Snapshot = dict[Key, tuple[int, Key | None]]  # -> (clock ticks, parent's key)


def snapshot(roots: set[int], settle: float = 1.0) -> Snapshot:
    """The CPU of the live processes under ``roots``. An exited process not yet reaped by
    its (our) parent would be counted neither by itself nor in the parent's ``cutime``,
    so this waits up to ``settle`` seconds until no such zombie is left."""
    deadline = time.monotonic() + settle
    while True:
        parent: dict[int, int] = {}
        ticks: dict[int, tuple[int, int]] = {}
        zombies: set[int] = set()
        for pid in pids():
            fields = stat_fields(pid)
            if fields is None:
                continue
            parent[pid] = int(fields[1])
            if fields[0] == "Z":
                zombies.add(pid)
                continue
            # utime, stime, cutime, cstime; field 19 is the start time (tells a reused pid apart).
            ticks[pid] = (int(fields[19]), sum(int(fields[i]) for i in (11, 12, 13, 14)))
        out: Snapshot = {}
        ours_zombie = False
        for pid in [*ticks, *zombies]:
            p = pid
            while p > 1 and p not in roots:
                p = parent.get(p, 0)
            if p in roots:
                if pid in zombies:
                    ours_zombie = True
                else:
                    pp = parent.get(pid, 0)
                    parent_key = (pp, ticks[pp][0]) if pp in ticks else None
                    out[(pid, ticks[pid][0])] = (ticks[pid][1], parent_key)
        if not ours_zombie or time.monotonic() >= deadline:
            return out
        time.sleep(0.02)


def delta(before: Snapshot, after: Snapshot) -> float:
    """CPU used between the snapshots by the processes alive at ``after``. A process that
    was alive at ``before`` and has been reaped since by a parent that is still ours
    (PostgreSQL backends of an earlier run's connections, say) shows its whole life in
    that parent's ``cutime``: what it had used by ``before`` is taken off again."""
    used = sum(t - before.get(key, (0, None))[0] for key, (t, _parent) in after.items())
    gone = sum(t for key, (t, parent) in before.items() if key not in after and parent in after)
    return (used - gone) / _TICK
