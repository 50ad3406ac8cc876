"""The pipeline's runs, each against a fresh copy of the dataset and each verified
(the DELETE loops it is compared with are in ``bench/baselines.py``):

* ``run_qcluster``: ``sweep_trigger`` then real ``manage.py qcluster`` processes
  (supervised by ``harness.qcluster``) until nothing is open;
* ``run_child``: ``cleanup_drain`` in a child process (``pipeline.py --child``,
  which runs ``child_main`` here), plain or counted per statement class
  (``bench/statements.py``);
* ``admission_phase``: ``sweep_trigger`` over 10,000 partitions per record kind.

Every run's statements are also counted server-side (``pg_stat_statements``) when
``STATS`` is set (``pipeline.py`` does), from just before its timed part to just after
(``ServerCount``, which the baselines use too).
"""

# ruff: noqa: S603 - starts this venv's python on pipeline.py by design

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import cputime
from bench.common import ROOT, django_setup, log, sql
from bench.dataset import Dataset, cleanup_tables, record_tables, verify
from bench.instrument import TIMED, StatementCounter, Timer, patch_everywhere, timing
from bench.statements import PgStats
from harness.qcluster import QCluster

PIPELINE = ROOT / "bench" / "pipeline.py"  # the child runs go through its (hidden) --child flag
STATS: PgStats | None = None  # set by pipeline.py: server-side statement counts of every run
CPU_ROOTS: set[int] = set()  # set by pipeline.py: this process and our postmaster (CPU seconds of a run)
STALL_SECONDS = 120.0  # a qcluster run with no job finishing for this long has failed


class ServerCount:
    """Server-side counts and CPU seconds of one run: ``begin()`` just before its timed
    part, ``end()`` just after (before verification)."""

    def __init__(self) -> None:
        self.mark: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.cpu: float | None = None
        self.cpu_db: float | None = None
        self.app_mark: cputime.Snapshot | None = None
        self.db_mark: cputime.Snapshot | None = None

    @staticmethod
    def _roots() -> tuple[set[int], set[int]]:
        app = {os.getpid()} & CPU_ROOTS
        return app, CPU_ROOTS - app

    def begin(self) -> None:
        if STATS is not None:
            self.mark = STATS.start()
        if CPU_ROOTS:
            app, db = self._roots()
            self.app_mark, self.db_mark = cputime.snapshot(app), cputime.snapshot(db)

    def end(self, *, app_cpu: float | None = None) -> None:
        """``app_cpu``: the client side's CPU when the caller knows it better (the drain
        child reports its timed part's own CPU, without its start-up)."""
        if CPU_ROOTS and self.app_mark is not None and self.db_mark is not None:
            app, db = self._roots()
            self.cpu_db = cputime.delta(self.db_mark, cputime.snapshot(db))
            if app_cpu is None:
                app_cpu = cputime.delta(self.app_mark, cputime.snapshot(app))
            self.cpu = app_cpu + self.cpu_db
        if STATS is not None and self.mark is not None:
            self.result = STATS.stop(self.mark).as_json()

    def into(self, extra: dict[str, Any]) -> dict[str, Any]:
        if self.result is not None:
            extra["server"] = self.result
        if CPU_ROOTS and self.cpu is not None:
            extra["cpu_seconds"] = round(self.cpu, 2)
            extra["cpu_db_seconds"] = round(self.cpu_db or 0.0, 2)
        return extra


@dataclass
class RunResult:
    label: str
    seconds: float
    deleted: int
    ok: bool
    admission_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Wall-clock (epoch) start and end of the timed part: what a concurrent workload
    # measured alongside (bench/app_impact.py) counts as "during the run".
    window: tuple[float, float] | None = None


def small_portfolio_fairness(finished_at: dict[int, float], total: float) -> dict[str, Any]:
    """When each small portfolio was fully cleaned, as a share of the whole drain (p50, p95).

    ``finished_at``: property id -> seconds from the start until its last row went."""
    owners = dict(sql("SELECT id, portfolio_id FROM properties_property"))
    big = sql(
        "SELECT portfolio_id FROM properties_property GROUP BY portfolio_id"
        " ORDER BY count(*) DESC, portfolio_id LIMIT 1"
    )[0][0]
    done: dict[int, float] = {}
    for prop, at in finished_at.items():
        portfolio = owners.get(prop)
        if portfolio is not None and portfolio != big:
            done[portfolio] = max(done.get(portfolio, 0.0), at)
    if not done or total <= 0:
        return {}
    shares = sorted(v / total for v in done.values())
    return {
        "small_done_share_p50": round(statistics.median(shares), 3),
        "small_done_share_p95": round(shares[max(0, int(len(shares) * 0.95) - 1)], 3),
    }


def run_qcluster(
    ds: Dataset,
    workers: int,
    slot: datetime,
    env: dict[str, str],
    log_dir: Path,
    live: list[QCluster],
    window: int = 0,
    nice: int = 0,
    settle: float = 0.0,
) -> RunResult:
    """``sweep_trigger`` then a real ``qcluster`` with ``workers`` workers until no job is open.

    ``live`` holds the running cluster so that the caller can stop it on any exit path;
    ``nice`` (--nice) is given to the cluster's processes; ``settle``: seconds to wait
    between the cluster being ready and the trigger (its start-up's CPU then stays out
    of a concurrent measurement's window)."""
    from django.conf import settings
    from django.utils import timezone

    from cleanup_ops import dispatch
    from cleanup_ops.schedule import sweep_trigger

    # The dispatcher's window (default 2 x workers) is computed in every process
    # that dispatches: this one (the trigger) and the workers (after each slice).
    settings.Q_CLUSTER["workers"] = workers
    settings.CLEANUP_DISPATCH_WINDOW = window
    cluster = QCluster(
        # INFO: wait_ready and sample_rss find the worker pids in its log.
        {**env, "CLEANUP_DISPATCH_WINDOW": str(window), "LOG_LEVEL": "INFO"},
        cwd=ROOT,
        workers=workers,
        log_path=log_dir / f"qcluster-{workers}w-{time.monotonic_ns()}.log",
        nice=nice,
        log=log,
    )
    live.append(cluster)
    server = ServerCount()
    try:
        cluster.wait_ready()
        if settle:
            time.sleep(settle)
        wake = Timer()
        with _watch() as watch:
            # The dispatcher call admission makes on commit is timed apart from admission.
            with timing(dispatch, "dispatch_due_jobs", wake):
                server.begin()
                trigger_at = timezone.now()
                epoch = time.time()
                started = time.perf_counter()
                sweep_trigger(slot=slot)
                admission = time.perf_counter() - started - wake.total
            deadline = time.monotonic() + 3600
            progress, progress_at, polls = -1, time.monotonic(), 0
            while _open_jobs(watch):
                if cluster.poll() is not None:
                    raise RuntimeError(f"qcluster died:\n{cluster.log_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("pipeline did not drain within an hour")
                polls += 1
                if polls % 40 == 0:  # every ~2 s: is anything finishing at all?
                    done = _done_jobs(watch)
                    if done != progress:
                        progress, progress_at = done, time.monotonic()
                    elif time.monotonic() - progress_at > STALL_SECONDS:
                        raise RuntimeError(
                            f"no job finished for {STALL_SECONDS:.0f} s; the cluster's log ends:\n"
                            f"{cluster.log_text()[-3000:]}"
                        )
                cluster.sample_rss()
                time.sleep(0.05)
            seconds = time.perf_counter() - started
            server.end()
        cluster.sample_rss()
        qwindow = (epoch, epoch + seconds)
    finally:
        cluster.stop()
        live.remove(cluster)
        settings.CLEANUP_DISPATCH_WINDOW = 0
    check = verify(ds, f"qcluster {workers}w", pipeline=True)
    extra = pipeline_stats(trigger_at, serial=workers == 1 and ds.shape == "backlog", fairness=ds.shape == "backlog")
    extra["worker_peak_rss_mb"] = round(max(cluster.peak_kb.values(), default=0) / 1024, 1)
    extra["worker_processes"] = len(cluster.worker_pids)
    extra["dispatch_seconds"] = round(wake.total, 4)
    label = f"pipeline: qcluster, {workers} worker{'s' if workers > 1 else ''}"
    return RunResult(
        label + (f", window {window}" if window else ""),
        seconds,
        check["deleted"],
        check["ok"],
        admission,
        server.into(extra),
        window=qwindow,
    )


@contextmanager
def _watch() -> Iterator[Any]:
    """The benchmark's polling connection: its own role when ``STATS`` has one, so its
    queries stay out of the server-side counts; else Django's connection."""
    if STATS is None:
        from django.db import connection

        yield connection
        return
    conn = STATS.watcher()
    try:
        yield conn
    finally:
        conn.close()


def _watch_one(conn: Any, sql_text: str) -> Any:
    if hasattr(conn, "execute") and not hasattr(conn, "vendor"):
        return conn.execute(sql_text).fetchone()[0]
    return sql(sql_text)[0][0]


def _open_jobs(conn: Any) -> bool:
    return bool(
        _watch_one(conn, "SELECT EXISTS (SELECT 1 FROM cleanup_ops_cleanupjob WHERE state IN ('pending', 'leased'))")
    )


def _done_jobs(conn: Any) -> int:
    return int(_watch_one(conn, "SELECT count(*) FROM cleanup_ops_cleanupjob WHERE state NOT IN ('pending', 'leased')"))


def pipeline_stats(trigger_at: datetime | None = None, *, serial: bool = True, fairness: bool = True) -> dict[str, Any]:
    """Jobs, slices, batches and broker tasks; for a serial run (one worker or the
    drain) also where the time between batches went, from ledger and task timestamps."""
    from django.conf import settings
    from django.db.models import Count, Sum
    from django_q.models import Task

    from cleanup_ops.models import CleanupJob, LedgerEntry

    agg = CleanupJob.objects.aggregate(jobs=Count("id"), slices=Sum("leases"), batches=Sum("batches"))
    # django-q2's Task.started is the enqueue time; stopped is when the function returned.
    tasks = list(
        Task.objects.filter(func="cleanup_ops.tasks.run_job").values_list("name", "started", "stopped", "result")
    )
    noops = [
        (name, sent)
        for name, sent, _, result in tasks
        if isinstance(result, dict)
        and not (result.get("batches") or result.get("slices") or result.get("rows_deleted"))
    ]
    sends: dict[str, list[datetime]] = defaultdict(list)
    for name, sent, _, _ in tasks:
        sends[name].append(sent)
    from cleanup_ops.models import Sweep

    stats: dict[str, Any] = {
        "admitted": Sweep.objects.aggregate(n=Sum("jobs_admitted"))["n"] or 0,
        "jobs": agg["jobs"],
        "slices": agg["slices"] or 0,
        "ledger_batches": agg["batches"] or 0,
        "broker_tasks": len(tasks),
        # A message whose lease UPDATE matched nothing (job already leased or finished).
        "noop_tasks": len(noops),
        # ... of which another message for the same job was sent within 100 ms (two dispatchers raced).
        "noop_tasks_duplicate_send": sum(
            1
            for name, sent in noops
            if any(other != sent and abs((other - sent).total_seconds()) < 0.1 for other in sends[name])
        ),
        "dispatch_tasks": Task.objects.filter(func="cleanup_ops.tasks.dispatch").count(),
    }
    entries = list(LedgerEntry.objects.order_by("applied_at", "id").values_list("job_id", "applied_at"))
    if trigger_at and entries:
        stats["first_batch_after_trigger_ms"] = round((entries[0][1] - trigger_at).total_seconds() * 1000, 1)
    # A batch transaction stamps all its ledger rows with one applied_at.
    stamps = sorted({at for _, at in entries})
    if stamps:
        stats["transactions"] = len(stamps)
        # Issue 40's stable figures: job leases and broker hand-offs per batch
        # transaction, leases given back with work left, batches per turn (a
        # turn: a broker task that leased something).
        finished = CleanupJob.objects.filter(job_kind="delete", state="done").count()
        turns = sum(1 for _, _, _, result in tasks if isinstance(result, dict) and result.get("slices"))
        stats["releases_with_work_left"] = stats["slices"] - finished
        stats["job_leases_per_transaction"] = round(stats["slices"] / len(stamps), 3)
        stats["handoffs_per_1000_transactions"] = round(1000 * len(tasks) / len(stamps), 1)
        if turns:
            stats["turns"] = turns
            stats["transactions_per_turn"] = round(len(stamps) / turns, 1)
        stats["batches_span_s"] = round((stamps[-1] - stamps[0]).total_seconds(), 3)
        if len(stamps) > 1:
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
            stats["tx_gap_ms_median"] = round(statistics.median(gaps) * 1000, 2)
    jobs = list(
        CleanupJob.objects.filter(job_kind="delete").values_list(
            "property_id", "created_at", "first_leased_at", "finished_at"
        )
    )
    start = min((created for _, created, _, _ in jobs), default=None)
    end = max((f for _, _, _, f in jobs if f), default=None)
    if start and end:
        per_property: dict[int, float] = {}
        for prop, _, _, fin in jobs:
            if fin:
                per_property[prop] = max(per_property.get(prop, 0.0), (fin - start).total_seconds())
        if fairness:
            stats.update(small_portfolio_fairness(per_property, (end - start).total_seconds()))
        waits = sorted((first - created).total_seconds() for _, created, first, _ in jobs if first)
        if waits:
            stats["first_lease_wait_s_p50"] = round(statistics.median(waits), 2)
            stats["first_lease_wait_s_p95"] = round(waits[max(0, int(len(waits) * 0.95) - 1)], 2)
    if not serial:
        return stats
    # Ledger rows in time order: a gap between two batches of the same job within a
    # slice is one batch; any other gap also holds the slice boundary (final empty
    # batch, release, dispatch, broker hand-off, next lease).
    per_job: dict[int, int] = defaultdict(int)
    intra, inter = [], []
    for (job_a, at_a), (job_b, at_b) in itertools.pairwise(entries):
        per_job[job_a] += 1
        gap = (at_b - at_a).total_seconds()
        if job_a == job_b and per_job[job_a] % settings.CLEANUP_SLICE_BATCHES:
            intra.append(gap)
        else:
            inter.append(gap)
    if intra:
        stats["batch_gap_ms_median"] = round(statistics.median(intra) * 1000, 2)
    if inter:
        stats["slice_gap_ms_median"] = round(statistics.median(inter) * 1000, 2)
        stats["slice_gaps"] = len(inter)
        stats["slice_gap_seconds_total"] = round(sum(inter), 2)
    if tasks:
        # Hand-off: from a task returning to the next batch starting (the broker's
        # part plus the next lease); with one worker nothing else runs in between.
        applied = [at for _, at in entries]
        handoffs = []
        for stop in sorted(t[2] for t in tasks):
            i = bisect.bisect_right(applied, stop)
            if i < len(applied):
                handoffs.append((applied[i] - stop).total_seconds())
        if handoffs:
            stats["handoff_ms_median"] = round(statistics.median(handoffs) * 1000, 1)
            if len(handoffs) > 1:  # quantiles needs two points; one task can now drain a small dataset
                stats["handoff_ms_p90"] = round(statistics.quantiles(handoffs, n=10)[-1] * 1000, 1)
            stats["handoff_seconds_total"] = round(sum(handoffs), 2)
    return stats


def run_child(
    mode: str, ds: Dataset, slot: datetime, batch: int, env: dict[str, str], extra_env: dict[str, str] | None = None
) -> RunResult:
    """``cleanup_drain`` in a fresh process (so ru_maxrss is the drain's own peak).

    ``mode``: ``drain`` (plain, the timed run) or ``count`` (the same with the execute
    wrapper counting statements per class and per-function timers; slightly slower)."""
    child_env = {**env, "Q_SYNC": "true", **(extra_env or {})}
    argv = [sys.executable, str(PIPELINE), "--child", mode, "--slot", slot.isoformat()]
    server = ServerCount()
    server.begin()
    out = subprocess.run(
        [*argv, "--batch-size", str(batch)],
        cwd=ROOT,
        env=child_env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    # The client side: the child's own CPU in its timed part (not its start-up or exit).
    server.end(app_cpu=data["cpu_timed"])
    check = verify(ds, mode, pipeline=True)
    stats = pipeline_stats(serial=ds.shape == "backlog", fairness=ds.shape == "backlog")
    label = "pipeline: cleanup_drain (1 process)" if mode == "drain" else "cleanup_drain, statements counted"
    if extra_env:
        label = "cleanup_drain, " + ", ".join(f"{k}={v}" for k, v in extra_env.items())
    extra = {**stats, "maxrss_mb": round(data["maxrss_kb"] / 1024, 1), **data.get("extra", {})}
    return RunResult(
        label, data["seconds"], check["deleted"], check["ok"], data["admission_seconds"], server.into(extra)
    )


# --------------------------------------------------------------------------- child process


def child_main(args: argparse.Namespace) -> None:
    django_setup(args.batch_size)
    from django.db import connection

    from cleanup_ops import dispatch
    from cleanup_ops.execution import runner
    from cleanup_ops.schedule import sweep_trigger

    slot = datetime.fromisoformat(args.slot)
    wake = Timer()
    extra: dict[str, Any] = {}
    counter = StatementCounter() if args.child == "count" else None
    connection.ensure_connection()  # its start-up is not the drain's
    timers: dict[str, Timer] = {}
    if counter:
        # runner (imported above) has loaded every module that imports these names.
        for module, attribute in TIMED:
            timer = timers.setdefault(attribute.rsplit(".", 1)[-1], Timer())
            patch_everywhere(module, attribute, timer.wrap)
        counter.install_sections()
        commit_timer = Timer()
        connection.ensure_connection()
        connection._commit = commit_timer.wrap(connection._commit)
        timers["COMMIT (connection.commit)"] = commit_timer
    cpu_started = time.process_time()
    started = time.perf_counter()
    if counter:
        with counter.active():
            with timing(dispatch, "dispatch_due_jobs", wake):
                result_trigger = sweep_trigger(slot=slot)
            admission = time.perf_counter() - started - wake.total
            result = runner.cleanup_drain()
    else:
        # The dispatcher call admission makes on commit is timed apart from admission.
        with timing(dispatch, "dispatch_due_jobs", wake):
            result_trigger = sweep_trigger(slot=slot)
        admission = time.perf_counter() - started - wake.total
        profile_to = os.environ.get("BENCH_PROFILE")
        if profile_to:
            # BENCH_PROFILE=path: the drain under cProfile (slower; for finding the client's cost),
            # timed in the process's CPU seconds: wall time would count every wait for the server.
            import cProfile

            with cProfile.Profile(time.process_time) as profiler:
                result = runner.cleanup_drain()
            profiler.dump_stats(profile_to)
        else:
            result = runner.cleanup_drain()
    seconds = time.perf_counter() - started
    cpu_timed = time.process_time() - cpu_started
    extra["slices_run"] = result.slices
    extra["admitted_by_trigger"] = result_trigger.sweep.jobs_admitted
    if counter:
        extra["counted"] = counter.counts.as_json()
        extra["counted"]["sections"] = counter.installed
        extra["timers"] = {name: [t.calls, round(t.total, 4)] for name, t in timers.items() if t.calls}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "admission_seconds": admission,
                "rows_deleted": result.rows_deleted,
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "cpu_timed": cpu_timed,
                "extra": extra,
            }
        )
    )


# --------------------------------------------------------------------------- admission


def admission_phase(slot: datetime, properties_per_portfolio: int = 100, portfolios: int = 100) -> dict[str, Any]:
    """``portfolios`` x ``properties_per_portfolio`` new properties, each with expired rows
    of every record kind that has policies (partitions = properties x kinds); time
    ``sweep_trigger``, which creates the sweep and admits the jobs."""
    from django.conf import settings

    from cleanup_ops import admission, dispatch
    from cleanup_ops.schedule import sweep_trigger
    from retention.registry import get_spec

    kinds = [k for (k,) in sql("SELECT DISTINCT record_kind FROM retention_retentionpolicy ORDER BY 1")]
    sql(f"TRUNCATE {cleanup_tables()}, {record_tables()}, retention_legalhold RESTART IDENTITY CASCADE")
    sql(
        "INSERT INTO properties_property (portfolio_id, name)"
        " SELECT po.id, 'Admission ' || po.id || '/' || g"
        " FROM (SELECT id FROM properties_portfolio ORDER BY id LIMIT %s) po"
        " CROSS JOIN generate_series(1, %s) g ORDER BY po.id, g",
        [portfolios, properties_per_portfolio],
    )
    # Three rows per new property and kind: two past the cutoff, one recent.
    columns = {
        "lease": ("unit, tenant_name, started_on, ended_at", "'U', 'T', (%(slot)s - interval '900 days')::date, {ts}"),
        "maintenance_record": ("summary, opened_at, closed_at", "'W', %(slot)s - interval '900 days', {ts}"),
        "tenant_activity": ("activity_type, details, occurred_at", "'payment', '', {ts}"),
    }
    for kind in kinds:
        spec = get_spec(kind)
        cols, values = columns[kind]
        ts = (
            "CASE WHEN k = 3 THEN %(slot)s - interval '1 day'"
            " ELSE %(slot)s - interval '400 days' - k * interval '1 day' END"
        )
        sql(
            f"INSERT INTO {spec.table} (portfolio_id, property_id, {cols})"
            f" SELECT p.portfolio_id, p.id, {values.format(ts=ts)}"
            " FROM properties_property p CROSS JOIN generate_series(1, 3) k WHERE p.name LIKE 'Admission %%'"
            " ORDER BY p.id, k",
            {"slot": slot},
        )
        sql(f"VACUUM ANALYZE {spec.table}")
    sql("VACUUM ANALYZE properties_property")
    for table in cleanup_tables().split(", "):
        sql(f"VACUUM ANALYZE {table}")
    settings.Q_CLUSTER["workers"] = 2
    wake, parts = Timer(), Timer()
    server = ServerCount()
    with timing(dispatch, "dispatch_due_jobs", wake), timing(admission, "partitions_due", parts):
        server.begin()
        started = time.perf_counter()
        result = sweep_trigger(slot=slot)
        total = time.perf_counter() - started
        server.end()
    # One more dispatcher call with every job due and an empty broker (what a worker
    # pays after a turn early in such a sweep). Emptied through django-q2's broker
    # interface, whichever Q_BROKER runs.
    for queue in dispatch.queues():
        dispatch.broker(queue).purge_queue()
    sql("UPDATE cleanup_ops_cleanupjob SET enqueued_at = NULL")
    started = time.perf_counter()
    dispatch.dispatch_due_jobs()
    dispatch_again = time.perf_counter() - started
    for queue in dispatch.queues():
        dispatch.broker(queue).purge_queue()
    out = {
        "partitions": result.sweep.jobs_admitted,
        "kinds": len(kinds),
        "properties": portfolios * properties_per_portfolio,
        "trigger_seconds": total,
        "admission_seconds": total - wake.total,
        "partitions_due_seconds": parts.total if parts.calls else None,
        "dispatch_seconds": wake.total,
        "dispatch_open_seconds": dispatch_again,
    }
    if server.result:
        out["server"] = server.result
    return out
