#!/usr/bin/env python
"""The two fleet modes side by side: warm (``qcluster`` always running) and scaled to
zero, on both shipped platforms (the systemd timer and KEDA), on one throwaway
PostgreSQL with the same data.

    .venv/bin/python bench/fleet_modes.py [--samples 5] [--idle-seconds 5] [--json FILE]

Each mode is supervised here exactly as its deployment files say, read from
``docs/deploy/`` (like ``chaos/run.py`` reads the units):

* ``warm``: one ``manage.py qcluster`` (2 workers) for the whole run;
* ``timer``: ``retention-drain.timer``/``.service``: ``OnUnitInactiveSec`` after the
  previous look finished, run the unit's ``ExecCondition`` (``cleanup_health --due``);
  on exit 0 run its ``ExecStart`` (``cleanup_drain --until-idle``) and wait for it;
* ``keda``: ``keda-scaledobject.yaml``: every ``pollingInterval`` run the delete
  ScaledObject's query on a connection of its own; when it is above
  ``activationTargetQueryValue`` and no replica runs, start a ``qcluster`` (2 workers);
  once it has been at or below that for ``cooldownPeriod``, stop it (SIGTERM, as the
  kubelet does). A real cluster adds pod scheduling and image start-up, not measured.

The idle time of both scaled modes (``CLEANUP_IDLE_EXIT_SECONDS`` and
``cooldownPeriod``) is ``--idle-seconds`` (default 5) so that every pickup sample starts
from zero within the run; the shipped 300 s only lengthen the time a worker stays up
after the work, which the nightly figure adds back (``alive_with_shipped_idle_s``).

Phases, per mode, on the nightly shape (``bench/dataset.py``, ``--portfolios`` x 10
properties x 3 kinds, ``--rows`` rows, ~1% past the cutoff):

1. **nightly sweep**: ``sweep_trigger`` for the current slot; the seconds until every
   job is finished, and the worker time it cost: seconds a worker process was alive
   and CPU seconds of every worker process (``/proc``; ``wait4`` for the drain);
2. **pickup**, ``--samples`` each, on an emptied copy of the scope: a new sweep (one
   partition), a retry (a job failed with a 5xx, due again after a 1-3 s backoff) and a
   redrive (a dead letter redriven), measured from the moment the job is due to its
   lease (``first_leased_at``, or the 20 ms poll that saw ``leases`` grow for a retry;
   ``bench/latency.py``'s scenarios). In the scaled modes each sample starts once no
   worker runs, at a random point of the supervisor's cycle (uniform over one
   interval), as work arriving at any time would;
3. **idle**: nothing due, ``--idle-window`` seconds after a 15 s warm-up: PostgreSQL
   transactions per second (``pg_stat_database``, this script's own two reads
   subtracted) and the resident memory of the worker processes (PSS, summed over the
   fleet's processes, sampled every 0.25 s: the mean, and the peak of any sample).
"""

# ruff: noqa: E402, S603 - the harness imports need the repository root first; our own commands only

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml

from bench import cputime
from bench.common import code_version, django_setup, log, sql
from bench.dataset import build_nightly_scope, cleanup_tables, load_nightly, record_tables, restore, snapshot
from chaos.units import seconds as span_seconds
from chaos.units import unit_read
from harness.postgres import Cluster, create_database
from harness.procs import group_members
from harness.qcluster import QCluster

DEPLOY = ROOT / "docs" / "deploy"
PY = sys.executable
POLL = 0.02
SAMPLE_TIMEOUT = 180.0


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def _rss_kb(pid: int) -> int:
    """The process's proportional set size (PSS): its resident memory with pages it
    shares (a forked cluster's workers share most of theirs) divided among the sharers,
    so a process tree's figures add up to what it really holds."""
    try:
        match = re.search(r"Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text())
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def _command(line: str) -> list[str]:
    """A unit's command with the deployment's interpreter replaced by ours."""
    argv = shlex.split(line)
    return [PY, *argv[1:]] if argv[0].endswith("/python") else argv


@dataclass
class WorkerRun:
    started: float
    ended: float | None = None
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0


@dataclass
class Fleet:
    """A fleet mode: starts and stops workers as its deployment would."""

    name: str
    env: dict[str, str]
    runs: list[WorkerRun] = field(default_factory=list)
    checks: int = 0
    period: float = 0.0  # the supervisor's cycle (0: always on)

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def running(self) -> bool:
        return bool(self.runs) and self.runs[-1].ended is None

    def worker_pids(self) -> list[int]:
        return []

    def cpu_total(self) -> float:
        """CPU seconds every worker-side process of this fleet used so far."""
        return sum(r.cpu_s for r in self.runs)


def _tree_cpu(pid: int) -> float:
    return sum(t for t, _ in cputime.snapshot({pid}).values()) / cputime._TICK


class WarmFleet(Fleet):
    def start(self) -> None:
        self.cluster = QCluster(self.env, cwd=ROOT, workers=2, log=log)
        self.runs.append(WorkerRun(started=time.monotonic()))
        time.sleep(5.0)  # started and polling

    def stop(self) -> None:
        run = self.runs[-1]
        run.cpu_s = _tree_cpu(self.cluster.pid)
        self.cluster.stop(grace=20)
        run.ended = time.monotonic()

    def worker_pids(self) -> list[int]:
        return group_members(self.cluster.pid)

    def cpu_total(self) -> float:
        return _tree_cpu(self.cluster.pid)


class TimerFleet(Fleet):
    """``retention-drain.timer`` + ``.service`` as systemd runs them."""

    def start(self) -> None:
        timer = unit_read(DEPLOY / "retention-drain.timer")["Timer"]
        service = unit_read(DEPLOY / "retention-drain.service")["Service"]
        self.period = span_seconds(timer["OnUnitInactiveSec"][-1])
        self.first = span_seconds(timer["OnActiveSec"][-1])
        self.check_cmd = _command(service["ExecCondition"][-1])
        self.drain_cmd = _command(service["ExecStart"][-1])
        for assignment in service.get("Environment", []):
            key, value = assignment.split("=", 1)
            self.env.setdefault(key, value)
        self.current: int | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _spawn(self, argv: list[str]) -> tuple[int, Any, float]:
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.current = proc.pid
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.current = None
        return proc.returncode, usage, usage.ru_utime + usage.ru_stime

    def _loop(self) -> None:
        delay = self.first
        while not self.stopping.wait(delay):
            code, usage, cpu = self._spawn(self.check_cmd)
            self.checks += 1
            self.check_cpu_s = getattr(self, "check_cpu_s", 0.0) + cpu
            self.check_rss_mb = max(getattr(self, "check_rss_mb", 0.0), usage.ru_maxrss / 1024)
            if code == 0:
                run = WorkerRun(started=time.monotonic())
                self.runs.append(run)
                _code, usage, cpu = self._spawn(self.drain_cmd)
                run.cpu_s, run.peak_rss_mb, run.ended = cpu, usage.ru_maxrss / 1024, time.monotonic()
            delay = self.period  # OnUnitInactiveSec: after the unit went inactive

    def stop(self) -> None:
        self.stopping.set()
        if self.current:
            os.kill(self.current, signal.SIGTERM)
        self.thread.join(timeout=60)

    def running(self) -> bool:
        return bool(self.runs) and self.runs[-1].ended is None

    def worker_pids(self) -> list[int]:
        return [self.current] if self.current else []

    def cpu_total(self) -> float:
        # The checks (a Python start and one query each) are this mode's idle cost.
        return getattr(self, "check_cpu_s", 0.0) + super().cpu_total()


class KedaFleet(Fleet):
    """KEDA's postgresql scaler on the delete ScaledObject of ``keda-scaledobject.yaml``."""

    def start(self) -> None:
        import psycopg

        docs = [d for d in yaml.safe_load_all((DEPLOY / "keda-scaledobject.yaml").read_text()) if d]
        spec = next(
            d["spec"]
            for d in docs
            if d["kind"] == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == "retention-qcluster"
        )
        meta = spec["triggers"][0]["metadata"]
        self.query = meta["query"]
        self.activation = float(meta.get("activationTargetQueryValue", 0))
        self.period = float(spec["pollingInterval"])
        self.cooldown = float(self.env.get("BENCH_COOLDOWN", spec["cooldownPeriod"]))
        self.conn = psycopg.connect(self.env["DATABASE_URL"], autocommit=True)
        self.cluster: QCluster | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        last_active = 0.0
        while not self.stopping.is_set():
            value = float(self.conn.execute(self.query).fetchone()[0])
            self.checks += 1
            now = time.monotonic()
            if value > self.activation:
                last_active = now
                if self.cluster is None:
                    self.runs.append(WorkerRun(started=now))
                    self.cluster = QCluster(self.env, cwd=ROOT, workers=2, log=log)
            elif self.cluster is not None and now - last_active >= self.cooldown:
                self._scale_to_zero()
            self.stopping.wait(self.period)

    def _scale_to_zero(self) -> None:
        cluster, self.cluster = self.cluster, None
        run = self.runs[-1]
        run.cpu_s = _tree_cpu(cluster.pid)
        run.peak_rss_mb = sum(_rss_kb(pid) for pid in group_members(cluster.pid)) / 1024
        cluster.stop(grace=20)
        run.ended = time.monotonic()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        if self.cluster is not None:
            self._scale_to_zero()
        self.conn.close()

    def worker_pids(self) -> list[int]:
        return group_members(self.cluster.pid) if self.cluster else []

    def cpu_total(self) -> float:
        # KEDA's own poll runs in the operator, outside the fleet: not counted here.
        live = _tree_cpu(self.cluster.pid) if self.cluster else 0.0
        return super().cpu_total() + live


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def open_jobs() -> int:
    return sql("SELECT count(*) FROM cleanup_ops_cleanupjob WHERE state IN ('pending', 'leased')")[0][0]


def at_zero(fleet: Fleet, rng: random.Random) -> None:
    """Scaled modes: until no worker runs, then a random point of the supervisor's cycle."""
    if not fleet.period:
        return
    if not wait_until(lambda: not fleet.running(), 600):
        log(f"{fleet.name}: the worker did not exit within 600 s")
    time.sleep(rng.uniform(0, fleet.period))


# --- phases ---------------------------------------------------------------------


def nightly_phase(fleet: Fleet, slot: datetime, idle_seconds: float) -> dict[str, Any]:
    from cleanup_ops.schedule import sweep_trigger

    runs_before = len(fleet.runs)
    cpu_before = None
    if isinstance(fleet, WarmFleet):
        cpu_before = cputime.snapshot({fleet.cluster.pid})
    started = time.monotonic()
    result = sweep_trigger(slot=slot)
    drained = wait_until(lambda: open_jobs() == 0, 1800)
    finished = time.monotonic()
    out: dict[str, Any] = {
        "jobs": result.sweep.jobs_admitted,
        "drained": drained,
        "trigger_to_drained_s": round(finished - started, 2),
    }
    if isinstance(fleet, WarmFleet):
        after = cputime.snapshot({fleet.cluster.pid})
        out["worker_cpu_s"] = round(cputime.delta(cpu_before, after), 2)
        out["worker_alive_s"] = "always (86,400 s a day)"
        return out
    wait_until(lambda: len(fleet.runs) > runs_before and not fleet.running(), 600)
    runs = fleet.runs[runs_before:]
    alive = sum((r.ended or time.monotonic()) - r.started for r in runs)
    out["worker_runs"] = len(runs)
    out["worker_alive_s"] = round(alive, 2)
    out["alive_with_shipped_idle_s"] = round(alive - len(runs) * idle_seconds + len(runs) * 300, 1)
    out["worker_cpu_s"] = round(sum(r.cpu_s for r in runs), 2)
    out["worker_peak_rss_mb"] = round(max((r.peak_rss_mb for r in runs), default=0), 1)
    return out


def pickup_phase(fleet: Fleet, slot: datetime, samples: int, rng: random.Random, watch: Any) -> dict[str, Any]:
    """``bench/latency.py``'s three scenarios, one sample at a time from zero."""
    from django.conf import settings

    from bench.latency import BenchEnv, bench_lease, parked_jobs, summarise, wait_closed, wait_first_lease
    from cleanup_ops.models import CleanupJob, DeadLetter
    from cleanup_ops.recovery.classification import DEAD, RETRY, Classification, FailureCategory
    from cleanup_ops.recovery.failures import job_fail
    from cleanup_ops.recovery.operator import dead_letter_redrive
    from cleanup_ops.schedule import sweep_trigger

    settings.CLEANUP_BACKOFF_BASE_SECONDS, settings.CLEANUP_BACKOFF_CAP_SECONDS = 1.0, 3.0
    env = BenchEnv(watch)
    out: dict[str, Any] = {}

    lat: list[float | None] = []
    for i in range(samples):
        at_zero(fleet, rng)
        s = slot - timedelta(minutes=i + 1)
        env.expired_lease(env.prop(), s)
        result = sweep_trigger(slot=s)
        job_id, due = CleanupJob.objects.filter(sweep=result.sweep).values_list("id", "available_at").get()
        leased = wait_first_lease(env, job_id)
        lat.append(None if leased is None else (leased - due).total_seconds())
        wait_closed(env, [job_id])
    out["sweep"] = summarise(lat)
    log(f"{fleet.name}: pickup sweep p50 {out['sweep']['p50']} s, p95 {out['sweep']['p95']} s")

    lat = []
    retry = Classification(FailureCategory.DOWNSTREAM_UNAVAILABLE, RETRY, "DownstreamError")
    for job_id in parked_jobs(env, slot, samples, "retry"):
        at_zero(fleet, rng)
        job_fail(lease=bench_lease(job_id), classification=retry)
        due = CleanupJob.objects.values_list("available_at", flat=True).get(pk=job_id)
        seen = None
        deadline = time.monotonic() + SAMPLE_TIMEOUT
        while seen is None and time.monotonic() < deadline:
            if env.one("SELECT leases FROM cleanup_ops_cleanupjob WHERE id = %s", [job_id]) >= 2:
                seen = _now()
            else:
                time.sleep(POLL)
        lat.append(None if seen is None else (seen - due).total_seconds())
        wait_closed(env, [job_id])
    out["retry"] = summarise(lat)
    log(f"{fleet.name}: pickup retry p50 {out['retry']['p50']} s, p95 {out['retry']['p95']} s")

    lat = []
    dead = Classification(FailureCategory.POLICY_OR_INPUT, DEAD, "InvalidInput")
    parked = parked_jobs(env, slot, samples, "redrive")
    for job_id in parked:
        job_fail(lease=bench_lease(job_id), classification=dead)
    for letter_id in DeadLetter.objects.filter(job_id__in=parked).order_by("id").values_list("id", flat=True):
        at_zero(fleet, rng)
        job = dead_letter_redrive(letter_id=letter_id, actor=None, reason="bench: pickup latency of a redrive")
        due = CleanupJob.objects.values_list("available_at", flat=True).get(pk=job.pk)
        leased = wait_first_lease(env, job.pk)
        lat.append(None if leased is None else (leased - due).total_seconds())
        wait_closed(env, [job.pk])
    out["redrive"] = summarise(lat)
    log(f"{fleet.name}: pickup redrive p50 {out['redrive']['p50']} s, p95 {out['redrive']['p95']} s")
    return out


def xacts(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0])


def idle_phase(fleet: Fleet, url: str, window: float) -> dict[str, Any]:
    if fleet.period:
        wait_until(lambda: not fleet.running(), 600)
    time.sleep(15.0)  # PostgreSQL flushes an idle backend's counters up to 10 s late
    samples: list[int] = []
    checks, cpu = fleet.checks, fleet.cpu_total()
    x0, t0 = xacts(url), time.monotonic()
    while time.monotonic() - t0 < window:
        samples.append(sum(_rss_kb(pid) for pid in fleet.worker_pids()))
        time.sleep(0.25)
    x1, t1 = xacts(url), time.monotonic()
    cpu_per_s = (fleet.cpu_total() - cpu) / (t1 - t0)
    return {
        "worker_cpu_s_per_hour": round(cpu_per_s * 3600, 1),
        "seconds": round(t1 - t0, 1),
        "transactions_per_s": round((x1 - x0 - 1) / (t1 - t0), 2),
        "rss_mean_mb": round(statistics.fmean(samples) / 1024, 1) if samples else 0.0,
        "rss_peak_mb": round(max(samples, default=0) / 1024, 1),
        "supervisor_checks": fleet.checks - checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="warm,timer,keda")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--idle-window", type=float, default=60.0)
    parser.add_argument("--portfolios", type=int, default=50)
    parser.add_argument("--rows", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    pg = Cluster(prefix="fleet-modes-pg.")
    fleet: Fleet | None = None
    results: dict[str, Any] = {}
    try:
        url = pg.start()
        os.environ["DATABASE_URL"] = url
        create_database(url)
        django_setup(1000)
        from django.core.management import call_command
        from django.db import connections

        from cleanup_ops.schedule import slot_current

        call_command("migrate", verbosity=0, interactive=False)
        call_command("createcachetable", verbosity=0)
        slot = slot_current()
        scope = build_nightly_scope(args.portfolios, 10)
        ds = load_nightly(scope, args.rows, slot)
        log(f"dataset: {ds.total:,} rows, {len(scope.properties)} properties; snapshot in {snapshot():.1f} s")
        base_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("Q_", "CLEANUP_"))},
            "DATABASE_URL": url,
            "DEBUG": "false",
            "LOG_LEVEL": "ERROR",
            "Q_WORKERS": "2",
            "CLEANUP_IDLE_EXIT_SECONDS": str(args.idle_seconds),
            "BENCH_COOLDOWN": str(args.idle_seconds),
        }
        kinds = {"warm": WarmFleet, "timer": TimerFleet, "keda": KedaFleet}
        for name in args.modes.split(","):
            restore()
            connections.close_all()
            fleet = kinds[name](name=name, env=dict(base_env))
            fleet.start()
            log(f"{name}: nightly sweep")
            at_zero(fleet, rng)
            mode: dict[str, Any] = {"nightly": nightly_phase(fleet, slot, args.idle_seconds)}
            log(f"{name}: nightly {mode['nightly']}")
            if fleet.period:
                at_zero(fleet, rng)
            sql(f"TRUNCATE {cleanup_tables()}, {record_tables()} RESTART IDENTITY CASCADE")
            import psycopg

            with psycopg.connect(url, autocommit=True) as watch:
                mode["pickup"] = pickup_phase(fleet, slot, args.samples, rng, watch)
            log(f"{name}: idle for {args.idle_window:g} s")
            mode["idle"] = idle_phase(fleet, url, args.idle_window)
            log(f"{name}: idle {mode['idle']}")
            fleet.stop()
            fleet = None
            results[name] = mode
    finally:
        if fleet is not None:
            fleet.stop()
        pg.stop()
    report = {
        "code": code_version(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
        "samples": args.samples,
        "idle_seconds": args.idle_seconds,
        "rows": args.rows,
        "portfolios": args.portfolios,
        "modes": results,
    }
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


def print_table(report: dict[str, Any]) -> None:
    modes = report["modes"]
    names = list(modes)
    print(f"Fleet modes (code {report['code']}; {report['cores']} cores; load average before/after", end=" ")
    print(f"{report['load_before'][0]} / {report['load_after'][0]}; {report['samples']} pickup samples each):")
    rows = [
        ("pickup p50 / p95, s: new sweep", lambda m: f"{m['pickup']['sweep']['p50']} / {m['pickup']['sweep']['p95']}"),
        ("pickup p50 / p95, s: retry", lambda m: f"{m['pickup']['retry']['p50']} / {m['pickup']['retry']['p95']}"),
        (
            "pickup p50 / p95, s: redrive",
            lambda m: f"{m['pickup']['redrive']['p50']} / {m['pickup']['redrive']['p95']}",
        ),
        ("idle: PostgreSQL transactions/s", lambda m: m["idle"]["transactions_per_s"]),
        (
            "idle: worker memory (PSS) mean / peak, MB",
            lambda m: f"{m['idle']['rss_mean_mb']} / {m['idle']['rss_peak_mb']}",
        ),
        ("idle: worker CPU, s per hour", lambda m: m["idle"]["worker_cpu_s_per_hour"]),
        ("nightly: trigger to drained, s", lambda m: m["nightly"]["trigger_to_drained_s"]),
        ("nightly: worker alive, s", lambda m: m["nightly"]["worker_alive_s"]),
        ("nightly: worker CPU, s", lambda m: m["nightly"]["worker_cpu_s"]),
    ]
    print("| | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(str(cell(modes[n])) for n in names) + " |")


if __name__ == "__main__":
    sys.exit(main())
