"""Pickup latency and the idle cluster's queries (``--only pickup,idle``).

Both run against a warm ``qcluster`` with 2 workers on a database where nothing is
due: the nightly (or backlog) scope with its portfolios, properties, policies and
holds, but empty record and pipeline tables.

**Pickup**: how long after a job becomes due a worker leases it, for the three ways a
job becomes due while workers idle. Each sample's latency is ``leased at - available_at``
(both stamped by the application's clock on this machine):

* ``sweep``: one expired row is inserted, then ``sweep_trigger`` for a new slot admits
  its one partition; ``available_at`` is the trigger's ``now`` (admission included),
  leased at = ``first_leased_at``. Samples run one after the other.
* ``retry``: a job is leased by the benchmark (as a worker would) and its failure
  recorded with ``job_fail`` and a retryable classification (a 5xx), so
  ``available_at`` = now + the backoff (base 1 s, cap 3 s in this process, full jitter).
  Leased at = the ``applied_at`` of the job's first ledger row (the batch right after
  the lease; the lease itself is not timestamped on a job that was leased before), or
  the 20 ms poll that saw ``leases`` grow, whichever is earlier. The failures are
  recorded 3 s apart and the samples overlap: with a pickup slower than that, one
  dispatch may pick several up, as in production.
* ``redrive``: a dead letter (a ``policy_or_input`` failure recorded the same way) is
  redriven with ``dead_letter_redrive``; the new job's ``available_at`` is the
  redrive's ``now``, leased at = ``first_leased_at``. One after the other.

The benchmark polls every 20 ms under its own role (``bench_watch``) and waits up to
``PICKUP_TIMEOUT`` seconds for a sample; a sample that times out is reported as such.

**Idle**: with the same cluster and nothing due, the statements PostgreSQL receives
over ``IDLE_SECONDS`` (``pg_stat_statements`` calls, by class) and the transactions
(``pg_stat_database.xact_commit`` delta).
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import ROOT, log, sql
from bench.dataset import cleanup_tables, record_tables
from harness.qcluster import QCluster

PICKUP_TIMEOUT = 120.0
POLL = 0.02
IDLE_SECONDS = 30.0
RETRY_SPACING = 3.0


def _now() -> datetime:
    return datetime.now(UTC)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def handoff(cluster: QCluster, samples: list[tuple[int, datetime, datetime | None]]) -> dict[str, Any]:
    """Split each (job id, available_at, leased at) by the cluster's log line "processing
    cleanup-job-<id>" (INFO): due -> a worker starts the task (dispatch, broker, pusher
    poll, worker queue), and task start -> leased (worker_turn up to its lease)."""
    import json

    started: dict[int, datetime] = {}
    for line in cluster.log_text().splitlines():
        if "processing cleanup-job-" not in line or not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
            job_id = int(entry["message"].split("processing cleanup-job-", 1)[1].split()[0].strip("'"))
        except (ValueError, KeyError, IndexError):
            continue
        started.setdefault(job_id, datetime.fromisoformat(entry["ts"]))
    to_task, in_task = [], []
    for job_id, due, leased in samples:
        at = started.get(job_id)
        if at is None or leased is None:
            continue
        to_task.append((at - due).total_seconds())
        in_task.append((leased - at).total_seconds())
    if not to_task:
        return {}
    return {
        "due_to_task_start_p50": round(statistics.median(to_task), 3),
        "due_to_task_start_max": round(max(to_task), 3),
        "task_start_to_lease_p50": round(statistics.median(in_task), 3),
        "task_start_to_lease_max": round(max(in_task), 3),
    }


def summarise(latencies: list[float | None]) -> dict[str, Any]:
    done = [v for v in latencies if v is not None]
    return {
        "samples": len(latencies),
        "timed_out": len(latencies) - len(done),
        "p50": round(statistics.median(done), 3) if done else None,
        "p95": round(_pct(done, 0.95), 3) if done else None,
        "max": round(max(done), 3) if done else None,
        "all": [None if v is None else round(v, 3) for v in latencies],
    }


class BenchEnv:
    """What the scenarios share: the watcher connection, spare properties, a policy per kind."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch
        # Properties without any hold (so the row is deleted and a ledger row written).
        self.samples: list[tuple[int, datetime, datetime | None]] = []
        self.props = sql(
            "SELECT p.id, p.portfolio_id FROM properties_property p WHERE NOT EXISTS ("
            " SELECT 1 FROM retention_legalhold h WHERE h.portfolio_id = p.portfolio_id AND h.released_at IS NULL"
            " AND h.record_id IS NULL AND (h.property_id IS NULL OR h.property_id = p.id)) ORDER BY p.id"
        )
        self.next = 0

    def prop(self) -> tuple[int, int]:
        prop = self.props[self.next % len(self.props)]
        self.next += 1
        return prop

    def expired_lease(self, prop: tuple[int, int], slot: datetime) -> None:
        sql(
            "INSERT INTO properties_lease (portfolio_id, property_id, unit, tenant_name, started_on, ended_at)"
            " VALUES (%s, %s, 'P', 'pickup', (%s::timestamptz - interval '900 days')::date,"
            " %s::timestamptz - interval '400 days')",
            [prop[1], prop[0], slot, slot],
        )

    def one(self, query: str, params: list[Any]) -> Any:
        row = self.watch.execute(query, params).fetchone()
        return row[0] if row else None


def wait_first_lease(env: BenchEnv, job_id: int) -> datetime | None:
    deadline = time.monotonic() + PICKUP_TIMEOUT
    while time.monotonic() < deadline:
        at = env.one("SELECT first_leased_at FROM cleanup_ops_cleanupjob WHERE id = %s", [job_id])
        if at is not None:
            return at
        time.sleep(POLL)
    return None


def wait_closed(env: BenchEnv, job_ids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not env.one(
            "SELECT count(*) FROM cleanup_ops_cleanupjob WHERE id = ANY(%s) AND state IN ('pending', 'leased')",
            [job_ids],
        ):
            return
        time.sleep(POLL)
    log(f"pickup: jobs {job_ids} still open after {timeout:.0f} s")


def scenario_sweep(env: BenchEnv, base_slot: datetime, samples: int) -> dict[str, Any]:
    from cleanup_ops.models import CleanupJob
    from cleanup_ops.schedule import sweep_trigger

    latencies: list[float | None] = []
    env.samples = []
    admission: list[float] = []
    for i in range(samples):
        slot = base_slot - timedelta(minutes=i + 1)
        env.expired_lease(env.prop(), slot)
        started = time.perf_counter()
        result = sweep_trigger(slot=slot)
        admission.append(time.perf_counter() - started)
        jobs = list(CleanupJob.objects.filter(sweep=result.sweep).values_list("id", "available_at"))
        if len(jobs) != 1:
            log(f"pickup/sweep: expected 1 job, the sweep admitted {len(jobs)}")
        if not jobs:
            latencies.append(None)
            continue
        job_id, available_at = jobs[0]
        leased_at = wait_first_lease(env, job_id)
        env.samples.append((job_id, available_at, leased_at))
        latencies.append(None if leased_at is None else (leased_at - available_at).total_seconds())
        wait_closed(env, [job_id])
        if latencies[-2:] == [None, None]:
            log("pickup/sweep: two samples in a row timed out; giving up on this scenario")
            break
    out = summarise(latencies)
    out["admission_p50"] = round(statistics.median(admission), 3)
    return out


def bench_lease(job_id: int) -> Any:
    """Lease ``job_id`` as a worker would have before failing (state, token, expiry)."""
    from django.conf import settings
    from django.db.models import F

    from cleanup_ops.execution.leases import JobLease
    from cleanup_ops.models import CleanupJob, JobState

    token = uuid.uuid4()
    now = _now()
    CleanupJob.objects.filter(pk=job_id).update(
        state=JobState.LEASED,
        lease_token=token,
        lease_owner="bench",
        lease_expires_at=now + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS),
        leases=F("leases") + 1,
        first_leased_at=now,
    )
    return JobLease(job_id=job_id, token=token, owner="bench")


def parked_jobs(env: BenchEnv, base_slot: datetime, n: int, tag: str) -> list[int]:
    """``n`` delete jobs of a sweep of their own, not due for an hour (nothing dispatches
    them), each on a partition with one expired row."""
    from cleanup_ops.models import CleanupJob, Sweep
    from retention.models import PolicyVersion

    slot = base_slot - timedelta(days=1, minutes=len(tag))
    sweep = Sweep.objects.create(key=f"bench-{tag}-{uuid.uuid4().hex[:8]}", slot=slot, status=Sweep.Status.RUNNING)
    versions = dict(
        PolicyVersion.objects.filter(status=PolicyVersion.Status.APPROVED, policy__record_kind="lease").values_list(
            "policy__portfolio_id", "id"
        )
    )
    later = _now() + timedelta(hours=1)
    jobs = []
    for _ in range(n):
        prop = env.prop()
        env.expired_lease(prop, slot)
        jobs.append(
            CleanupJob(
                sweep=sweep,
                key=f"{sweep.key}:{prop[1]}:{prop[0]}:lease",
                portfolio_id=prop[1],
                property_id=prop[0],
                record_kind="lease",
                policy_version_id=versions[prop[1]],
                cutoff=slot - timedelta(days=365),
                available_at=later,
            )
        )
    return [job.pk for job in CleanupJob.objects.bulk_create(jobs)]


def scenario_retry(env: BenchEnv, base_slot: datetime, samples: int) -> dict[str, Any]:
    from django.conf import settings

    from cleanup_ops.models import CleanupJob
    from cleanup_ops.recovery.classification import RETRY, Classification, FailureCategory
    from cleanup_ops.recovery.failures import job_fail

    job_ids = parked_jobs(env, base_slot, samples, "retry")
    saved = settings.CLEANUP_BACKOFF_BASE_SECONDS, settings.CLEANUP_BACKOFF_CAP_SECONDS
    settings.CLEANUP_BACKOFF_BASE_SECONDS, settings.CLEANUP_BACKOFF_CAP_SECONDS = 1.0, 3.0
    due: dict[int, datetime] = {}
    seen: dict[int, datetime] = {}
    failure = Classification(FailureCategory.DOWNSTREAM_UNAVAILABLE, RETRY, "DownstreamError")

    def poll() -> None:
        waiting = [j for j in due if j not in seen]
        if not waiting:
            return
        rows = env.watch.execute(
            "SELECT id FROM cleanup_ops_cleanupjob WHERE id = ANY(%s) AND leases >= 2", [waiting]
        ).fetchall()
        at = _now()
        for (job_id,) in rows:
            seen[job_id] = at

    try:
        for job_id in job_ids:
            job_fail(lease=bench_lease(job_id), classification=failure)
            due[job_id] = CleanupJob.objects.values_list("available_at", flat=True).get(pk=job_id)
            until = time.monotonic() + RETRY_SPACING
            while time.monotonic() < until:
                poll()
                time.sleep(POLL)
        deadline = time.monotonic() + PICKUP_TIMEOUT
        while len(seen) < len(due) and time.monotonic() < deadline:
            poll()
            time.sleep(POLL)
    finally:
        settings.CLEANUP_BACKOFF_BASE_SECONDS, settings.CLEANUP_BACKOFF_CAP_SECONDS = saved
    applied = dict(
        sql(
            "SELECT job_id, min(applied_at) FROM cleanup_ops_ledgerentry WHERE job_id = ANY(%s) GROUP BY job_id",
            [job_ids],
        )
    )
    latencies: list[float | None] = []
    for job_id in job_ids:
        candidates = [t for t in (applied.get(job_id), seen.get(job_id)) if t is not None]
        latencies.append((min(candidates) - due[job_id]).total_seconds() if candidates else None)
    wait_closed(env, job_ids)
    out = summarise(latencies)
    out["backoff_s_p50"] = round(
        statistics.median(
            (due[j] - t).total_seconds()
            for j, t in CleanupJob.objects.filter(pk__in=job_ids).values_list("id", "first_leased_at")
        ),
        3,
    )
    return out


def scenario_redrive(env: BenchEnv, base_slot: datetime, samples: int) -> dict[str, Any]:
    from cleanup_ops.models import CleanupJob, DeadLetter
    from cleanup_ops.recovery.classification import DEAD, Classification, FailureCategory
    from cleanup_ops.recovery.failures import job_fail
    from cleanup_ops.recovery.operator import dead_letter_redrive

    job_ids = parked_jobs(env, base_slot, samples, "redrive")
    failure = Classification(FailureCategory.POLICY_OR_INPUT, DEAD, "InvalidInput")
    for job_id in job_ids:
        job_fail(lease=bench_lease(job_id), classification=failure)
    letters = list(DeadLetter.objects.filter(job_id__in=job_ids).order_by("id").values_list("id", flat=True))
    latencies: list[float | None] = []
    env.samples = []
    for letter_id in letters:
        job = dead_letter_redrive(letter_id=letter_id, actor=None, reason="bench: pickup latency of a redrive")
        available_at = CleanupJob.objects.values_list("available_at", flat=True).get(pk=job.pk)
        leased_at = wait_first_lease(env, job.pk)
        env.samples.append((job.pk, available_at, leased_at))
        latencies.append(None if leased_at is None else (leased_at - available_at).total_seconds())
        wait_closed(env, [job.pk])
        if latencies[-2:] == [None, None]:
            log("pickup/redrive: two samples in a row timed out; giving up on this scenario")
            break
    return summarise(latencies)


def idle_phase(stats: Any, seconds: float = IDLE_SECONDS) -> dict[str, Any]:
    """Statements and transactions an idle cluster sends over ``seconds``."""
    mark = stats.start()
    time.sleep(seconds)
    counts = stats.stop(mark)
    out = counts.as_json()
    out["statements_per_s"] = round(counts.total() / counts.seconds, 2) if counts.statements else None
    out["xact_per_s"] = round(counts.xact.get("xact_commit", 0) / counts.seconds, 2)
    return out


def pickup_and_idle(
    *,
    base_slot: datetime,
    env: dict[str, str],
    log_dir: Path,
    live: list[QCluster],
    stats: Any,
    samples: int,
    phases: set[str],
    nice: int = 0,
) -> dict[str, Any]:
    """On an emptied copy of the dataset, with a warm 2-worker cluster: the pickup
    scenarios, then the idle measurement."""
    from django.conf import settings

    sql(f"TRUNCATE {cleanup_tables()}, {record_tables()} RESTART IDENTITY CASCADE")
    sql("VACUUM ANALYZE")
    settings.Q_CLUSTER["workers"] = 2
    settings.Q_CLUSTER["sync"] = False
    settings.CLEANUP_DISPATCH_WINDOW = 0
    cluster = QCluster(
        {**env, "LOG_LEVEL": "INFO"},
        cwd=ROOT,
        workers=2,
        log_path=log_dir / f"qcluster-pickup-{time.monotonic_ns()}.log",
        nice=nice,
        log=log,
    )
    live.append(cluster)
    out: dict[str, Any] = {}
    try:
        cluster.wait_ready()
        time.sleep(2.0)  # warm: the workers have polled the broker a few times
        watch = stats.watcher()
        try:
            shared = BenchEnv(watch)
            if "pickup" in phases:
                for name, scenario in (
                    ("sweep", scenario_sweep),
                    ("retry", scenario_retry),
                    ("redrive", scenario_redrive),
                ):
                    log(f"pickup: {name}, {samples} samples")
                    shared.samples = []
                    out[name] = scenario(shared, base_slot, samples)
                    out[name].update(handoff(cluster, shared.samples))
                    log(f"pickup: {name}: p50 {out[name]['p50']} s, p95 {out[name]['p95']} s")
                    if cluster.poll() is not None:
                        raise RuntimeError(f"qcluster died:\n{cluster.log_text()[-3000:]}")
            if "idle" in phases:
                # Nothing due and nothing open: wait for the last turn to end.
                time.sleep(3.0)
                log(f"idle cluster: counting statements for {IDLE_SECONDS:.0f} s")
                out["idle"] = idle_phase(stats)
                out["idle"]["open_jobs"] = shared.one(
                    "SELECT count(*) FROM cleanup_ops_cleanupjob WHERE state IN ('pending', 'leased')", []
                )
        finally:
            watch.close()
        cluster.sample_rss()
        out["worker_peak_rss_mb"] = round(max(cluster.peak_kb.values(), default=0) / 1024, 1)
    finally:
        cluster.stop()
        live.remove(cluster)
    return out
