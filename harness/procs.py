"""Process helpers read from /proc: parents, children, process-group members, nice values."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None if the process is gone.

    Index 0 is the state, 1 the parent pid, 2 the process group, 11/12 utime/stime.
    The command name is skipped by its closing parenthesis because it may contain
    spaces and parentheses itself."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def pids() -> list[int]:
    return [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (for a qcluster: the sentinel; for the sentinel:
    workers, monitor, pusher)."""
    found = []
    for child in pids():
        fields = stat_fields(child)
        if fields and int(fields[1]) == pid:
            found.append(child)
    return found


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``.

    Zombies are left out: a worker orphaned by a killed sentinel is reaped by
    init, which in a container may never happen, and a zombie runs nothing."""
    found = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(pid)
    return found


def renice(pid: int, nice: int) -> None:
    """The process's nice value and, with autogroup scheduling (each session is a
    group that competes as a whole), its session group's nice value too."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass
