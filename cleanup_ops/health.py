"""Worker-cluster heartbeats and the health checks built on them (``cleanup_health``).

A worker killed from outside while it holds one of django-q2's shared
``multiprocessing`` queue locks can wedge its whole cluster: every process
stays alive and django-q2's own status still says WORKING, but no worker ever
gets another task. What tells such a cluster apart from an idle one is whether
it has work it could take and takes none, so the workers themselves record:

* **on spawn** (django-q2's ``post_spawn`` signal, in each new worker):
  the cluster's sentinel pid. A new pid is a new run of the cluster, which
  restarts ``started_at`` and the counters; a spawning worker also wakes the
  dispatcher, so a restarted cluster gets messages at once rather than at the
  scheduler's next tick;
* **as each task starts** (django-q2's ``pre_execute``) and **after it**
  (``tasks.run_job`` and ``tasks.dispatch``): ``last_progress_at``, the
  turns, jobs leased and rows deleted — at most one UPSERT per
  ``CLEANUP_HEARTBEAT_SECONDS`` per worker process, never one per batch; what
  a throttled write held is carried into the next one, and a worker that
  goes quiet after a throttled write flushes it once the interval has passed
  (a timer thread of its own), so a finished task is never lost to the
  throttle ("Tasks 0" beside a cluster that did work).

Each row names the django-q2 queue its cluster serves (``queue``: the main
queue or ``Q_PURGE_CLUSTER``), so the console judges every cluster against
the work of its own queue, with the same rule as ``cleanup_health``
(``due_work_waited`` and ``liveness_judgement``).

``cluster_liveness`` fails when due work the cluster could take (of the job
kinds its queue carries, due, not paused, its portfolio under the lease cap:
the dispatcher's own choice, ``fair_due_job_ids``) has waited ``stale_seconds`` and the cluster made no
progress for as long, counting from its last progress or its start,
whichever is later. ``health_readiness`` checks that the database answers,
every migration is applied and the cache tables exist.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from psycopg import sql as pgsql

from cleanup_ops.dispatch import cluster_job_kinds, cluster_queue, dispatch_due_jobs, fair_due_job_ids, queues
from cleanup_ops.models import CleanupJob, WorkerHeartbeat

logger = logging.getLogger(__name__)

_TABLE = WorkerHeartbeat._meta.db_table
# One statement for both writes. A row whose pid is another sentinel's belongs
# to an earlier run of the cluster: start it afresh. (PostgreSQL evaluates
# SET expressions against the row as it was.)
_UPSERT = pgsql.SQL("""
INSERT INTO {table} AS hb
    (host, cluster, queue, pid, started_at, last_progress_at, turns, jobs_leased, rows_deleted, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (host, cluster) DO UPDATE SET
    started_at = CASE WHEN hb.pid = excluded.pid THEN hb.started_at ELSE excluded.started_at END,
    last_progress_at = CASE
        WHEN excluded.last_progress_at IS NOT NULL THEN excluded.last_progress_at
        WHEN hb.pid = excluded.pid THEN hb.last_progress_at
    END,
    turns = excluded.turns + CASE WHEN hb.pid = excluded.pid THEN hb.turns ELSE 0 END,
    jobs_leased = excluded.jobs_leased + CASE WHEN hb.pid = excluded.pid THEN hb.jobs_leased ELSE 0 END,
    rows_deleted = excluded.rows_deleted + CASE WHEN hb.pid = excluded.pid THEN hb.rows_deleted ELSE 0 END,
    pid = excluded.pid,
    queue = excluded.queue,
    updated_at = excluded.updated_at
""").format(table=pgsql.Identifier(_TABLE))


def cluster_identity() -> tuple[str, str]:
    """(host, cluster name) of the cluster this process belongs to, or checks."""
    return socket.gethostname(), settings.CLEANUP_CLUSTER_NAME


@dataclass
class _Unwritten:
    """What this worker process counted since its last heartbeat write."""

    turns: int = 0
    jobs_leased: int = 0
    rows_deleted: int = 0
    progress_at: datetime | None = None
    written_at: float = -math.inf  # time.monotonic() of the last write

    def has_news(self) -> bool:
        return bool(self.turns or self.jobs_leased or self.rows_deleted or self.progress_at)

    def mark_written(self, *, clock: float) -> None:
        self.turns = self.jobs_leased = self.rows_deleted = 0
        self.progress_at = None
        self.written_at = clock


_unwritten = _Unwritten()
# The worker's thread and the flush timer's both touch ``_unwritten``.
_lock = threading.RLock()
_flush_timer: threading.Timer | None = None


def heartbeat_flush() -> bool:
    """Write what a throttled call left, if the interval has passed; whether it wrote."""
    global _flush_timer
    with _lock:
        _flush_timer = None
        return _unwritten.has_news() and _write_if_due(now=timezone.now())


def _flush_due() -> None:
    """The timer's turn, on its own thread and connection (closed after: the thread ends here)."""
    try:
        heartbeat_flush()
    except Exception as exc:
        logger.warning("cluster heartbeat not written: %s", type(exc).__name__)
    finally:
        connection.close()


def _flush_later(delay: float) -> None:
    """Write the throttled counts once the interval has passed, unless a task
    writes them first: a worker that finishes its last task inside the
    interval and then waits for the next has nothing else that would."""
    global _flush_timer
    if _flush_timer is not None:
        return
    _flush_timer = threading.Timer(max(delay, 0.0) + 0.05, _flush_due)
    _flush_timer.daemon = True
    _flush_timer.start()


def _write(*, now: datetime, progress_at: datetime | None, turns: int, jobs_leased: int, rows_deleted: int) -> None:
    host, cluster = cluster_identity()
    # In a worker the parent is the cluster's sentinel: one pid per run of the cluster.
    params: list[Any] = [
        host,
        cluster,
        cluster_queue(),
        os.getppid(),
        now,
        progress_at,
        turns,
        jobs_leased,
        rows_deleted,
        now,
    ]
    ops = connection.ops
    params = [ops.adapt_datetimefield_value(p) if isinstance(p, datetime) else p for p in params]
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT, params)


def _write_if_due(*, now: datetime) -> bool:
    """Write what this process counted unless it wrote less than
    ``CLEANUP_HEARTBEAT_SECONDS`` ago; what a skipped or failed write held is
    carried into the next one."""
    pending = _unwritten
    clock = time.monotonic()
    waited = clock - pending.written_at
    if waited < settings.CLEANUP_HEARTBEAT_SECONDS:
        if pending.has_news():
            _flush_later(settings.CLEANUP_HEARTBEAT_SECONDS - waited)
        return False
    try:
        _write(
            now=now,
            progress_at=pending.progress_at,
            turns=pending.turns,
            jobs_leased=pending.jobs_leased,
            rows_deleted=pending.rows_deleted,
        )
    except DatabaseError as exc:
        logger.warning("cluster heartbeat not written: %s", type(exc).__name__)
        return False
    pending.mark_written(clock=clock)
    return True


def heartbeat_record_turn(*, jobs_leased: int = 0, rows_deleted: int = 0, now: datetime | None = None) -> bool:
    """A worker finished a task: count it, and write the heartbeat unless this
    process wrote one less than ``CLEANUP_HEARTBEAT_SECONDS`` ago.

    Returns whether it wrote. Never raises: a heartbeat that cannot be written
    (the database is restarting) is carried into the next one.
    """
    if settings.Q_CLUSTER.get("sync"):
        return False  # tasks run inline in some other process: there is no cluster
    now = now or timezone.now()
    with _lock:
        pending = _unwritten
        pending.turns += 1
        pending.jobs_leased += jobs_leased
        pending.rows_deleted += rows_deleted
        pending.progress_at = now
        return _write_if_due(now=now)


def heartbeat_on_task_start(**kwargs: Any) -> None:
    """django-q2 ``pre_execute`` receiver: a worker got a task from its queue,
    which a wedged cluster's workers never do. Progress, under the same
    throttle (so a restarted cluster shows it with its first task, not at the
    end of its first turn). Never raises: the worker would die with it."""
    if settings.Q_CLUSTER.get("sync"):
        return
    try:
        now = timezone.now()
        with _lock:
            _unwritten.progress_at = now
            _write_if_due(now=now)
    except Exception as exc:
        logger.warning("cluster heartbeat not written: %s", type(exc).__name__)


def heartbeat_on_spawn(**kwargs: Any) -> None:
    """django-q2 ``post_spawn`` receiver, in every new worker process.

    Registers the cluster's run (its sentinel pid) and wakes the dispatcher.
    Never raises: an exception here would kill the worker before its first
    task, and the sentinel would spawn it again and again.
    """
    if settings.Q_CLUSTER.get("sync"):
        return
    try:
        _write(now=timezone.now(), progress_at=None, turns=0, jobs_leased=0, rows_deleted=0)
        dispatch_due_jobs()
    except Exception as exc:
        logger.warning("worker start: heartbeat or dispatch failed: %s", type(exc).__name__)


# --- Checks ----------------------------------------------------------------------


@dataclass
class HealthReport:
    check: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail, **self.data}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def heartbeat_as_dict(heartbeat: WorkerHeartbeat | None, *, now: datetime) -> dict[str, Any] | None:
    if heartbeat is None:
        return None
    return {
        "host": heartbeat.host,
        "cluster": heartbeat.cluster,
        "pid": heartbeat.pid,
        "started_at": _iso(heartbeat.started_at),
        "last_progress_at": _iso(heartbeat.last_progress_at),
        "seconds_since_progress": (
            round((now - heartbeat.last_progress_at).total_seconds(), 1) if heartbeat.last_progress_at else None
        ),
        "turns": heartbeat.turns,
        "jobs_leased": heartbeat.jobs_leased,
        "rows_deleted": heartbeat.rows_deleted,
    }


def due_work_waited(*, kinds: list[str], now: datetime) -> float | None:
    """How long the oldest due job a cluster carrying ``kinds`` could take has
    waited (None: none): the dispatcher's own choice (``fair_due_job_ids``),
    so paused portfolios, portfolios at their lease cap and other queues'
    job kinds do not count. Raises ``DatabaseError`` when the database is down."""
    takeable = fair_due_job_ids(now=now, limit=1, exclude_enqueued=False, kinds=kinds) if kinds else []
    # The fair order starts with every portfolio's oldest due job, oldest first.
    due_since = (
        CleanupJob.objects.filter(pk=takeable[0]).values_list("available_at", flat=True).first() if takeable else None
    )
    return (now - due_since).total_seconds() if due_since else None


def liveness_verdict(
    *, waited: float | None, heartbeat: WorkerHeartbeat | None, now: datetime, stale: float
) -> tuple[str, float | None]:
    """The one rule for "wedged", used by ``cleanup_health --liveness`` and the
    console's workers page: ("idle" | "working" | "wedged", seconds since the
    cluster's last progress or start). Idle: no due work it could take.
    Working: that work has waited less than ``stale``, or the cluster made
    progress (or started) less than ``stale`` ago. Otherwise wedged."""
    quiet = None
    if heartbeat is not None:
        reference = max(heartbeat.started_at, heartbeat.last_progress_at or heartbeat.started_at)
        quiet = (now - reference).total_seconds()
    if waited is None:
        return "idle", quiet
    if waited < stale or (quiet is not None and quiet < stale):
        return "working", quiet
    return "wedged", quiet


def liveness_judgement(
    *, heartbeat: WorkerHeartbeat | None, waited: float | None, stale: float, now: datetime, data: dict[str, Any]
) -> HealthReport:
    """``liveness_verdict`` in words: what ``cleanup_health --liveness`` prints
    and the console's workers page shows for the same cluster."""
    data["heartbeat"] = heartbeat_as_dict(heartbeat, now=now)
    data["due_work_waiting_seconds"] = round(waited, 1) if waited is not None else None
    state, quiet = liveness_verdict(waited=waited, heartbeat=heartbeat, now=now, stale=stale)
    data["state"] = state
    if quiet is not None:
        data["seconds_without_progress"] = round(quiet, 1)
    if state == "idle":
        return HealthReport("liveness", True, "idle: no due work it could take", data)
    if state == "working":
        if waited is not None and waited < stale:
            return HealthReport("liveness", True, f"due work has waited {waited:.0f} s (< {stale:g} s)", data)
        return HealthReport("liveness", True, f"progress {quiet:.0f} s ago", data)
    if heartbeat is None:
        return HealthReport(
            "liveness", False, f"wedged: due work has waited {waited:.0f} s and this cluster never reported", data
        )
    return HealthReport(
        "liveness",
        False,
        f"wedged: due work has waited {waited:.0f} s and the cluster made no progress for {quiet:.0f} s",
        data,
    )


def cluster_liveness(
    *, host: str, cluster: str, stale_seconds: float | None = None, now: datetime | None = None
) -> HealthReport:
    """Is the cluster ``cluster`` on ``host`` wedged? (See the module docstring.)

    Not judged (ok) while the database is unreachable: restarting workers
    does not bring a database back, and readiness reports that.
    """
    now = now or timezone.now()
    stale = float(stale_seconds if stale_seconds is not None else settings.CLEANUP_LIVENESS_STALE_SECONDS)
    # The job kinds this cluster's queue carries (Q_CLUSTER_NAME: the main or the purge queue).
    kinds = cluster_job_kinds()
    data: dict[str, Any] = {"host": host, "cluster": cluster, "job_kinds": kinds, "stale_seconds": stale}
    try:
        heartbeat = WorkerHeartbeat.objects.filter(host=host, cluster=cluster).first()
        waited = due_work_waited(kinds=kinds, now=now)
    except DatabaseError as exc:
        return HealthReport("liveness", True, f"not judged: the database is unreachable ({type(exc).__name__})", data)
    return liveness_judgement(heartbeat=heartbeat, waited=waited, stale=stale, now=now, data=data)


def heartbeat_queue(heartbeat: WorkerHeartbeat) -> str:
    """The queue a heartbeat's cluster serves (rows written before heartbeats
    named their queue: the main queue)."""
    return heartbeat.queue or settings.Q_CLUSTER["name"]


def clusters_judged(
    heartbeats: list[WorkerHeartbeat], *, now: datetime, stale_seconds: float | None = None
) -> dict[str, Any]:
    """Every cluster judged exactly as ``cleanup_health --liveness`` run on its
    host judges it (``liveness_judgement`` against the work of the cluster's
    own queue, pauses and lease caps included), plus, per queue, how long the
    oldest job a cluster of it could take has waited. A few queries per
    queue (two queues at most), none per cluster."""
    stale = float(stale_seconds if stale_seconds is not None else settings.CLEANUP_LIVENESS_STALE_SECONDS)
    routes = queues()
    waited = {queue: due_work_waited(kinds=kinds, now=now) for queue, kinds in routes.items()}
    clusters = []
    for hb in heartbeats:
        queue = heartbeat_queue(hb)
        kinds = routes.get(queue, [])
        data: dict[str, Any] = {"host": hb.host, "cluster": hb.cluster, "job_kinds": kinds, "stale_seconds": stale}
        report = liveness_judgement(heartbeat=hb, waited=waited.get(queue), stale=stale, now=now, data=data)
        clusters.append(
            {
                "hb": hb,
                "queue": queue,
                "kinds": kinds,
                "state": data["state"],
                "ok": report.ok,
                "detail": report.detail,
                "heartbeat_age_seconds": (now - hb.updated_at).total_seconds(),
                "quiet_seconds": data.get("seconds_without_progress"),
            }
        )
    return {"clusters": clusters, "waited_by_queue": waited}


# Locks of a lease transaction besides its stripe locks: the relations it
# reads and writes, with their indexes.
LEASE_LOCK_HEADROOM = 32


def lease_locks_needed() -> int:
    """The ``max_locks_per_transaction`` a lease transaction needs at most."""
    return settings.CLEANUP_LEASE_LOCK_STRIPES + LEASE_LOCK_HEADROOM


def _max_locks_per_transaction() -> pgsql.SQL:
    return pgsql.SQL("SELECT current_setting('max_locks_per_transaction')::integer")


def health_readiness() -> HealthReport:
    """The database answers, every migration is applied, the cache tables
    exist, and its lock table fits a lease transaction's locks."""
    max_locks = None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.execute(_max_locks_per_transaction())
            max_locks = int(cursor.fetchone()[0])
        executor = MigrationExecutor(connection)
        unapplied = [
            f"{migration.app_label}.{migration.name}"
            for migration, _backwards in executor.migration_plan(executor.loader.graph.leaf_nodes())
        ]
        tables = set(connection.introspection.table_names())
    except DatabaseError as exc:
        return HealthReport("readiness", False, f"database unreachable ({type(exc).__name__})", {})
    missing_caches = [
        config["LOCATION"]
        for config in settings.CACHES.values()
        if config["BACKEND"].endswith("DatabaseCache") and config["LOCATION"] not in tables
    ]
    data = {
        "unapplied_migrations": unapplied,
        "missing_cache_tables": missing_caches,
        "max_locks_per_transaction": max_locks,
        "lease_locks_needed": lease_locks_needed(),
    }
    if max_locks is not None and max_locks < lease_locks_needed():
        return HealthReport(
            "readiness",
            False,
            f"max_locks_per_transaction is {max_locks}; a lease transaction needs {lease_locks_needed()}"
            " (CLEANUP_LEASE_LOCK_STRIPES + 32): raise it or lower CLEANUP_LEASE_LOCK_STRIPES",
            data,
        )
    if unapplied:
        return HealthReport("readiness", False, f"{len(unapplied)} migrations not applied (run migrate)", data)
    if missing_caches:
        return HealthReport(
            "readiness", False, f"cache tables missing: {', '.join(missing_caches)} (run createcachetable)", data
        )
    return HealthReport("readiness", True, "database reachable, migrations applied", data)
