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
"""

# ruff: noqa: E402, S603 - imports need the repository root on sys.path first; runs pgbench by design

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cputime
from bench import runs as runs_module
from bench.baselines import run_loop
from bench.common import code_version, django_setup, log, sql
from bench.dataset import KIND, Dataset, build_scope, kind_stats, load_records, restore, snapshot
from bench.runs import RunResult, run_qcluster
from bench.statements import WATCH_ROLE, PgStats
from harness.cpu import CpuWatch
from harness.postgres import Cluster, ClusterError, create_database
from harness.procs import renice
from harness.qcluster import QCluster

APP_ROLE = "bench_app"
P99_GOAL = 1.2  # the goal: application p99 within 1.2 x its idle p99 with a limit set
ONE_MILLION_ELIGIBLE = 950_487  # eligible rows of the 1M backlog dataset (bench/pipeline.py --rows 1000000)
# (end epoch, latency ms from the scheduled start, schedule lag ms, script index)
Txn = tuple[float, float, float, int]
CHUNK_SECONDS = 4  # pgbench runs in chunks this long, so each chunk's log is complete when it exits

# name -> (weight, script). Variables come from -D (see _pgbench_defines).
SCRIPTS: dict[str, tuple[int, str]] = {
    "read": (
        50,
        "\\set prop random(:prop_lo, :prop_hi)\n"
        "SELECT id, unit, tenant_name, started_on FROM properties_lease"
        " WHERE property_id = :prop AND (ended_at IS NULL OR ended_at > now()) ORDER BY id LIMIT 100;\n",
    ),
    "insert": (
        30,
        "\\set prop random(:prop_lo, :prop_hi)\n"
        "INSERT INTO properties_tenantactivity (portfolio_id, property_id, activity_type, details, occurred_at)"
        " SELECT portfolio_id, id, 'portal_login', 'pgbench', now() FROM properties_property WHERE id = :prop;\n",
    ),
    "maint-cleaned": (
        10,
        "\\set mid random(:mc_lo, :mc_hi)\n"
        "BEGIN;\n"
        "SELECT id, summary FROM properties_maintenancerecord WHERE id = :mid FOR UPDATE;\n"
        "UPDATE properties_maintenancerecord SET summary = 'visit ' || :mid WHERE id = :mid;\n"
        "COMMIT;\n",
    ),
    "maint-quiet": (
        10,
        "\\set mid random(:mq_lo, :mq_hi)\n"
        "BEGIN;\n"
        "SELECT id, summary FROM properties_maintenancerecord WHERE id = :mid FOR UPDATE;\n"
        "UPDATE properties_maintenancerecord SET summary = 'visit ' || :mid WHERE id = :mid;\n"
        "COMMIT;\n",
    ),
}


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- dataset


@dataclass
class AppScope:
    """Id ranges the pgbench scripts draw from (contiguous by construction)."""

    prop_lo: int
    prop_hi: int
    mc_lo: int  # maintenance records in cleaned portfolios
    mc_hi: int
    mq_lo: int  # ... in quiet portfolios (no policy)
    mq_hi: int
    quiet_portfolios: int
    big_portfolio: int


def add_application_rows(ds: Dataset, big_portfolio: int, quiet: int, maintenance: int, slot: datetime) -> AppScope:
    """Quiet portfolios (no policy) with running leases, and open maintenance records in
    every property; then the dataset's lease figures again (the totals changed)."""
    from properties.models import Portfolio, Property

    first_prop = sql("SELECT min(id) FROM properties_property")[0][0]
    pos = Portfolio.objects.bulk_create(
        [Portfolio(name=f"Quiet Lettings {i}", slug=f"quiet-{i:03d}") for i in range(1, quiet + 1)]
    )
    Property.objects.bulk_create([Property(portfolio=po, name=f"{po.slug} house {i}") for po in pos for i in (1, 2, 3)])
    quiet_ids = [po.pk for po in pos]
    last_prop = sql("SELECT max(id) FROM properties_property")[0][0]
    # Running leases in the quiet portfolios (NULL ended_at): read by the application, never eligible.
    sql(
        f"INSERT INTO {ds.kinds[KIND].table} (portfolio_id, property_id, unit, tenant_name, started_on, ended_at)"
        " SELECT p.portfolio_id, p.id, 'Q-' || g, 'Quiet tenant ' || g, (%s::timestamptz - interval '200 days')::date,"
        " NULL FROM properties_property p CROSS JOIN generate_series(1, 40) g"
        " WHERE p.portfolio_id = ANY(%s) ORDER BY g, p.id",
        [slot, quiet_ids],
    )
    ranges: dict[bool, tuple[int, int]] = {}
    for is_quiet in (False, True):
        sql(
            "INSERT INTO properties_maintenancerecord (portfolio_id, property_id, summary, opened_at, closed_at)"
            " SELECT p.portfolio_id, p.id, 'open work order ' || g, %s::timestamptz - g * interval '1 hour', NULL"
            " FROM properties_property p CROSS JOIN generate_series(1, %s) g"
            f" WHERE {'' if is_quiet else 'NOT'} (p.portfolio_id = ANY(%s)) ORDER BY g, p.id",
            [slot, maintenance, quiet_ids],
        )
        lo, hi = sql(
            "SELECT min(id), max(id) FROM properties_maintenancerecord WHERE"
            f" {'' if is_quiet else 'NOT'} (portfolio_id = ANY(%s))",
            [quiet_ids],
        )[0]
        ranges[is_quiet] = (lo, hi)
    sql("VACUUM ANALYZE properties_lease")
    sql("VACUUM ANALYZE properties_maintenancerecord")
    ds.kinds[KIND] = kind_stats(KIND, ds.cutoff)
    return AppScope(
        first_prop, last_prop, *ranges[False], *ranges[True], quiet_portfolios=quiet, big_portfolio=big_portfolio
    )


# --------------------------------------------------------------------------- pgbench


@dataclass
class AppStats:
    """The application's transactions that ended inside the windows of one phase."""

    seconds: float
    transactions: int
    tps: float
    p50_ms: float
    p99_ms: float
    p99_by_script_ms: dict[str, float]
    lag_p99_ms: float
    errors: list[str] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100) of sorted ``values``."""
    if not values:
        return float("nan")
    rank = max(1, math.ceil(q / 100 * len(values)))
    return values[min(rank, len(values)) - 1]


class AppLoad:
    """pgbench against the benchmark database in back-to-back chunks of ``CHUNK_SECONDS``
    while running; every chunk writes a per-transaction log that is complete when it
    exits (pgbench has no signal handler that flushes a log cut short)."""

    def __init__(self, url: str, scope: AppScope, *, rate: float, clients: int, work: Path) -> None:
        self.url = url
        self.scope = scope
        self.rate = rate
        self.clients = clients
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        for name, (_weight, text) in SCRIPTS.items():
            path = work / f"{name}.sql"
            path.write_text(text)
            self.files.append(path)
        self.prefixes: list[Path] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._n = 0

    def _argv(self, prefix: Path) -> list[str]:
        s = self.scope
        argv = [
            shutil.which("pgbench") or "pgbench",
            "-n",  # no VACUUM of pgbench's own tables (there are none)
            "-c",
            str(self.clients),
            "-j",
            str(min(2, self.clients)),
            "-T",
            str(CHUNK_SECONDS),
            "-l",
            f"--log-prefix={prefix}",
        ]
        if self.rate > 0:
            argv += ["-R", str(self.rate)]
        for name, d in (
            ("prop_lo", s.prop_lo),
            ("prop_hi", s.prop_hi),
            ("mc_lo", s.mc_lo),
            ("mc_hi", s.mc_hi),
            ("mq_lo", s.mq_lo),
            ("mq_hi", s.mq_hi),
        ):
            argv += ["-D", f"{name}={d}"]
        for path, (_weight, _text) in zip(self.files, SCRIPTS.values(), strict=True):
            argv += ["-f", f"{path}@{_weight}"]
        return [*argv, self.url]

    def _chunk(self) -> None:
        self._n += 1
        prefix = self.work / f"chunk{self._n:04d}"
        self.prefixes.append(prefix)
        out = subprocess.run(self._argv(prefix), cwd=self.work, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            self.errors.append(f"pgbench exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")

    def start(self) -> None:
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self._chunk()

        self._thread = threading.Thread(target=loop, name="pgbench", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Let the running chunk finish (its log complete) and start no other."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def transactions(self) -> list[Txn]:
        """(end epoch, latency ms, schedule lag ms, script index) of every logged transaction."""
        out = []
        for prefix in self.prefixes:
            for path in prefix.parent.glob(prefix.name + ".*"):
                for line in path.read_text().splitlines():
                    f = line.split()
                    # client_id transaction_no time script_no time_epoch time_us [schedule_lag]
                    if len(f) < 6 or not f[2].isdigit():
                        continue  # "skipped" transactions (-L) and anything unexpected
                    end = int(f[4]) + int(f[5]) / 1e6
                    lag = int(f[6]) / 1000 if len(f) > 6 and f[6].isdigit() else 0.0
                    out.append((end, int(f[2]) / 1000, lag, int(f[3])))
        return out

    def reset(self) -> None:
        for prefix in self.prefixes:
            for path in prefix.parent.glob(prefix.name + ".*"):
                path.unlink()
        self.prefixes = []
        self.errors = []


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


@dataclass
class Phase:
    name: str
    label: str
    app: AppStats
    runs: int = 0
    cleanup_seconds: list[float] = field(default_factory=list)
    rows_deleted: int = 0
    ok: bool = True
    statements: int | None = None
    wal_cleanup_bytes: int = 0
    wal_app_bytes: int = 0
    wal_lsn_bytes: int = 0
    transactions: int = 0
    transactions_big: int = 0
    other_cpu_cores: float = 0.0
    load_average: float = 0.0
    # CPU seconds of our processes and our PostgreSQL over the runs' windows (the
    # application's included; report() takes off what the idle application used).
    cpu_seconds: float = 0.0
    limits: tuple[float, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def wal_per_row(self) -> float | None:
        return self.wal_cleanup_bytes / self.rows_deleted if self.rows_deleted else None


PER_BATCH_GOAL = 1.5  # statements per batch under a limit, against the unlimited run with as many workers


def statements_per_batch(p: Phase, cls: str | None = None) -> float | None:
    """The cleanup's statements (or those of one class) per batch transaction of ``p``."""
    if p.statements is None or not p.transactions or not p.runs:
        return None
    per_run = p.statements if cls is None else p.extra.get("statements_by_class_per_run", {}).get(cls, 0)
    return per_run / (p.transactions / p.runs)


def unlimited_of(p: Phase) -> str:
    """The name of the unlimited phase a limited one is compared with: q2lim-5-3 -> q2."""
    return p.name.split("lim", 1)[0]


def per_batch_lines(results: list[Phase]) -> list[str]:
    """One line per qcluster phase: statements per batch, the rate-token and
    BEGIN/COMMIT shares, and for a limited phase the ratio to the unlimited one."""
    by_name = {p.name: p for p in results}
    lines = []
    for p in results:
        total = statements_per_batch(p)
        if total is None:
            continue
        tokens = statements_per_batch(p, "rate tokens") or 0.0
        control = statements_per_batch(p, "transaction control") or 0.0
        line = (
            f"  {p.label}: {total:.1f} per batch (rate tokens {tokens:.2f}, BEGIN/COMMIT {control:.1f});"
            f" {p.transactions // p.runs} batches a run"
        )
        base = by_name.get(unlimited_of(p)) if p.limits else None
        base_total = statements_per_batch(base) if base is not None else None
        if base_total:
            ratio = total / base_total
            line += f"; {ratio:.2f}x the unlimited run ({'met' if ratio <= PER_BATCH_GOAL else 'MISSED'})"
        lines.append(line)
    return lines


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
            phase = Phase(name, label, _stats_from([], [], []), limits=limits_used)
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
                    f" {_stats_from(load.transactions(), windows, []).p99_ms} ms"
                )
            phase.app = _stats_from(load.transactions(), windows, load.errors)
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
            idle = Phase("idle", "application alone (idle baseline)", _stats_from(pooled, windows, []))
            span = sum(b - a for a, b in windows)
            idle.other_cpu_cores = round(sum(o for _, o, _ in idle_samples) / span, 2) if span else 0.0
            idle.load_average = load_average()
            idle.extra["windows"] = [asdict(_stats_from(rows, [w], [])) for w, _, rows in idle_samples]
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


def _stats_from(
    rows: list[tuple[float, float, float, int]], windows: list[tuple[float, float]], errors: list[str]
) -> AppStats:
    inside = [t for t in rows if any(a <= t[0] <= b for a, b in windows)]
    seconds = sum(b - a for a, b in windows)
    lat = sorted(t[1] for t in inside)
    return AppStats(
        seconds=round(seconds, 2),
        transactions=len(inside),
        tps=round(len(inside) / seconds, 1) if seconds else 0.0,
        p50_ms=round(_percentile(lat, 50), 2),
        p99_ms=round(_percentile(lat, 99), 2),
        p99_by_script_ms={
            name: round(_percentile(sorted(t[1] for t in inside if t[3] == i), 99), 2) for i, name in enumerate(SCRIPTS)
        },
        lag_p99_ms=round(_percentile(sorted(t[2] for t in inside), 99), 2),
        errors=list(errors),
    )


def _cleanup_cores(p: Phase, app_cores: float) -> str:
    span = sum(p.cleanup_seconds)
    if not span or not p.cpu_seconds:
        return "-"
    return f"{max(0.0, p.cpu_seconds - app_cores * span) / span:.2f}"


def report(
    results: list[Phase],
    idle: Phase | None,
    *,
    ds: Dataset,
    args: argparse.Namespace,
    code: str,
    slot_hours: float,
    scope: AppScope,
) -> None:
    rate = f"{args.app_rate:g} tx/s open loop" if args.app_rate else "closed loop"
    print(
        f"\n=== bench/app_impact.py: {ds.total:,} leases ({ds.eligible:,} eligible), batch {args.batch_size};"
        f" application {rate}, {args.app_clients} connections; code: {code} ==="
    )
    print(
        f"slot interval {slot_hours:g} h; p99 goal <= {P99_GOAL}x the idle p99;"
        f" 1M projection: {ONE_MILLION_ELIGIBLE:,} eligible rows"
    )
    width = max(len(p.label) for p in results) if results else 10
    head = (
        f"{'phase':<{width}} {'runs':>4} {'cleanup s':>9} {'app tx/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'vs idle':>7} {'read':>6} {'insert':>6} {'m-cln':>6} {'m-qt':>6} {'WAL B/row':>9} {'stmts':>6}"
        f" {'cores':>5} {'other cpu':>9} {'load':>5}"
    )
    print(head)
    print("-" * len(head))
    base = idle.app.p99_ms if idle else None
    app_cores = float(idle.extra.get("app_cpu_cores", 0.0)) if idle else 0.0
    for p in results:
        s = p.app
        vs = f"{s.p99_ms / base:.2f}x" if base else "-"
        per = [f"{s.p99_by_script_ms.get(n, float('nan')):6.1f}" for n in SCRIPTS]
        secs = f"{statistics.median(p.cleanup_seconds):.2f}" if p.cleanup_seconds else "-"
        wal = f"{p.wal_per_row:9.0f}" if p.wal_per_row is not None else f"{'-':>9}"
        print(
            f"{p.label:<{width}} {p.runs:>4} {secs:>9} {s.tps:8.1f} {s.p50_ms:7.2f} {s.p99_ms:7.2f} {vs:>7}"
            f" {' '.join(per)} {wal} {p.statements if p.statements is not None else '-':>6}"
            f" {_cleanup_cores(p, app_cores):>5} {p.other_cpu_cores:9.2f} {p.load_average:5.2f}"
        )
    print(
        "\n(p99 per script: read = a property's active leases; insert = tenant activity; m-cln / m-qt = maintenance"
        " update in a cleaned / quiet portfolio. WAL B/row: pg_stat_statements.wal_bytes of the cleanup's roles /"
        " rows deleted, full_page_writes off. stmts: the cleanup's statements per run (pg_stat_statements, BEGIN/COMMIT"
        " included, the application's left out). cores: CPU the cleanup used (our processes and PostgreSQL during"
        " the run, less what the idle application used). other cpu: cores other processes on the machine used"
        " meanwhile. cleanup s: median of the runs; every run is listed below.)"
    )
    if idle and idle.extra.get("windows"):
        # The noise floor: how much the idle p99 itself moves from window to window here.
        spread = [w["p99_ms"] for w in idle.extra["windows"]]
        print(
            f"  idle p99 per window: {'/'.join(f'{x:.2f}' for x in spread)} ms"
            f" (max/min {max(spread) / min(spread):.2f}x; the pooled figure is the baseline)"
        )
    for p in results:
        if len(p.cleanup_seconds) > 1:
            print(f"  {p.label}: runs {'/'.join(f'{x:.2f}' for x in p.cleanup_seconds)} s")
    print("\nStatements per run by class (pg_stat_statements), the profile behind the figures:")
    for p in results:
        classes = p.extra.get("statements_by_class_per_run")
        if classes:
            span = statistics.mean(p.cleanup_seconds) if p.cleanup_seconds else 0
            top = ", ".join(f"{k} {v:,}" for k, v in list(classes.items())[:7])
            rate = f"{p.statements / span:,.0f}/s" if span and p.statements else "-"
            print(f"  {p.label}: {p.statements:,} ({rate}): {top}")
    lines = per_batch_lines(results)
    if lines:
        print(
            f"\nStatements per batch transaction (goal under a limit: <= {PER_BATCH_GOAL}x the unlimited run"
            " with as many workers):"
        )
        for line in lines:
            print(line)
    for p in results:
        if p.app.errors:
            print(f"{p.label}: pgbench reported {p.app.errors[:3]}")
    if base is None:
        return
    print("\nVerdict (goal: with a limit set, application p99 <= 1.2x idle and the sweep done before the next slot):")
    for p in results:
        if p.limits is None or not p.cleanup_seconds:
            continue
        g, portfolio_rate = p.limits
        ratio = p.app.p99_ms / base
        per_row_tx = p.transactions / p.rows_deleted if p.rows_deleted else 0
        per_row_big = p.transactions_big / p.rows_deleted if p.rows_deleted else 0
        # The limit binds: the sweep takes at least transactions / global rate, and the
        # big portfolio's transactions / the per-portfolio rate (they need its tokens).
        projected = max(per_row_tx * ONE_MILLION_ELIGIBLE / g, per_row_big * ONE_MILLION_ELIGIBLE / portfolio_rate)
        measured = statistics.mean(p.cleanup_seconds)
        fits = projected < slot_hours * 3600
        print(
            f"  {p.label}: p99 {p.app.p99_ms:.1f} ms = {ratio:.2f}x idle ({'met' if ratio <= P99_GOAL else 'MISSED'});"
            f" sweep {measured:.1f} s here ({p.transactions // max(p.runs, 1)} transactions,"
            f" {p.transactions_big // max(p.runs, 1)} of them the big portfolio's), projected at 1M"
            f" {projected / 60:.1f} min against a {slot_hours:g} h slot ({'fits' if fits else 'DOES NOT FIT'})"
        )


if __name__ == "__main__":
    main()
