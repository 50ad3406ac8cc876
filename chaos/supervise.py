"""One ``qcluster`` under the shipped supervision, as systemd would run it.

``Supervised`` runs ``retention-qcluster@<instance>`` the way the units in
``docs/deploy/`` do (read by ``chaos.units``): ``Restart=always`` after
``RestartSec``; the liveness unit's own command (``manage.py cleanup_health
--liveness``, plus ``--json`` for the figures) with the unit's environment,
``OnUnitInactiveSec`` after the previous check finished; on its failure a restart with the unit's stop
procedure (``harness.qcluster``: SIGTERM to the main process, SIGKILL to the
process group after ``TimeoutStopSec``, then the survivor check). Nothing
here decides that a cluster is wedged or asks for work: the check and the
cluster do. Each wedge is recorded with when it was detected, how long the
cluster had made no progress then, and when the restarted cluster's
heartbeat first showed progress.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from chaos.units import Supervision, supervision
from harness.qcluster import QCluster


@dataclass
class Wedge:
    instance: str
    detected_at: float  # time.monotonic()
    quiet_seconds: float  # no progress for this long when the check failed
    due_waiting_seconds: float  # the work it could take had waited this long
    detail: str
    waiting_messages: int | None = None  # in the cluster's queue, unfetched, at detection
    restarted_at: float | None = None
    restarted_wall: datetime | None = None
    recovered_at: float | None = None
    survivors: list[int] = field(default_factory=list)

    @property
    def recovery_seconds(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.detected_at

    @property
    def stuck_seconds(self) -> float:
        """How long the cluster had work it could take and made no progress when detected."""
        return min(self.quiet_seconds, self.due_waiting_seconds)

    @property
    def total_seconds(self) -> float | None:
        """From the start of the wedge (the later of its last progress and the work
        becoming due) to the restarted cluster's first progress."""
        recovery = self.recovery_seconds
        return None if recovery is None else self.stuck_seconds + recovery


class Supervised:
    def __init__(
        self,
        instance: str,
        env: Mapping[str, str],
        *,
        cwd: Path,
        python: str,
        log: Callable[[str], None],
        last_progress: Callable[[str], datetime | None],
        waiting_messages: Callable[[str], int | None],
    ) -> None:
        self.units: Supervision = supervision(instance)
        self.instance = instance
        self.env = {**env, **self.units.environment}
        self.cwd, self.python, self.log = cwd, python, log
        self._last_progress, self._waiting_messages = last_progress, waiting_messages
        self.started: list[QCluster] = []
        self.cluster = self._start()
        self.next_check = time.monotonic() + self.units.liveness_interval
        self.wedges: list[Wedge] = []
        self.exits = 0
        self.checks = 0
        self.stop_survivors: list[list[int]] = []

    def _start(self) -> QCluster:
        cluster = QCluster(self.env, cwd=self.cwd, python=self.python, log=self.log)
        self.started.append(cluster)
        return cluster

    @property
    def queue(self) -> str:
        return self.env.get("Q_CLUSTER_NAME", "")

    def run(self, stop: threading.Event) -> threading.Thread:
        """Supervise in a thread of its own until ``stop`` is set: each unit's timer is
        independent, as systemd runs them (one cluster's restart never delays
        another's check)."""

        def loop() -> None:
            from django.db import connections

            try:
                while not stop.wait(0.25):
                    self.tick()
            finally:
                connections.close_all()

        thread = threading.Thread(target=loop, name=f"supervise-{self.instance}", daemon=True)
        thread.start()
        return thread

    def tick(self) -> None:
        """Restart=always, the liveness timer and the recovery figures."""
        now = time.monotonic()
        if self.cluster.poll() is not None:
            self.exits += 1
            self.log(f"qcluster@{self.instance} exited ({self.cluster.returncode}): Restart=always")
            self.stop_survivors.append(self.cluster.stop(grace=0))  # its group: nothing may be left
            time.sleep(self.units.restart_delay)
            self.cluster = self._start()
        if now >= self.next_check:
            self._liveness()
            # OnUnitInactiveSec: from the end of the check and of any restart it did.
            self.next_check = time.monotonic() + self.units.liveness_interval
        for wedge in self.wedges:
            if wedge.recovered_at is None and wedge.restarted_wall is not None:
                progress = self._last_progress(self.instance)
                if progress is not None and progress > wedge.restarted_wall:
                    wedge.recovered_at = time.monotonic()
                    self.log(
                        f"qcluster@{self.instance} recovered: progress {wedge.recovery_seconds:.1f} s after detection"
                    )

    def _liveness(self) -> None:
        self.checks += 1
        argv = [self.python, *self.units.liveness_argv, "--json"]
        result = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=60)
        if result.returncode == 0:
            return
        detected = time.monotonic()
        try:
            report = json.loads(result.stdout.strip().splitlines()[-1])["checks"][-1]
        except (ValueError, IndexError, KeyError):
            report = {"detail": (result.stdout + result.stderr).strip()[-300:]}
        waited = float(report.get("due_work_waiting_seconds") or 0)
        wedge = Wedge(
            instance=self.instance,
            detected_at=detected,
            quiet_seconds=float(report.get("seconds_without_progress") or waited),
            due_waiting_seconds=waited,
            detail=str(report.get("detail")),
            waiting_messages=self._waiting_messages(self.queue),
        )
        self.wedges.append(wedge)
        self.log(
            f"liveness of qcluster@{self.instance} failed: {wedge.detail}; "
            f"{wedge.waiting_messages} messages waiting unfetched; restarting it"
        )
        wedge.survivors = self.cluster.stop(grace=self.units.stop_grace)
        self.stop_survivors.append(wedge.survivors)
        wedge.restarted_wall = datetime.now(UTC)
        self.cluster = self._start()
        wedge.restarted_at = time.monotonic()

    def shutdown(self) -> list[int]:
        """``systemctl stop``: the unit's stop procedure; returns the survivors."""
        survivors = self.cluster.stop(grace=self.units.stop_grace)
        self.stop_survivors.append(survivors)
        return survivors

    def kill_everything(self) -> None:
        for cluster in self.started:
            cluster.kill()


def heartbeat_host() -> str:
    return socket.gethostname()
