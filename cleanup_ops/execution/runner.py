"""Running jobs: a slice under one lease, a worker's turn, the in-process drain.

A **slice** leases one job, runs a bounded number of batches (or purge
requests) — ``CLEANUP_SLICE_BATCHES`` or ``CLEANUP_SLICE_SECONDS``, whichever
comes first — then releases it with its cursor saved, so one big property
never holds a worker for long and other portfolios get a turn. A rate-limit
wait longer than ``CLEANUP_TOKEN_WAIT_SECONDS`` gives the job back for later
without counting an attempt. Any exception is classified
(``recovery.classification``) and recorded under the lease
(``recovery.failures``); a slice never raises for a job's failure, so the
django-q2 task always returns normally.

A **worker's turn** is one broker task's work: the delivered job's slice, then
more due jobs in the dispatcher's fair order (only jobs with no message waiting
in the broker, so it never races a delivery) until the slice budget is spent.
The **drain** (``cleanup_drain``) runs due jobs in this process until none is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.downstream.purge import PurgeProgress, purge_run
from cleanup_ops.execution.batches import job_load, run_batch
from cleanup_ops.execution.leases import job_lease, job_release, wait_for_token, worker_name
from cleanup_ops.models import CleanupJob, JobKind, Sweep
from cleanup_ops.recovery.classification import FailureCategory, classify
from cleanup_ops.recovery.failures import job_fail

logger = logging.getLogger(__name__)


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
    job = job_load(job_id)
    started = time.monotonic()
    try:
        if job.kind == JobKind.PURGE:
            progress = PurgeProgress()
            try:
                purge_run(
                    job=job,
                    lease=lease,
                    progress=progress,
                    max_requests=max_batches,
                    max_seconds=max_seconds,
                    before_request=before_batch,
                    after_request=after_batch,
                )
            finally:
                # Requests made before a failure count too.
                result.batches = result.documents_purged = progress.requests
                result.outcome = progress.outcome
                result.deferred_seconds = progress.deferred_seconds
        else:
            while True:
                wait = wait_for_token(job.portfolio_id)
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
        Sweep.objects.mark_drained_if_finished(sweep_id=job.sweep_id, now=timezone.now())
    return result


@dataclass
class TurnResult:
    slices: int = 0
    rows_deleted: int = 0


def worker_turn(*, job_id: int, owner: str | None = None) -> TurnResult:
    """One broker task's work: the delivered job's slice, then more due jobs.

    Handing every slice through the broker costs a fetch, a poll wait and a
    dispatcher call; instead the worker keeps taking the next due job in fair
    order until ``CLEANUP_SLICE_SECONDS`` is spent. Fairness is the
    dispatcher's order either way, and a turn is as bounded as one slice.
    """
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
    result = DrainResult()
    deadline = time.monotonic() + max_seconds
    owner = f"drain:{worker_name()}"
    while True:
        ids = fair_due_job_ids(now=timezone.now(), limit=20, exclude_enqueued=False)
        if not ids:
            if not CleanupJob.objects.open().exists() or time.monotonic() >= deadline:
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
                progress(result.slices, result.slices + CleanupJob.objects.open().count())
    return result
