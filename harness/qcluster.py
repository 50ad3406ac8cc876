"""Supervise a real ``manage.py qcluster``: start it in its own process group, wait until its
workers are ready, sample their peak RSS, find (and kill) its worker-side processes, and stop
it so that no process of it survives.

django-q2's process tree is qcluster (main) -> sentinel -> workers, monitor, pusher. The
cluster runs in its own session, so its process group is the main process's pid and
``os.killpg`` reaches workers even after their sentinel has died (they are then orphans
outside our process tree).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from harness.procs import children, group_members, renice


def _stderr_log(message: str) -> None:
    print(f"[qcluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class QCluster:
    """A ``manage.py qcluster`` started in ``cwd`` with ``env``; started by the constructor.

    ``workers`` sets ``Q_WORKERS`` (and is what ``wait_ready`` waits for). With ``log_path``
    its output goes there, and worker pids come from its INFO log ("ready for work at
    PID"), so pass ``LOG_LEVEL=INFO`` in ``env`` to use ``wait_ready``/``sample_rss``;
    without it the output is discarded."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        cwd: Path,
        workers: int | None = None,
        log_path: Path | None = None,
        nice: int = 0,
        python: str = sys.executable,
        log: Callable[[str], None] = _stderr_log,
    ) -> None:
        self.workers = workers
        self.log_path = log_path
        self.log = log
        self.log_file: IO[str] | None = log_path.open("w") if log_path else None
        run_env = dict(env)
        if workers is not None:
            run_env["Q_WORKERS"] = str(workers)
        self.proc = subprocess.Popen(
            [python, "manage.py", "qcluster"],
            cwd=cwd,
            env=run_env,
            stdout=self.log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self.log_file else subprocess.DEVNULL,
            start_new_session=True,
        )
        if nice:
            renice(self.proc.pid, nice)  # its own session, so its own autogroup
        self.worker_pids: list[int] = []
        self.peak_kb: dict[int, int] = {}

    @property
    def pid(self) -> int:
        """The main process's pid, which is also the cluster's process group."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else "(qcluster output discarded)"

    def _scan_log(self) -> str:
        text = self.log_text()
        for pid in map(int, re.findall(r"ready for work at (\d+)", text)):
            if pid not in self.worker_pids:
                self.worker_pids.append(pid)
        return text

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the cluster logged "running." and all ``workers`` reported ready."""
        if self.log_path is None or self.workers is None:
            raise RuntimeError("wait_ready needs log_path and workers (and LOG_LEVEL=INFO)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"qcluster exited early:\n{self.log_text()}")
            text = self._scan_log()
            if "running." in text and len(self.worker_pids) >= self.workers:
                time.sleep(0.5)  # let the pusher start polling
                return
            time.sleep(0.1)
        raise RuntimeError(f"qcluster not ready after {timeout} s:\n{self.log_text()}")

    def sample_rss(self) -> None:
        """Record each worker's peak RSS so far (VmHWM) in ``peak_kb``."""
        self._scan_log()
        for pid in self.worker_pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            match = re.search(r"VmHWM:\s+(\d+) kB", status)
            if match:
                self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), int(match.group(1)))

    def worker_side_pids(self) -> list[int]:
        """The sentinel's children: workers, and the pusher and monitor it reincarnates.
        (The sentinel itself is the cluster's supervisor.)"""
        return [pid for sentinel in children(self.proc.pid) for pid in children(sentinel)]

    def survivors(self) -> list[int]:
        """Processes of the cluster's group still alive (zombies excluded)."""
        return group_members(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the whole process group now (a wedged cluster; whatever a stopped or dead
        cluster left behind, such as workers orphaned by a killed sentinel)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.log_file:
            self.log_file.close()

    def stop(self, grace: float = 30.0) -> list[int]:
        """SIGTERM to the main process (django-q2 then stops its workers), and after up to
        ``grace`` seconds SIGKILL to whatever is left of the group. Returns the pids that
        still survived that (normally none)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.log(f"qcluster did not stop on SIGTERM within {grace:g} s; killing its process group")
        self.kill()
        deadline = time.monotonic() + 5.0
        while (left := self.survivors()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            self.log(f"qcluster processes survived SIGKILL: {left}")
        return left
