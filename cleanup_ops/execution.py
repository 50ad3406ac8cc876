"""Execution: lease a job, run a bounded slice of batches, release it.

Protocol (DESIGN.md "Execution details that matter"):

1. **Lease.** A conditional UPDATE claims the job only if it is due
   (``available_at <= now``) and either pending or leased with an expired
   lease; it sets a fresh ``lease_token``. No row matched → this delivery was a
   duplicate or early: return quietly.
2. **Batch = one transaction.**
   a. Lock the job row ``FOR UPDATE`` *where the lease token is ours and not
      expired* (fencing: a worker whose lease expired commits nothing).
   b. Lock the portfolio and property rows ``FOR SHARE``. Placing a legal hold
      locks one of them ``FOR UPDATE``, so the DELETE below either sees the
      committed hold or commits before the hold exists (the hold race).
      A missing row ends the job as ``scope_missing``.
   c. Read the active policy version: none or withdrawn ends the job as
      ``policy_withdrawn``; otherwise the cutoff is the earlier (stricter) of
      the admitted one and the current one.
   d. Compute the operation id from (kind, property, cutoff, cursor, limit).
      If the ledger already has it, move the cursor to that row's ``last_id``
      and stop (replay: redelivery, lost ack, redrive from an earlier cursor).
   e. Take the next ``limit`` candidate ids after the cursor, DELETE those of
      them that the eligibility predicate admits (the hold check is inside the
      statement), insert the ledger row, advance the cursor past every
      candidate (held ones too) and renew the lease.
   f. Outbox: for record kinds with attachments the DELETE returns the
      deleted rows' document ids; when there are any, the same transaction
      writes one ``PurgeRequest`` (key = the operation id) and one ``purge``
      job. A held or replayed batch deletes nothing and so purges nothing; a
      rolled-back batch takes its outbox rows with it. Kinds without
      attachments run the plain DELETE, with no extra statement.
   A batch with fewer candidates than the limit (or none) was the last one:
   the job is done with its outcome in that same transaction.
3. **Release.** After ``CLEANUP_SLICE_BATCHES`` batches or
   ``CLEANUP_SLICE_SECONDS`` the job goes back to pending, due now, cursor
   saved, so one big property never holds a worker for long.

Purge jobs lease, fence, release and fail through the same functions; their
slice (HTTP calls outside any transaction) is in ``cleanup_ops.purge``.

Time comes from ``django.utils.timezone.now()`` (never the database clock) so
tests control it with time-machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from cleanup_ops.classification import FailureCategory, backoff_delay, classify, retry_after_jitter
from cleanup_ops.docstore_url import document_id_valid
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    JobKind,
    JobOutcome,
    JobState,
    LedgerEntry,
    PipelinePause,
    PurgeRequest,
)
from cleanup_ops.ratelimit import BucketConfig, tokens_acquire
from cleanup_ops.services import sweep_refresh_status
from properties.models import Portfolio, Property
from retention.eligibility import db_datetime, eligible_sql
from retention.models import PolicyVersion, RetentionPolicy
from retention.registry import get_spec

logger = logging.getLogger(__name__)

JOB_TABLE = CleanupJob._meta.db_table
LEASE_LOCK_NAMESPACE = 7401  # pg_advisory_xact_lock(namespace, portfolio) for lease caps
LEDGER_TABLE = LedgerEntry._meta.db_table


class LeaseLost(Exception):
    """Our lease token is gone or expired: another worker may own the job."""


@dataclass
class Lease:
    job_id: int
    token: uuid.UUID
    owner: str


@dataclass
class SliceResult:
    job_id: int
    leased: bool = False
    batches: int = 0
    rows_deleted: int = 0
    outcome: str = ""
    lease_lost: bool = False
    deferred_seconds: float = 0.0
    error_category: str = ""
    dead: bool = False
    documents_purged: int = 0


@dataclass
class _Job:
    id: int
    portfolio_id: int
    property_id: int
    record_kind: str
    cutoff: datetime
    policy_version_id: int
    slot: datetime
    sweep_id: int
    kind: str
    purge_request_id: int | None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def operation_id(*, record_kind: str, property_id: int, cutoff: datetime, after_id: int, limit: int) -> str:
    stamp = cutoff.astimezone(UTC).isoformat().replace("+00:00", "Z")
    raw = f"retention:{record_kind}:{property_id}:{stamp}:{after_id}:{limit}"
    return hashlib.sha256(raw.encode()).hexdigest()


def _token_param(token: uuid.UUID) -> object:
    return CleanupJob._meta.get_field("lease_token").get_db_prep_value(token, connection)


def job_lease(*, job_id: int, owner: str, now: datetime | None = None) -> Lease | None:
    """Claim the job if it is due, not validly leased, not paused and its
    portfolio is under its lease cap; None when not.

    The cap check and the claim run under a per-portfolio advisory lock on
    PostgreSQL (SQLite serialises writers anyway), so two workers cannot both
    see "one slot left" and both take it.
    """
    now = now or timezone.now()
    row = CleanupJob.objects.filter(pk=job_id).values_list("portfolio_id", flat=True).first()
    if row is None:
        return None
    portfolio_id = row
    token = uuid.uuid4()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LEASE_LOCK_NAMESPACE, portfolio_id % 2**31])
        if pause_active(portfolio_id=portfolio_id):
            return None
        leased_now = (
            CleanupJob.objects.filter(portfolio_id=portfolio_id, state=JobState.LEASED, lease_expires_at__gt=now)
            .exclude(pk=job_id)
            .count()
        )
        if leased_now >= settings.CLEANUP_PORTFOLIO_MAX_LEASES:
            # Let the dispatcher send it again once a slot frees up.
            CleanupJob.objects.filter(pk=job_id).update(enqueued_at=None)
            return None
        claimed = (
            CleanupJob.objects.filter(pk=job_id, available_at__lte=now)
            .filter(Q(state=JobState.PENDING) | Q(state=JobState.LEASED, lease_expires_at__lte=now))
            .update(
                state=JobState.LEASED,
                lease_token=token,
                lease_owner=owner[:100],
                lease_expires_at=now + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS),
                leases=F("leases") + 1,
                enqueued_at=None,
                first_leased_at=Coalesce(F("first_leased_at"), Value(now)),
            )
        )
    return Lease(job_id=job_id, token=token, owner=owner) if claimed == 1 else None


def pause_active(*, portfolio_id: int) -> bool:
    return (
        PipelinePause.objects.filter(resumed_at__isnull=True)
        .filter(Q(portfolio_id__isnull=True) | Q(portfolio_id=portfolio_id))
        .exists()
    )


def job_release(*, lease: Lease, available_at: datetime | None = None) -> bool:
    """Give the job back (pending, cursor kept). False if the lease was lost."""
    released = CleanupJob.objects.filter(pk=lease.job_id, state=JobState.LEASED, lease_token=lease.token).update(
        state=JobState.PENDING,
        lease_token=None,
        lease_owner="",
        lease_expires_at=None,
        available_at=available_at or timezone.now(),
    )
    return released == 1


def _load(job_id: int) -> _Job:
    row = CleanupJob.objects.filter(pk=job_id).values_list(
        "id",
        "portfolio_id",
        "property_id",
        "record_kind",
        "cutoff",
        "policy_version_id",
        "sweep__slot",
        "sweep_id",
        "kind",
        "purge_request_id",
    )[0]
    return _Job(*row)


def _lock_job(cur, job: _Job, lease: Lease, now: datetime) -> int:  # type: ignore[no-untyped-def]
    lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    cur.execute(
        f"SELECT cursor FROM {JOB_TABLE} WHERE id = %s AND state = %s AND lease_token = %s"
        f" AND lease_expires_at > %s{lock}",
        [job.id, JobState.LEASED, _token_param(lease.token), db_datetime(now)],
    )
    row = cur.fetchone()
    if row is None:
        raise LeaseLost(job.id)
    return int(row[0])


def _lock_scope_and_policy(cur, job: _Job) -> tuple[bool, tuple[int, int, bool] | None]:  # type: ignore[no-untyped-def]
    """(scope exists, (version id, retention days, enabled) or None)."""
    lock = " FOR SHARE OF p, po" if connection.vendor == "postgresql" else ""
    cur.execute(
        f"SELECT p.id, v.id, v.retention_days, v.enabled"
        f" FROM {Property._meta.db_table} p"
        f" JOIN {Portfolio._meta.db_table} po ON po.id = p.portfolio_id"
        f" LEFT JOIN {RetentionPolicy._meta.db_table} rp ON rp.portfolio_id = po.id AND rp.record_kind = %s"
        f" LEFT JOIN {PolicyVersion._meta.db_table} v ON v.policy_id = rp.id AND v.status = %s"
        f" WHERE p.id = %s AND po.id = %s{lock}",
        [job.record_kind, PolicyVersion.Status.APPROVED, job.property_id, job.portfolio_id],
    )
    row = cur.fetchone()
    if row is None:
        return False, None
    if row[1] is None:
        return True, None
    return True, (int(row[1]), int(row[2]), bool(row[3]))


def _finish(cur, job: _Job, outcome: str, now: datetime) -> None:  # type: ignore[no-untyped-def]
    cur.execute(
        f"UPDATE {JOB_TABLE} SET state = %s, outcome = %s, finished_at = %s, lease_token = NULL,"
        f" lease_owner = '', lease_expires_at = NULL WHERE id = %s",
        [JobState.DONE, outcome, db_datetime(now), job.id],
    )


def _outcome_of(rows_deleted: int, rows_held: int) -> str:
    if rows_deleted:
        return JobOutcome.DELETED
    return JobOutcome.HELD if rows_held else JobOutcome.NOTHING_ELIGIBLE


def _final_outcome(job_id: int) -> str:
    return _outcome_of(*CleanupJob.objects.filter(pk=job_id).values_list("rows_deleted", "rows_held")[0])


def run_batch(*, job: _Job, lease: Lease, limit: int, now: datetime | None = None) -> tuple[int, str]:
    """One batch in one transaction. Returns (rows deleted, outcome if the job finished)."""
    now = now or timezone.now()
    spec = get_spec(job.record_kind)
    with transaction.atomic(), connection.cursor() as cur:
        after_id = _lock_job(cur, job, lease, now)
        scope_exists, active = _lock_scope_and_policy(cur, job)
        if not scope_exists:
            _finish(cur, job, JobOutcome.SCOPE_MISSING, now)
            return 0, JobOutcome.SCOPE_MISSING
        if active is None or not active[2]:
            _finish(cur, job, JobOutcome.POLICY_WITHDRAWN, now)
            return 0, JobOutcome.POLICY_WITHDRAWN
        active_id, active_days, _ = active
        current_cutoff = job.slot - timedelta(days=active_days)
        cutoff, version_id = (
            (current_cutoff, active_id) if current_cutoff < job.cutoff else (job.cutoff, job.policy_version_id)
        )
        op_id = operation_id(
            record_kind=job.record_kind, property_id=job.property_id, cutoff=cutoff, after_id=after_id, limit=limit
        )
        ts = spec.timestamp_column
        cur.execute(
            f"SELECT (SELECT last_id FROM {LEDGER_TABLE} WHERE operation_id = %s), COUNT(*), MAX(c.id) FROM ("
            f"SELECT r.id FROM {spec.table} r WHERE r.property_id = %s AND r.id > %s AND r.{ts} < %s"
            f" ORDER BY r.property_id, r.id LIMIT %s) c",
            [op_id, job.property_id, after_id, db_datetime(cutoff), limit],
        )
        replay_last_id, candidates, last_id = cur.fetchone()
        renew = db_datetime(now + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS))
        if replay_last_id is not None:
            # Already applied (by this job before a lost ack, or by the job a
            # redrive replaced): skip it, never apply it twice.
            cur.execute(
                f"UPDATE {JOB_TABLE} SET cursor = %s, lease_expires_at = %s WHERE id = %s",
                [max(after_id, int(replay_last_id)), renew, job.id],
            )
            return 0, ""
        if not candidates:
            outcome = _final_outcome(job.id)
            _finish(cur, job, outcome, now)
            return 0, outcome
        predicate, params = eligible_sql(job.record_kind, cutoff=cutoff, alias=spec.table)
        attachment = attachment_column(job.record_kind)
        cur.execute(
            f"DELETE FROM {spec.table} WHERE {spec.table}.property_id = %s AND {spec.table}.id > %s"
            f" AND {spec.table}.id <= %s AND {predicate}" + (f" RETURNING {attachment}" if attachment else ""),
            [job.property_id, after_id, last_id, *params],
        )
        if attachment:
            returned = cur.fetchall()
            deleted = len(returned)
            documents = [row[0] for row in returned if row[0]]
        else:
            deleted, documents = cur.rowcount, []
        cur.execute(
            f"INSERT INTO {LEDGER_TABLE} (operation_id, job_id, portfolio_id, property_id, record_kind,"
            f" policy_version_id, cutoff, after_id, last_id, batch_limit, candidates, rows_deleted, applied_at)"
            f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                op_id,
                job.id,
                job.portfolio_id,
                job.property_id,
                job.record_kind,
                version_id,
                db_datetime(cutoff),
                after_id,
                last_id,
                limit,
                candidates,
                deleted,
                db_datetime(now),
            ],
        )
        cur.execute(
            f"UPDATE {JOB_TABLE} SET cursor = %s, batches = batches + 1, rows_deleted = rows_deleted + %s,"
            f" rows_held = rows_held + %s, lease_expires_at = %s WHERE id = %s RETURNING rows_deleted, rows_held",
            [last_id, deleted, max(0, candidates - deleted), renew, job.id],
        )
        total_deleted, total_held = cur.fetchone()
        outcome = ""
        if candidates < limit:
            # A short batch was the last one: finish now instead of paying for
            # an empty batch. Rows that become eligible later (inserted with
            # old timestamps after this point) are the next sweep's work.
            outcome = _outcome_of(total_deleted, total_held)
            _finish(cur, job, outcome, now)
        if documents:
            purge_outbox_write(job=job, operation=op_id, document_ids=documents, now=now)
    return deleted, outcome


_ATTACHMENTS: dict[str, str | None] = {}


def attachment_column(kind: str) -> str | None:
    """The document id column of a record kind, or None when it has no attachments."""
    if kind not in _ATTACHMENTS:
        model = get_spec(kind).model
        field = next((f for f in model._meta.concrete_fields if f.name == "document_id"), None)
        _ATTACHMENTS[kind] = field.column if field is not None else None
    return _ATTACHMENTS[kind]


def purge_outbox_write(*, job: _Job, operation: str, document_ids: list[str], now: datetime) -> CleanupJob:
    """The outbox rows of one applied batch: a ``PurgeRequest`` and its ``purge`` job.

    Called inside the batch's transaction. Ids that are not plain identifiers
    are counted, never stored (see ``PurgeRequest``).
    """
    valid = list(dict.fromkeys(d for d in document_ids if document_id_valid(d)))
    invalid = sum(1 for d in document_ids if not document_id_valid(d))
    request = PurgeRequest.objects.create(
        key=operation,
        delete_job_id=job.id,
        portfolio_id=job.portfolio_id,
        property_id=job.property_id,
        record_kind=job.record_kind,
        document_ids=valid,
        invalid_ids=invalid,
        created_at=now,
    )
    return CleanupJob.objects.create(
        sweep_id=job.sweep_id,
        key=f"purge:{operation}",
        kind=JobKind.PURGE,
        purge_request=request,
        portfolio_id=job.portfolio_id,
        property_id=job.property_id,
        record_kind=job.record_kind,
        policy_version_id=job.policy_version_id,
        cutoff=job.cutoff,
        available_at=now,
    )


BatchHook = Callable[[int], None]


def job_run_slice(
    *,
    job_id: int,
    owner: str | None = None,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    batch_size: int | None = None,
    before_batch: BatchHook | None = None,
    after_batch: BatchHook | None = None,
) -> SliceResult:
    """Lease ``job_id`` and run a bounded slice of batches; never raises for job failures.

    ``before_batch``/``after_batch`` are called with the job id around each
    batch: the place a downstream call (or a test's failing executor) sits.
    """
    result = SliceResult(job_id=job_id)
    lease = job_lease(job_id=job_id, owner=owner or worker_name())
    if lease is None:
        return result
    result.leased = True
    max_batches = max_batches or settings.CLEANUP_SLICE_BATCHES
    max_seconds = max_seconds if max_seconds is not None else settings.CLEANUP_SLICE_SECONDS
    limit = min(batch_size or settings.CLEANUP_BATCH_SIZE, 1000)
    job = _load(job_id)
    started = time.monotonic()
    try:
        if job.kind == JobKind.PURGE:
            from cleanup_ops.purge import purge_run

            purge_run(
                job=job,
                lease=lease,
                result=result,
                max_requests=max_batches,
                max_seconds=max_seconds,
                before_request=before_batch,
                after_request=after_batch,
            )
        else:
            while True:
                wait = _wait_for_token(job.portfolio_id)
                if wait > 0:
                    # No token soon: give the job back for later (not an attempt)
                    # rather than sleeping while holding the lease.
                    result.deferred_seconds = wait
                    job_release(lease=lease, available_at=timezone.now() + timedelta(seconds=wait))
                    break
                if before_batch:
                    before_batch(job_id)
                deleted, outcome = run_batch(job=job, lease=lease, limit=limit)
                result.batches += 1
                result.rows_deleted += deleted
                if after_batch:
                    after_batch(job_id)
                if outcome:
                    result.outcome = outcome
                    break
                if result.batches >= max_batches or time.monotonic() - started >= max_seconds:
                    job_release(lease=lease)
                    break
    except Exception as exc:
        classification = classify(exc, now=timezone.now())
        result.error_category = classification.category
        if classification.category == FailureCategory.LEASE_LOST:
            result.lease_lost = True
            logger.warning(
                "cleanup job %s: lease lost, stopping without committing",
                job_id,
                extra={"job_id": job_id, "category": classification.category},
            )
        else:
            logger.warning(
                "cleanup job %s: %s (%s)",
                job_id,
                classification.category,
                classification.error_class,
                extra={"job_id": job_id, "category": classification.category},
            )
            try:
                result.dead = job_fail(lease=lease, classification=classification)
            except Exception:
                logger.warning(
                    "cleanup job %s: could not record the failure; the lease will expire",
                    job_id,
                    extra={"job_id": job_id, "category": classification.category},
                )
    if result.outcome:
        logger.info(
            "cleanup job %s finished: %s",
            job_id,
            result.outcome,
            extra={"job_id": job_id, "status": result.outcome, "record_kind": job.record_kind},
        )
    if result.outcome or result.dead:
        sweep_refresh_status(sweep_id=CleanupJob.objects.values_list("sweep_id", flat=True).get(pk=job_id))
    return result


def _wait_for_token(portfolio_id: int, buckets: list[BucketConfig] | None = None) -> float:
    """0 once a token is taken; else the deferral, after at most one short wait."""
    wait = tokens_acquire(portfolio_id=portfolio_id, now=timezone.now().timestamp(), buckets=buckets)
    if 0 < wait <= settings.CLEANUP_TOKEN_WAIT_SECONDS:
        time.sleep(wait)
        wait = tokens_acquire(portfolio_id=portfolio_id, now=timezone.now().timestamp(), buckets=buckets)
    return wait


def job_fail(*, lease: Lease, classification, now: datetime | None = None) -> bool:  # type: ignore[no-untyped-def]
    """Record a failed attempt: schedule a retry or make a dead letter. True if dead.

    Fenced like a batch: only the lease holder records the failure.
    """
    now = now or timezone.now()
    with transaction.atomic():
        job = (
            CleanupJob.objects.select_for_update()
            .filter(pk=lease.job_id, state=JobState.LEASED, lease_token=lease.token)
            .first()
        )
        if job is None:
            return False
        job.last_error_category = classification.category
        job.last_error_class = classification.error_class[:100]
        category = classification.category
        if classification.retryable:
            job.attempt += 1
            first = job.first_leased_at or now
            if classification.retry_after is not None:
                due = classification.retry_after + timedelta(seconds=retry_after_jitter())
            else:
                delay = backoff_delay(
                    attempt=job.attempt,
                    base=settings.CLEANUP_BACKOFF_BASE_SECONDS,
                    cap=settings.CLEANUP_BACKOFF_CAP_SECONDS,
                )
                due = now + timedelta(seconds=delay)
            if job.attempt >= settings.CLEANUP_MAX_ATTEMPTS:
                category = FailureCategory.RETRY_BUDGET_EXHAUSTED
            elif due - first > timedelta(seconds=settings.CLEANUP_MAX_AGE_SECONDS):
                category = FailureCategory.AGE_BUDGET_EXHAUSTED
            else:
                job.mark_retry(at=due)
                return False
        job.mark_dead()
        DeadLetter.objects.create(
            job=job,
            category=category,
            error_class=classification.error_class[:100],
            attempts=job.attempt,
            first_seen_at=job.first_leased_at or now,
            last_seen_at=now,
            portfolio_id=job.portfolio_id,
            property_id=job.property_id,
            record_kind=job.record_kind,
            policy_version_id=job.policy_version_id,
            sweep_id=job.sweep_id,
        )
    return True


@dataclass
class TurnResult:
    slices: int = 0
    rows_deleted: int = 0


def worker_turn(*, job_id: int, owner: str | None = None) -> TurnResult:
    """One broker task's work: the delivered job's slice, then more due jobs.

    Handing every slice through the broker costs a fetch, a poll wait and a
    dispatcher call; instead the worker keeps taking the next due job in fair
    order (only jobs with no message waiting in the broker, so it never races
    a delivery) until ``CLEANUP_SLICE_SECONDS`` is spent. Fairness is the
    dispatcher's order either way, and a turn is as bounded as one slice.
    """
    from cleanup_ops.dispatch import fair_due_job_ids

    owner = owner or worker_name()
    deadline = time.monotonic() + settings.CLEANUP_SLICE_SECONDS
    turn = TurnResult()
    next_id: int | None = job_id
    while next_id is not None:
        remaining = deadline - time.monotonic()
        result = job_run_slice(job_id=next_id, owner=owner, max_seconds=max(0.1, remaining))
        turn.slices += 1
        turn.rows_deleted += result.rows_deleted
        if not result.leased or result.deferred_seconds or time.monotonic() >= deadline:
            break
        ids = fair_due_job_ids(now=timezone.now(), limit=1)
        next_id = ids[0] if ids else None
    return turn


@dataclass
class DrainResult:
    slices: int = 0
    rows_deleted: int = 0
    documents_purged: int = 0
    waited_seconds: float = 0.0


def cleanup_drain(
    *, max_seconds: float = 0.0, progress: Callable[[int, int], None] | None = None, poll: float = 0.5
) -> DrainResult:
    """Run due jobs in this process, fairly, until none is due.

    Jobs that are not yet due (or leased by a live worker elsewhere) are waited
    for up to ``max_seconds`` in total; the default returns as soon as nothing
    is due.
    """
    from cleanup_ops.dispatch import fair_due_job_ids

    result = DrainResult()
    deadline = time.monotonic() + max_seconds
    owner = f"drain:{worker_name()}"
    while True:
        ids = fair_due_job_ids(now=timezone.now(), limit=20, exclude_enqueued=False)
        if not ids:
            still_open = CleanupJob.objects.filter(state__in=[JobState.PENDING, JobState.LEASED]).exists()
            if not still_open or time.monotonic() >= deadline:
                break
            time.sleep(poll)
            result.waited_seconds += poll
            continue
        for job_id in ids:
            outcome = job_run_slice(job_id=job_id, owner=owner)
            result.slices += 1
            result.rows_deleted += outcome.rows_deleted
            result.documents_purged += outcome.documents_purged
            if progress:
                open_jobs = CleanupJob.objects.filter(state__in=[JobState.PENDING, JobState.LEASED]).count()
                progress(result.slices, result.slices + open_jobs)
    return result
