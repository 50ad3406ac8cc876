#!/usr/bin/env python
"""What the application feels while cleanup runs: a pgbench workload next to the sweep.

Run from the repository root::

    .venv/bin/python bench/app_impact.py --nice -10           # 200,000 leases, ~7 minutes here
    .venv/bin/python bench/app_impact.py --rows 1000000 --nice -10 --limits 20:10 --max-repeat 1
                                                              # the 1M backlog, ~7 minutes (5/s: +4 min)
    .venv/bin/python bench/app_impact.py --limits 40:20,10:5  # other rate limits (global:portfolio)
    bash bench/run-at-head.sh --app-impact                    # the same against committed HEAD

The dataset is the backlog shape of ``bench/pipeline.py`` (leases, 100 portfolios with
a 365-day policy, one big one with half of the rows) plus what an application reads and
writes that the sweep does not delete: ``--quiet-portfolios`` portfolios (default 20, 3
properties each) with **no** retention policy (the sweep never touches them), running
leases in them, and open maintenance records (``--maintenance-per-property``, default
20) in every property, cleaned or not. No portfolio has a maintenance or tenant-activity
policy, so the application's own rows are never eligible.

The application (``pgbench``, connected as its own role ``bench_app`` so its statements
and WAL are told apart from the cleanup's) runs four scripts, open-loop at a fixed
arrival rate (``--app-rate`` transactions/s over ``--app-clients`` connections, as users
arrive whatever the database's speed; ``--app-rate 0`` is closed-loop, as fast as it
can):

* ``read``    (weight 50): a property's active leases (any property);
* ``insert``  (weight 30): one tenant-activity row (any property);
* ``maint-cleaned`` (10): ``SELECT … FOR UPDATE`` + ``UPDATE`` of one maintenance record
  in a portfolio the sweep is cleaning;
* ``maint-quiet``   (10): the same in a portfolio it is not.

Phases, each from a fresh copy of the same snapshot:

* ``idle``: the application alone (``--idle-seconds``), measured before every other
  phase and once more at the end, the windows pooled: the baseline every other phase
  is compared with (the machine's load drifts; the baseline spans the same hour);
* ``loop``: during the plain ``DELETE`` loop (``bench.baselines.run_loop``, one process);
* ``q2``: during ``sweep_trigger`` + ``qcluster`` with 2 workers, no rate limit;
* ``q2lim``: the same with ``CLEANUP_RATE_GLOBAL`` / ``CLEANUP_RATE_PORTFOLIO`` set, one
  run per ``--limits`` entry ``G:P`` (batches per second; a batch is one transaction
  batch, which takes one global token and one token of every portfolio it touches).
  ``q1`` / ``q1lim`` (not in the default set) are the same with one worker.
  Bursts default to one second's worth (``CLEANUP_BURST_* = rate``, at least 1), not the
  settings' defaults (50 / 20), which would let the first 50 transactions through
  unthrottled.

A cleanup phase shorter than ``--min-window`` seconds is repeated (fresh copy each time,
at most ``--max-repeat`` times) and the windows are pooled, so that a p99 rests on
enough transactions. Only application transactions that *ended* inside a cleanup run's
window (trigger to drained) count for it. Latency is pgbench's per-transaction log:
from the scheduled start (so it includes any wait for a connection, which is what a
user feels) to the end.

Figures per phase: the application's transactions/s, p50/p99 latency (and p99 per
script), p99 against the idle p99; the cleanup's seconds, rows, statements
(``pg_stat_statements``, the application's role left out) and WAL per deleted row
(``pg_stat_statements.wal_bytes`` of every role but the application's, from the start
of the run; the LSN difference over the run is shown too, application included);
the CPU other processes on the machine used meanwhile (``harness.cpu.CpuWatch``) and
the load average. *Statements per batch*: the cleanup's statements per run over its
batch transactions per run (the ledger's distinct ``applied_at``), with the rate-token
and BEGIN/COMMIT shares, against the unlimited run with as many workers (the limiter's
goal: within 1.5x). The verdict: does a limited run keep p99 ≤ 1.2 x idle while its
sweep, projected to the 1M dataset, finishes before the next slot
(``CLEANUP_SCHEDULE``'s interval, or ``--slot-hours``)?

The throwaway PostgreSQL runs with ``fsync``, ``synchronous_commit`` and
``full_page_writes`` off (``harness/postgres.py``): commit latency and WAL volume are
lower than on a durable server (no full-page images after a checkpoint), and the
figures are for comparing phases, not for sizing disks.

The code: this script runs the phases and reads the server's figures;
``bench/app_workload.py`` is the application (its rows, the pgbench scripts and
load); ``bench/app_report.py`` the statistics, the tables and the verdict.
"""

# ruff: noqa: E402 - imports need the repository root on sys.path first

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cputime
from bench import runs as runs_module
from bench.app_report import Phase, report, statements_per_batch, stats_from
from bench.app_workload import AppLoad, Txn, add_application_rows
from bench.baselines import run_loop
from bench.common import code_version, django_setup, log, sql
from bench.dataset import build_scope, load_records, restore, snapshot
from bench.runs import RunResult, run_qcluster
from bench.statements import WATCH_ROLE, PgStats
from harness.cpu import CpuWatch
from harness.postgres import Cluster, ClusterError, create_database
from harness.procs import renice
from harness.qcluster import QCluster

APP_ROLE = "bench_app"


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- server figures


def wal_by_role(stats: PgStats) -> dict[str, int]:
    """WAL bytes per role in the benchmark database since the last
    ``pg_stat_statements_reset()`` (each run resets it as it starts:
    ``bench.runs.ServerCount``). The extension lives in the admin database."""
    import psycopg

    with psycopg.connect(stats.admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT r.rolname, COALESCE(sum(s.wal_bytes), 0) FROM pg_stat_statements s"
            " JOIN pg_roles r ON r.oid = s.userid JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s GROUP BY r.rolname",
            [stats.db],
        ).fetchall()
    return {name: int(b) for name, b in rows}


def wal_lsn() -> int:
    return int(sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def fresh_copy(watch: CpuWatch, wait_idle: float) -> float:
    """The database back to the snapshot, its copy written out (``os.sync``: the file-level
    copy of a 1M-row database otherwise leaves ~200 MB of dirty pages that the kernel
    writes back during the next measurement), and optionally a wait for other processes
    to go quiet. Returns the restore's seconds."""
    seconds = restore()
    os.sync()
    if wait_idle:
        waited = watch.wait_idle(wait_idle)
        if waited >= 4:
            log(f"waited {waited:.0f} s for other processes to go quiet")
    return seconds


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def slot_interval_hours() -> float:
    """Hours between two slots of ``CLEANUP_SCHEDULE`` (its next two fire times)."""
    from croniter import croniter
    from django.conf import settings

    it = croniter(settings.CLEANUP_SCHEDULE, datetime.now(UTC))
    a, b = it.get_next(datetime), it.get_next(datetime)
    return (b - a).total_seconds() / 3600


def transactions_of(portfolio: int | None = None) -> int:
    """Batch transactions the run committed (one applied_at per transaction), optionally
    only those that touched ``portfolio``."""
    if portfolio is None:
        return int(sql("SELECT count(DISTINCT applied_at) FROM cleanup_ops_ledgerentry")[0][0])
    return int(
        sql(
            "SELECT count(DISTINCT l.applied_at) FROM cleanup_ops_ledgerentry l"
            " JOIN cleanup_ops_cleanupjob j ON j.id = l.job_id WHERE j.portfolio_id = %s",
            [portfolio],
        )[0][0]
    )


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="leases of the backlog shape (default 200,000)")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--quiet-portfolios", type=int, default=20, help="portfolios without a policy (default 20)")
    parser.add_argument("--maintenance-per-property", type=int, default=20, help="open work orders per property")
    parser.add_argument("--app-rate", type=float, default=200.0, help="application transactions/s (0: closed loop)")
    parser.add_argument("--app-clients", type=int, default=4, help="application connections (default 4)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=15.0,
        help="each idle window (before every phase, and last; default 15)",
    )
    parser.add_argument(
        "--min-window", type=float, default=12.0, help="repeat a cleanup phase until its windows add up to this"
    )
    parser.add_argument("--max-repeat", type=int, default=5, help="at most this many runs per cleanup phase")
    parser.add_argument(
        "--limits",
        default="20:10,5:3",
        help="comma list of GLOBAL:PORTFOLIO rates (batches/s) for the q2lim runs, optionally :BURST_G:BURST_P"
        " (bursts default to the rates) and +SETTING=VALUE for further settings of that run, e.g."
        " 5:3+CLEANUP_LEASE_JOBS=10 (default 20:10,5:3)",
    )
    parser.add_argument(
        "--only",
        default="idle,loop,q2,q2lim",
        help="phases (default idle,loop,q2,q2lim; also q1, q1lim: the same with 1 worker)",
    )
    parser.add_argument("--slot-hours", type=float, help="slot interval (default: CLEANUP_SCHEDULE's, 24 h nightly)")
    parser.add_argument("--nice", type=int, default=0, help="priority of our processes and PostgreSQL (e.g. -10)")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each window wait up to this long until other processes use < 0.25 cores (default: don't)",
    )
    parser.add_argument("--save", type=Path, help="also write every figure as JSON to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep the pgbench and qcluster logs")
    args = parser.parse_args()
    if not shutil.which("pgbench"):
        raise SystemExit("bench: pgbench not found (Debian: apt-get install postgresql-client)")
    limits: list[tuple[float, float, float, float, dict[str, str]]] = []
    for item in args.limits.split(","):
        rates, *settings_given = item.split("+")
        try:
            parts = [float(x) for x in rates.split(":")]
            more = dict(kv.split("=", 1) for kv in settings_given)
        except ValueError:
            parts, more = [], {}
        if len(parts) not in (2, 4) or min(parts) <= 0:
            parser.error(f"--limits: {item!r} is not GLOBAL:PORTFOLIO[:BURST_G:BURST_P][+SETTING=VALUE…]")
        g, p = parts[:2]
        bg, bp = parts[2:] if len(parts) == 4 else (max(1.0, g), max(1.0, p))
        limits.append((g, p, bg, bp, more))
    phases = set(args.only.split(","))

    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    pg: Cluster | None = None
    live: list[QCluster] = []
    work = Path(tempfile.mkdtemp(prefix="bench-app-"))
    watch = CpuWatch()
    try:
        if args.nice:
            renice(os.getpid(), args.nice)
        if os.environ.get("DATABASE_URL"):
            raise SystemExit("bench/app_impact.py starts its own PostgreSQL; unset DATABASE_URL")
        try:
            pg = Cluster()
        except ClusterError as exc:
            raise SystemExit(f"bench: {exc}") from exc
        url = pg.start()
        os.environ["DATABASE_URL"] = url
        log(f"throwaway PostgreSQL ({pg.bin}) in {pg.dir}")
        stats = PgStats(url)
        stats.enable(pg, log)
        if stats.method != "pg_stat_statements":
            raise SystemExit("bench/app_impact.py needs pg_stat_statements (WAL per role)")
        if pg.postmaster_pid:
            watch.own_roots.add(pg.postmaster_pid)
            if args.nice:
                pg.renice(args.nice)
        watch.start()
        stats.excluded_roles.append(APP_ROLE)
        runs_module.STATS = stats
        create_database(url)
        django_setup(args.batch_size)
        from django.core.management import call_command

        from cleanup_ops.schedule import slot_current

        env = dict(os.environ)
        call_command("migrate", verbosity=0, interactive=False)
        call_command("createcachetable", verbosity=0)
        sql(f"CREATE ROLE {APP_ROLE} LOGIN SUPERUSER")  # trust auth on loopback, like every role here
        app_url = url.replace("postgres://postgres@", f"postgresql://{APP_ROLE}@", 1)
        slot = slot_current()
        scope = build_scope()
        ds = load_records(scope, args.rows, slot)
        app_scope = add_application_rows(
            ds, scope.big_portfolio or 0, args.quiet_portfolios, args.maintenance_per_property, slot
        )
        log(f"snapshot in {snapshot():.1f} s")
        log(
            f"dataset: {ds.total:,} leases ({ds.eligible:,} eligible, {ds.held:,} held),"
            f" {100 + args.quiet_portfolios} portfolios ({args.quiet_portfolios} without a policy),"
            f" maintenance ids cleaned {app_scope.mc_lo}-{app_scope.mc_hi}, quiet {app_scope.mq_lo}-{app_scope.mq_hi}"
        )
        runs_module.CPU_ROOTS = set(watch.own_roots)
        load = AppLoad(app_url, app_scope, rate=args.app_rate, clients=args.app_clients, work=work / "pgbench")
        results: list[Phase] = []

        idle_samples: list[tuple[tuple[float, float], float, list[Txn]]] = []
        app_cpu_seconds: list[tuple[float, float]] = []  # (CPU seconds, wall seconds) per idle window

        def idle_window(seconds: float) -> tuple[tuple[float, float], float, list[Txn]]:
            """(window, CPU seconds other processes used in it, the transactions logged)."""
            log(f"restored in {fresh_copy(watch, args.wait_idle):.1f} s; application alone for {seconds:.0f} s")
            load.start()
            time.sleep(2.0)  # connections up, the first chunk under way
            before = watch.foreign_seconds
            ours = cputime.snapshot(runs_module.CPU_ROOTS)
            a = time.time()
            time.sleep(seconds)
            b = time.time()
            # What the application alone costs our processes and PostgreSQL: taken off
            # a cleanup run's CPU to estimate the cleanup's own.
            app_cpu = cputime.delta(ours, cputime.snapshot(runs_module.CPU_ROOTS))
            other = watch.foreign_seconds - before  # over a window of many samples: fine
            load.stop()
            rows = load.transactions()
            load.reset()
            app_cpu_seconds.append((app_cpu, b - a))
            return (a, b), other, rows

        def cleanup_phase(name: str, label: str, run: Any, limits_used: tuple[float, float] | None = None) -> Phase:
            if "idle" in phases:
                # An idle window before every phase: the baseline meets the same
                # machine (other engineers' load drifts) as the phases it is compared with.
                idle_samples.append(idle_window(args.idle_seconds))
            windows: list[tuple[float, float]] = []
            phase = Phase(name, label, stats_from([], [], []), limits=limits_used)
            other = watched = 0.0
            statements = 0
            by_class: dict[str, int] = {}
            while phase.runs < args.max_repeat and (not windows or sum(b - a for a, b in windows) < args.min_window):
                restored = fresh_copy(watch, args.wait_idle)
                log(f"restored in {restored:.1f} s; {label} (run {phase.runs + 1}) with the application")
                # Other processes' CPU over the whole run with its warm-up: the watch
                # samples once a second, too coarse for a sub-second cleanup window.
                before, watched_from = watch.foreign_seconds, time.monotonic()
                load.start()
                time.sleep(2.0)
                lsn = wal_lsn()
                result: RunResult = run()
                lsn_after = wal_lsn()
                load.stop()
                watched += time.monotonic() - watched_from
                if result.window is None:
                    raise RuntimeError(f"{label}: the run reported no window")
                windows.append(result.window)
                other += watch.foreign_seconds - before
                wal = wal_by_role(stats)
                phase.wal_app_bytes += wal.get(APP_ROLE, 0)
                phase.wal_cleanup_bytes += sum(b for r, b in wal.items() if r not in (APP_ROLE, WATCH_ROLE))
                phase.wal_lsn_bytes += lsn_after - lsn
                phase.rows_deleted += result.deleted
                phase.ok = phase.ok and result.ok
                phase.cleanup_seconds.append(round(result.seconds, 2))
                server = result.extra.get("server") or {}
                for cls, (calls, *_ms) in server.get("by_class", {}).items():
                    if cls != "FK check (trigger)":
                        statements += int(calls)
                        by_class[cls] = by_class.get(cls, 0) + int(calls)
                phase.cpu_seconds += float(result.extra.get("cpu_seconds", 0.0))
                if name != "loop":
                    phase.transactions += transactions_of()
                    phase.transactions_big += transactions_of(app_scope.big_portfolio)
                phase.runs += 1
                log(
                    f"{label}: {result.deleted:,} rows in {result.seconds:.2f} s"
                    f" ({'ok' if result.ok else 'FAIL'}); application p99 so far"
                    f" {stats_from(load.transactions(), windows, []).p99_ms} ms"
                )
            phase.app = stats_from(load.transactions(), windows, load.errors)
            phase.statements = statements // max(phase.runs, 1)  # per run
            phase.extra["statements_by_class_per_run"] = {
                k: v // max(phase.runs, 1) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])
            }
            phase.other_cpu_cores = round(other / watched, 2) if watched else 0.0
            phase.load_average = load_average()
            load.reset()
            return phase

        log_dir = work / "qcluster"
        log_dir.mkdir()
        if "loop" in phases:
            results.append(
                cleanup_phase("loop", "DELETE loop (1 process)", lambda: run_loop(ds, args.batch_size, slot))
            )
        for workers in (2, 1):
            q = f"q{workers}"
            if q in phases:
                results.append(
                    cleanup_phase(
                        q,
                        f"{q} (qcluster, {workers} worker{'s' if workers > 1 else ''}), no limit",
                        lambda w=workers: run_qcluster(ds, w, slot, env, log_dir, live, nice=args.nice, settle=1.0),
                    )
                )
            if f"{q}lim" not in phases:
                continue
            for g, p, bg, bp, more in limits:
                limit_env = {
                    **env,
                    "CLEANUP_RATE_GLOBAL": f"{g:g}",
                    "CLEANUP_RATE_PORTFOLIO": f"{p:g}",
                    "CLEANUP_BURST_GLOBAL": f"{bg:g}",
                    "CLEANUP_BURST_PORTFOLIO": f"{bp:g}",
                    **more,
                }
                also = "".join(f", {k.removeprefix('CLEANUP_')}={v}" for k, v in more.items())
                results.append(
                    cleanup_phase(
                        f"{q}lim-{g:g}-{p:g}{also}",
                        f"{q}, limit {g:g}/s global, {p:g}/s portfolio{also}",
                        lambda e=limit_env, w=workers: run_qcluster(
                            ds, w, slot, e, log_dir, live, nice=args.nice, settle=1.0
                        ),
                        limits_used=(g, p),
                    )
                )
        idle = None
        if "idle" in phases:
            idle_samples.append(idle_window(args.idle_seconds))
            # All idle windows pooled (one before each phase, one last): the baseline spans the measurement.
            windows = [w for w, _, _ in idle_samples]
            pooled = [t for _, _, rows in idle_samples for t in rows]
            idle = Phase("idle", "application alone (idle baseline)", stats_from(pooled, windows, []))
            span = sum(b - a for a, b in windows)
            idle.other_cpu_cores = round(sum(o for _, o, _ in idle_samples) / span, 2) if span else 0.0
            idle.load_average = load_average()
            idle.extra["windows"] = [asdict(stats_from(rows, [w], [])) for w, _, rows in idle_samples]
            idle.extra["app_cpu_cores"] = round(
                sum(c for c, _ in app_cpu_seconds) / max(sum(w for _, w in app_cpu_seconds), 1e-9), 3
            )
            results.insert(0, idle)

        hours = args.slot_hours or slot_interval_hours()
        code = code_version()
        report(results, idle, ds=ds, args=args, code=code, slot_hours=hours, scope=app_scope)
        if args.save:
            args.save.write_text(
                json.dumps(
                    {
                        "code": code,
                        "rows": ds.total,
                        "eligible": ds.eligible,
                        "slot_hours": hours,
                        "args": {k: str(v) for k, v in vars(args).items()},
                        "phases": [
                            {**asdict(p), "wal_per_row": p.wal_per_row, "statements_per_batch": statements_per_batch(p)}
                            for p in results
                        ],
                    },
                    indent=1,
                    default=str,
                )
            )
        failed = [p.label for p in results if not p.ok]
        if failed:
            print(f"\nVERIFICATION FAILED: {', '.join(failed)}")
            sys.exit(1)
    finally:
        watch.stop()
        for cluster in list(live):
            cluster.stop()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: S110 - best effort before the server goes away
            pass
        if pg is not None and pg.running:
            pg.stop()
            log("PostgreSQL stopped and removed")
        if args.keep_logs:
            log(f"pgbench and qcluster logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
