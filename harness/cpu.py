"""CPU used by other processes on a shared machine while something is being measured."""

from __future__ import annotations

import os
import threading
import time

from harness.procs import pids, stat_fields


class CpuWatch(threading.Thread):
    """Samples /proc once a second and adds up the CPU time of processes that are
    not ours (not this process's descendants, not our PostgreSQL's). The machine is
    shared: another engineer's test run during a measurement shows up here.

    Add further roots (a postmaster, which is not our child once pg_ctl exits) to
    ``own_roots`` before ``start()``."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="cpu-watch")
        self.own_roots = {os.getpid()}
        self.foreign_seconds = 0.0
        self.last_foreign_cores = 0.0
        self._prev: dict[int, int] = {}
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _sample() -> tuple[dict[int, int], dict[int, int]]:
        cpu, parent = {}, {}
        for pid in pids():
            fields = stat_fields(pid)
            if fields is None:
                continue
            parent[pid] = int(fields[1])
            cpu[pid] = int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        return cpu, parent

    def _foreign(self, parent: dict[int, int]) -> set[int]:
        ours: set[int] = set()
        for pid in parent:
            seen, p = [], pid
            while p > 1 and p not in ours and p not in self.own_roots:
                seen.append(p)
                p = parent.get(p, 0)
            if p in ours or p in self.own_roots:
                ours.update(seen)
                ours.add(p)
        return set(parent) - ours

    def run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                cpu, parent = self._sample()
                foreign = self._foreign(parent)
                delta = sum(cpu[p] - self._prev.get(p, 0) for p in foreign)  # a new process: all its CPU
                if self._prev:
                    self.foreign_seconds += delta / self._tick
                    self.last_foreign_cores = delta / self._tick
                self._prev = cpu
            except Exception:  # noqa: S112 - a sampling hiccup must never stop the measurement
                continue

    def stop(self) -> None:
        self._stop.set()

    def wait_idle(self, max_wait: float, threshold: float = 0.25) -> float:
        """Wait (up to ``max_wait`` s) until other processes use < ``threshold`` cores for 3 s."""
        started = time.monotonic()
        quiet = 0
        while time.monotonic() - started < max_wait and quiet < 3:
            time.sleep(1.0)
            quiet = quiet + 1 if self.last_foreign_cores < threshold else 0
        return time.monotonic() - started
