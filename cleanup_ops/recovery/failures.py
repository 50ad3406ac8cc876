"""Recording a failed attempt: a retry with backoff, or a dead letter.

Fenced like a batch: only the holder of a valid lease records the failure
(the job row is locked where the lease token is ours), so a worker whose lease
expired cannot overwrite what the next holder did. A retryable failure moves
the job back to pending, due after the backoff delay (exponential with full
jitter) or no earlier than the instant a ``Retry-After`` named; the attempt
count grows. When the attempt budget (``CLEANUP_MAX_ATTEMPTS``) or the age
budget (``CLEANUP_MAX_AGE_SECONDS`` since the first lease) runs out — or the
failure is not retryable — the job becomes dead and gets a ``DeadLetter``,
which an operator resolves (``recovery.operator``); nothing retries it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from cleanup_ops import clock
from cleanup_ops.dispatch import hint_due_at
from cleanup_ops.execution.leases import JobLease
from cleanup_ops.models import CleanupJob, DeadLetter, JobState, scope_of
from cleanup_ops.recovery.classification import (
    Classification,
    FailureCategory,
    backoff_delay,
    retry_after_jitter,
)
from cleanup_ops.sweeps import sweep_mark_drained_if_finished


def job_fail(*, lease: JobLease, classification: Classification, now: datetime | None = None) -> bool:
    """Record a failed attempt: schedule a retry or make a dead letter. True if dead."""
    now = now or clock.now()
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
                hint_due_at(job_ids=[job.pk], at=due)
                return False
        job.mark_dead()
        DeadLetter.objects.create(
            job=job,
            category=category,
            error_class=classification.error_class[:100],
            http_status=classification.http_status,
            message_class=classification.message_class,
            attempts=job.attempt,
            first_seen_at=job.first_leased_at or now,
            last_seen_at=now,
            sweep_id=job.sweep_id,
            **scope_of(job),
        )
        # In the same transaction as the job's end: a sweep is finished
        # exactly when its last job is (a crash cannot leave it running).
        sweep_mark_drained_if_finished(sweep_id=job.sweep_id, now=now)
    return True
