"""The benchmark's runs, each against a fresh copy of the dataset and each verified:

* ``run_loop`` / ``run_single_delete`` / ``run_loop_ranged``: the DELETE loops the
  product replaces and the database's one-statement ceiling, in this process;
* ``run_qcluster``: ``sweep_trigger`` then real ``manage.py qcluster`` processes
  (supervised by ``harness.qcluster``) until nothing is open;
* ``run_child``: ``cleanup_drain`` in a child process (``pipeline.py --child``,
  which runs ``child_main`` here), plain or profiled per function and statement;
* ``admission_phase``: ``sweep_trigger`` over 10,000 partitions.
"""

# ruff: noqa: S603 - starts this venv's python on pipeline.py by design

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import ROOT, django_setup, log, sql
from bench.dataset import KIND, RETENTION_DAYS, TABLE, Dataset, cleanup_tables, verify
from harness.qcluster import QCluster

PIPELINE = ROOT / "bench" / "pipeline.py"  # the child runs go through its (hidden) --child flag
DUMMY_KEY = "bench-dummy"


@dataclass
class RunResult:
    label: str
    seconds: float
    deleted: int
    ok: bool
    admission_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_loop(ds: Dataset, batch: int, slot: datetime) -> RunResult:
    """The design the product replaces: one process, a keyset DELETE loop per property."""
    from django.db import connection

    from retention.eligibility import eligible_sql

    props = _loop_properties()
    batches = 0
    deleted = 0
    finished: dict[int, float] = {}
    started = time.perf_counter()
    with connection.cursor() as cur:  # autocommit: every statement is its own transaction
        for prop_id, days in props:
            pred, params = eligible_sql(KIND, cutoff=slot - timedelta(days=days), alias="r")
            after = 0
            while True:
                cur.execute(
                    f"WITH d AS (DELETE FROM {TABLE} WHERE id IN (SELECT r.id FROM {TABLE} r"
                    f" WHERE r.property_id = %s AND r.id > %s AND {pred} ORDER BY r.property_id, r.id LIMIT %s)"
                    " RETURNING id) SELECT count(*), max(id) FROM d",
                    [prop_id, after, *params, batch],
                )
                n, last = cur.fetchone()
                batches += 1
                deleted += n
                if n < batch:
                    break
                after = last
            finished[prop_id] = time.perf_counter() - started
    seconds = time.perf_counter() - started
    check = verify(ds, "loop")
    extra = {"batches": batches, **small_portfolio_fairness(finished, seconds)}
    return RunResult("DELETE loop (1 process)", seconds, check["deleted"], check["ok"], extra=extra)


def run_single_delete(ds: Dataset, slot: datetime) -> RunResult:
    """The database's ceiling: one DELETE statement with the whole predicate, one transaction."""
    from django.db import connection

    from retention.eligibility import eligible_sql

    pred, params = eligible_sql(KIND, cutoff=slot - timedelta(days=RETENTION_DAYS), alias=TABLE)
    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(f"DELETE FROM {TABLE} WHERE {pred}", params)
    seconds = time.perf_counter() - started
    check = verify(ds, "one DELETE")
    return RunResult("one DELETE statement (ceiling)", seconds, check["deleted"], check["ok"])


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


def run_loop_ranged(ds: Dataset, batch: int, slot: datetime) -> RunResult:
    """The loop with run_batch's two data statements and nothing else: the next ``batch``
    expired ids after the cursor (index-only), then a ranged DELETE with the predicate.
    The difference to ``cleanup_drain`` is the protocol (leases, locks, ledger, jobs)."""
    from django.db import connection

    from retention.eligibility import db_datetime, eligible_sql

    props = _loop_properties()
    batches = 0
    deleted = 0
    select_seconds = delete_seconds = 0.0
    started = time.perf_counter()
    with connection.cursor() as cur:
        for prop_id, days in props:
            cutoff = slot - timedelta(days=days)
            pred, params = eligible_sql(KIND, cutoff=cutoff, alias=TABLE)
            after = 0
            while True:
                t0 = time.perf_counter()
                cur.execute(
                    f"SELECT COUNT(*), MAX(c.id) FROM (SELECT r.id FROM {TABLE} r WHERE r.property_id = %s"
                    " AND r.id > %s AND r.ended_on < %s ORDER BY r.property_id, r.id LIMIT %s) c",
                    [prop_id, after, db_datetime(cutoff), batch],
                )
                candidates, last = cur.fetchone()
                t1 = time.perf_counter()
                select_seconds += t1 - t0
                if not candidates:
                    break
                cur.execute(
                    f"DELETE FROM {TABLE} WHERE {TABLE}.property_id = %s AND {TABLE}.id > %s AND {TABLE}.id <= %s"
                    f" AND {pred}",
                    [prop_id, after, last, *params],
                )
                delete_seconds += time.perf_counter() - t1
                batches += 1
                deleted += cur.rowcount
                if candidates < batch:
                    break
                after = last
    seconds = time.perf_counter() - started
    check = verify(ds, "loop, ranged")
    extra = {
        "batches": batches,
        "candidates_ms_per_batch": round(1000 * select_seconds / max(batches, 1), 2),
        "delete_ms_per_batch": round(1000 * delete_seconds / max(batches, 1), 2),
    }
    return RunResult("DELETE loop, run_batch's 2 statements", seconds, check["deleted"], check["ok"], extra=extra)


def _loop_properties() -> list[tuple[int, int]]:
    """(property id, retention days of its portfolio's active policy) in property order."""
    return sql(
        "SELECT p.id, v.retention_days FROM properties_property p"
        " JOIN retention_retentionpolicy rp ON rp.portfolio_id = p.portfolio_id AND rp.record_kind = %s"
        " JOIN retention_policyversion v ON v.policy_id = rp.id AND v.status = 'approved' AND v.enabled"
        " ORDER BY p.id",
        [KIND],
    )


def run_qcluster(
    ds: Dataset,
    workers: int,
    slot: datetime,
    env: dict[str, str],
    log_dir: Path,
    live: list[QCluster],
    window: int = 0,
    nice: int = 0,
) -> RunResult:
    """``sweep_trigger`` then a real ``qcluster`` with ``workers`` workers until no job is open.

    ``live`` holds the running cluster so that the caller can stop it on any exit path;
    ``nice`` (--nice) is given to the cluster's processes."""
    from django.conf import settings
    from django.utils import timezone

    from cleanup_ops import dispatch
    from cleanup_ops.models import CleanupJob
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
    try:
        cluster.wait_ready()
        wake = _Timer()
        # The dispatcher call admission makes on commit is timed apart from admission.
        with timing(dispatch, "dispatch_due_jobs", wake):
            trigger_at = timezone.now()
            started = time.perf_counter()
            sweep_trigger(slot=slot)
            admission = time.perf_counter() - started - wake.total
        deadline = time.monotonic() + 3600
        while CleanupJob.objects.open().exists():
            if cluster.poll() is not None:
                raise RuntimeError(f"qcluster died:\n{cluster.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("pipeline did not drain within an hour")
            cluster.sample_rss()
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        cluster.sample_rss()
    finally:
        cluster.stop()
        live.remove(cluster)
        settings.CLEANUP_DISPATCH_WINDOW = 0
    check = verify(ds, f"qcluster {workers}w")
    extra = pipeline_stats(trigger_at, serial=workers == 1)
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
        extra,
    )


def pipeline_stats(trigger_at: datetime | None = None, *, serial: bool = True) -> dict[str, Any]:
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
    noops = [(name, sent) for name, sent, _, result in tasks if isinstance(result, dict) and not result.get("batches")]
    sends: dict[str, list[datetime]] = defaultdict(list)
    for name, sent, _, _ in tasks:
        sends[name].append(sent)
    stats: dict[str, Any] = {
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
    jobs = list(
        CleanupJob.objects.filter(kind="delete").values_list(
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


@contextmanager
def timing(module: Any, name: str, timer: _Timer) -> Iterator[None]:
    """Time calls to ``module.name`` (looked up by name at call time) while inside; a no-op if it is gone."""
    original = getattr(module, name, None)
    if not callable(original):
        yield
        return
    setattr(module, name, timer.wrap(original))
    try:
        yield
    finally:
        setattr(module, name, original)


class _Timer:
    def __init__(self) -> None:
        self.total = 0.0
        self.calls = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - started
                self.calls += 1

        return wrapper


def run_child(mode: str, ds: Dataset, slot: datetime, batch: int, env: dict[str, str]) -> RunResult:
    """``cleanup_drain`` in a fresh process (so ru_maxrss is the drain's own peak)."""
    child_env = {**env, "Q_SYNC": "true" if mode == "drain" else "false"}
    argv = [sys.executable, str(PIPELINE), "--child", mode, "--slot", slot.isoformat()]
    out = subprocess.run(
        [*argv, "--batch-size", str(batch)],
        cwd=ROOT,
        env=child_env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    check = verify(ds, mode)
    stats = pipeline_stats()
    label = "pipeline: cleanup_drain (1 process)" if mode == "drain" else "cleanup_drain, profiled"
    extra = {**stats, "maxrss_mb": round(data["maxrss_kb"] / 1024, 1), **data.get("extra", {})}
    return RunResult(label, data["seconds"], check["deleted"], check["ok"], data["admission_seconds"], extra)


# --------------------------------------------------------------------------- child process


SQL_CLASSES = [
    ("lock job (FOR UPDATE, fencing)", "SELECT cursor FROM cleanup_ops_cleanupjob"),
    ("lock scope + read policy (FOR SHARE)", "FOR SHARE OF p, po"),
    ("ledger replay check + candidates", "SELECT (SELECT last_id FROM"),
    ("DELETE", f"DELETE FROM {TABLE}"),
    ("ledger INSERT", "INSERT INTO cleanup_ops_ledgerentry"),
    ("job cursor/lease UPDATE", "UPDATE cleanup_ops_cleanupjob SET cursor"),
    ("job finish UPDATE", "UPDATE cleanup_ops_cleanupjob SET state = %s, outcome"),
]


DISPATCH_SIM = "dispatch_due_jobs (after every slice, as run_job; 1 free slot)"
# What the profile times per call, as (module, attribute): functions, or a queryset
# method as "Class.method" (the manager looks it up on the queryset at call time).
# Those that do not exist (any more) are skipped.
PROFILED = (
    ("cleanup_ops.execution.batches", "run_batch"),
    ("cleanup_ops.execution.leases", "job_lease"),
    ("cleanup_ops.execution.leases", "job_release"),
    ("cleanup_ops.execution.batches", "job_load"),
    ("cleanup_ops.models", "SweepQuerySet.mark_drained_if_finished"),
    ("cleanup_ops.execution.batches", "outcome_of"),
    ("cleanup_ops.execution.leases", "wait_for_token"),
    ("cleanup_ops.recovery.failures", "job_fail"),
)


def patch_everywhere(module: str, attribute: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``module.attribute`` by ``wrap(it)`` in its module and in every loaded
    cleanup_ops module that imported it by name (``from … import run_batch``), so that
    calls from any module go through the wrapper. False if it does not exist."""
    import importlib

    owner: Any = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    original = getattr(owner, name, None) if owner is not None else None
    if not callable(original):
        return False
    wrapped = wrap(original)
    setattr(owner, name, wrapped)
    if not path:
        for loaded_name, loaded in list(sys.modules.items()):
            if loaded_name.startswith("cleanup_ops") and getattr(loaded, name, None) is original:
                setattr(loaded, name, wrapped)
    return True


def _batch_kind(result: Any) -> str:
    """run_batch returns (rows deleted, outcome if the job ended)."""
    return "ends the job" if isinstance(result, tuple) and len(result) > 1 and result[1] else "deletes"


def classify(statement: str) -> str:
    for name, needle in SQL_CLASSES:
        if needle in statement:
            return name
    verb = statement.split(None, 1)[0].upper() if statement.strip() else "?"
    match = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', statement)
    return f"other: {verb} {match.group(1) if match else ''}".strip()


class Profile:
    def __init__(self) -> None:
        self.stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        self.section = ""

    def add(self, key: str, seconds: float) -> None:
        entry = self.stats[key]
        entry[0] += 1
        entry[1] += seconds

    def timed(
        self, name: str, fn: Callable[..., Any], split: Callable[[Any], str] | None = None, by_caller: bool = False
    ) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer, self.section = self.section, name
            started = time.perf_counter()
            key = f"{name} [in {(outer or 'cleanup_drain').split(' ')[0]}]" if by_caller else name
            try:
                result = fn(*args, **kwargs)
                if split:
                    key = f"{name} ({split(result)})"
                return result
            finally:
                self.add(f"fn: {key}", time.perf_counter() - started)
                self.section = outer

        return wrapper

    def execute_wrapper(self, execute, statement, params, many, context):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return execute(statement, params, many, context)
        finally:
            self.add(f"sql[{self.section or '-'}]: {classify(statement)}", time.perf_counter() - started)


def child_main(args: argparse.Namespace) -> None:
    django_setup(args.batch_size)
    from django.conf import settings
    from django.db import connection

    from cleanup_ops import dispatch
    from cleanup_ops.execution import runner
    from cleanup_ops.models import CleanupJob
    from cleanup_ops.schedule import sweep_trigger

    slot = datetime.fromisoformat(args.slot)
    wake = _Timer()
    extra: dict[str, Any] = {}
    prof = Profile() if args.child == "profile" else None
    if prof:
        from django_q.models import OrmQ

        # runner (imported above) has loaded every module that imports these names, so
        # patch_everywhere leaves no unpatched copy behind.
        for module, attribute in PROFILED:
            name = attribute.rsplit(".", 1)[-1]
            split = _batch_kind if name == "run_batch" else None
            patch_everywhere(module, attribute, lambda fn, name=name, split=split: prof.timed(name, fn, split))
        # In the dispatcher and in the drain (which picks its jobs with it), told apart by caller.
        patch_everywhere(
            "cleanup_ops.dispatch", "fair_due_job_ids", lambda fn: prof.timed("fair_due_job_ids", fn, by_caller=True)
        )
        patch_everywhere("cleanup_ops.dispatch", "_send", lambda fn: prof.timed("_send (async_task after commit)", fn))
        real_dispatch = dispatch.dispatch_due_jobs
        timed_dispatch = prof.timed(DISPATCH_SIM, real_dispatch)
        real_slice = runner.job_run_slice
        timed_slice = prof.timed("job_run_slice", real_slice)

        def slice_then_dispatch(*a: Any, **kw: Any) -> Any:
            result = timed_slice(*a, **kw)
            # What run_job does after every slice. One worker's steady state: a
            # window of 2, one message (the dummy) already waiting, so it sends one.
            timed_dispatch()
            OrmQ.objects.exclude(key=DUMMY_KEY).delete()
            CleanupJob.objects.filter(enqueued_at__isnull=False).update(enqueued_at=None)
            return result

        runner.job_run_slice = slice_then_dispatch  # cleanup_drain looks it up in runner at call time
        settings.Q_CLUSTER["workers"] = 1
        settings.Q_CLUSTER["sync"] = True  # the trigger's own dispatch: off
    started = time.perf_counter()
    # The dispatcher call admission makes on commit is timed apart from admission.
    with timing(dispatch, "dispatch_due_jobs", wake):
        sweep_trigger(slot=slot)
    admission = time.perf_counter() - started - wake.total
    if prof:
        from django.utils import timezone
        from django_q.models import OrmQ

        settings.Q_CLUSTER["sync"] = False
        OrmQ.objects.create(key=DUMMY_KEY, payload="-", lock=timezone.now())
        with connection.execute_wrapper(prof.execute_wrapper):
            result = runner.cleanup_drain()
        OrmQ.objects.filter(key=DUMMY_KEY).delete()
        extra["profile"] = {k: [int(v[0]), round(v[1], 4)] for k, v in sorted(prof.stats.items())}
    else:
        result = runner.cleanup_drain()
    seconds = time.perf_counter() - started
    extra["slices_run"] = result.slices
    print(
        json.dumps(
            {
                "seconds": seconds,
                "admission_seconds": admission,
                "rows_deleted": result.rows_deleted,
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "extra": extra,
            }
        )
    )


# --------------------------------------------------------------------------- admission


def admission_phase(slot: datetime, properties_per_portfolio: int = 100) -> dict[str, Any]:
    """100 portfolios x 100 new properties x 1 kind = 10,000 partitions with expired rows; time sweep_trigger."""
    from django.conf import settings

    from cleanup_ops import admission, dispatch
    from cleanup_ops.schedule import sweep_trigger

    sql(f"TRUNCATE {cleanup_tables()}, {TABLE}, retention_legalhold RESTART IDENTITY CASCADE")
    sql(
        "INSERT INTO properties_property (portfolio_id, name)"
        " SELECT po.id, 'Admission ' || po.id || '/' || g FROM properties_portfolio po"
        " CROSS JOIN generate_series(1, %s) g ORDER BY po.id, g",
        [properties_per_portfolio],
    )
    # Three rows per new property: two past the cutoff, one running lease.
    sql(
        f"INSERT INTO {TABLE} (portfolio_id, property_id, unit, tenant_name, started_on, ended_on)"
        " SELECT p.portfolio_id, p.id, 'U', 'T', (%s - interval '900 days')::date,"
        " CASE WHEN k = 3 THEN NULL ELSE %s - interval '400 days' - k * interval '1 day' END"
        " FROM properties_property p CROSS JOIN generate_series(1, 3) k WHERE p.name LIKE 'Admission %%'"
        " ORDER BY p.id, k",
        [slot, slot],
    )
    sql(f"VACUUM ANALYZE {TABLE}")
    sql("VACUUM ANALYZE properties_property")
    for table in cleanup_tables().split(", "):
        sql(f"VACUUM ANALYZE {table}")
    settings.Q_CLUSTER["workers"] = 2
    wake, parts = _Timer(), _Timer()
    with timing(dispatch, "dispatch_due_jobs", wake), timing(admission, "partitions_due", parts):
        started = time.perf_counter()
        result = sweep_trigger(slot=slot)
        total = time.perf_counter() - started
    # One more dispatcher call with 10,000 due jobs and an empty broker (what a worker
    # pays after a slice early in such a sweep).
    sql("DELETE FROM django_q_ormq")
    sql("UPDATE cleanup_ops_cleanupjob SET enqueued_at = NULL")
    started = time.perf_counter()
    dispatch.dispatch_due_jobs()
    dispatch_again = time.perf_counter() - started
    sql("DELETE FROM django_q_ormq")
    return {
        "partitions": result.sweep.jobs_admitted,
        "trigger_seconds": total,
        "admission_seconds": total - wake.total,
        "partitions_due_seconds": parts.total,
        "dispatch_seconds": wake.total,
        "dispatch_10k_open_seconds": dispatch_again,
    }
