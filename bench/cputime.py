"""CPU seconds a run costs: this process's tree (the loop, the drain child, the qcluster
processes) and our PostgreSQL's, read from /proc.

For every live process under the roots it adds ``utime + stime + cutime + cstime``:
a process's own CPU, plus that of children it has already reaped, so every tick is
counted once whether the process that used it is still alive or not (PostgreSQL's
postmaster reaps its backends; django-q's sentinel joins its workers). The difference
between two samples is the CPU the run used, across however many processes did the work
and whatever other load the machine had (which shows in wall seconds, less in these).
The benchmark's own polling (20 Hz) is included; it is small.
"""

from __future__ import annotations

import os

from harness.procs import pids, stat_fields

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(roots: set[int]) -> float:
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields is None:
            continue
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
    total = 0
    for pid, t in ticks.items():
        p = pid
        while p > 1 and p not in roots:
            p = parent.get(p, 0)
        if p in roots:
            total += t
    return total / _TICK
