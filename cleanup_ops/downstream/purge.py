"""Downstream purge: remove a deleted batch's attachments from the document store.

Protocol of a purge job's slice (the job is already leased by
``execution.runner.job_run_slice``, which also classifies any failure):

1. Read the job's ``PurgeRequest`` (document ids, key) and its cursor: the
   number of documents already done. A redrive starts from the old cursor.
2. Per document, in order:
   a. if the store answered 429/503 with a ``Retry-After`` that has not
      passed yet (to this worker or any other), give the job back until that
      instant, without counting an attempt; otherwise take a token from the
      store's own buckets (``DOCSTORE_RATE_*``: global and per portfolio,
      apart from the delete buckets); no token soon → give the job back for
      later, again without counting an attempt;
   b. ``DELETE /documents/<id>`` with ``Idempotency-Key: <request key>:<id>``,
      **outside any database transaction** (a slow store never holds a row
      lock). 2xx → deleted; 404 → already gone, also done;
   c. one short transaction that locks the job row where the lease token is
      still ours (fencing) and moves the cursor past the document, counting it.
      A worker whose lease expired during the call commits nothing; whoever
      holds the job next sends the same key again and the store answers from
      its idempotency record without deleting anything twice.
3. Cursor at the end → the job is done (``purged``), in the same fenced way.
   If the outbox counted ids that failed validation, the job instead becomes a
   ``policy_or_input`` dead letter once the valid ones are done: the files of
   such records cannot be found safely and an operator has to look.

Failures are exceptions from the client and are classified by
``cleanup_ops.recovery.classification``: 429/503 wait for ``Retry-After``; other 5xx,
connection errors and timeouts back off and retry with the same key; other
4xx and redirects dead-letter as ``downstream_rejected``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from cleanup_ops import sql
from cleanup_ops.downstream.client import DocstoreClient, InvalidDocumentId
from cleanup_ops.execution.batches import JobRef
from cleanup_ops.execution.leases import Lease, job_finish, job_release, lease_renewal, lock_job, wait_for_token
from cleanup_ops.models import CleanupJob, JobKind, JobOutcome, JobState, PurgeRequest
from cleanup_ops.ratelimit import docstore_buckets_for, docstore_hold_remaining, docstore_hold_until
from cleanup_ops.recovery.classification import (
    DownstreamError,
    InvalidInput,
    LeaseLost,
    parse_retry_after,
    retry_after_jitter,
)

Hook = Callable[[int], None]


@dataclass
class PurgeProgress:
    """What a purge slice did so far (kept when it raises midway)."""

    requests: int = 0
    outcome: str = ""
    deferred_seconds: float = 0.0


def idempotency_key(request_key: str, document_id: str) -> str:
    return f"{request_key}:{document_id}"


def purge_run(
    *,
    job: JobRef,
    lease: Lease,
    progress: PurgeProgress,
    max_requests: int,
    max_seconds: float,
    before_request: Hook | None = None,
    after_request: Hook | None = None,
) -> None:
    """Run a bounded slice of a leased purge job; raises on failure (the caller classifies)."""
    row = PurgeRequest.objects.filter(pk=job.purge_request_id).values_list("id", "key", "document_ids", "invalid_ids")
    if not row:
        raise InvalidInput("purge job without a purge request")
    request_id, key, document_ids, invalid = row[0]
    if not isinstance(document_ids, list):
        raise InvalidInput("purge request payload is not a list")
    cursor = CleanupJob.objects.values_list("cursor", flat=True).get(pk=job.id)
    buckets = docstore_buckets_for(job.portfolio_id)
    started = time.monotonic()
    with DocstoreClient() as client:
        while True:
            if cursor >= len(document_ids):
                if invalid:
                    raise InvalidDocumentId("purge request has invalid document ids")
                _purge_finish(job=job, lease=lease)
                progress.outcome = JobOutcome.PURGED
                return
            wait = docstore_hold_remaining(now=timezone.now().timestamp())
            if wait > 0:
                wait += retry_after_jitter()
            else:
                wait = wait_for_token(job.portfolio_id, buckets=buckets)
            if wait > 0:
                progress.deferred_seconds = wait
                job_release(lease=lease, available_at=timezone.now() + timedelta(seconds=wait))
                return
            if before_request:
                before_request(job.id)
            document_id = document_ids[cursor]
            try:
                effect = client.delete_document(document_id, idempotency_key=idempotency_key(key, str(document_id)))
            except DownstreamError as exc:
                _hold_all_purges(exc)
                raise
            cursor = _purge_advance(job=job, lease=lease, request_id=request_id, cursor=cursor, effect=effect)
            progress.requests += 1
            if after_request:
                after_request(job.id)
            if progress.requests >= max_requests or time.monotonic() - started >= max_seconds:
                job_release(lease=lease)
                return


def _hold_all_purges(exc: DownstreamError) -> None:
    if exc.status in (429, 503) and exc.retry_after:
        until = parse_retry_after(exc.retry_after, now=timezone.now())
        if until is not None:
            docstore_hold_until(until=until.timestamp())


def _purge_advance(*, job: JobRef, lease: Lease, request_id: int, cursor: int, effect: str) -> int:
    """Fenced: record one document as done and renew the lease. Returns the new cursor."""
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cur:
        current = lock_job(cur, job_id=job.id, lease=lease, now=now)
        if current != cursor:
            # Someone else moved it (cannot happen while our lease holds): stop.
            raise LeaseLost(job.id)
        sql.execute(sql.purge_advance(), [cursor + 1, lease_renewal(now), job.id], cur=cur)
        counter = "documents_purged" if effect == "deleted" else "documents_absent"
        PurgeRequest.objects.filter(pk=request_id).update(**{counter: F(counter) + 1})
    return cursor + 1


def _purge_finish(*, job: JobRef, lease: Lease) -> None:
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cur:
        lock_job(cur, job_id=job.id, lease=lease, now=now)
        job_finish(cur, job_id=job.id, outcome=JobOutcome.PURGED, now=now)


def purge_summary() -> dict[str, Any]:
    """Purge jobs by state and documents purged: what ``cleanup_drain`` prints."""
    by_state = dict(
        CleanupJob.objects.filter(kind=JobKind.PURGE).values_list("state").annotate(n=Count("id")).order_by()
    )
    totals = PurgeRequest.objects.aggregate(
        purged=Sum("documents_purged"), absent=Sum("documents_absent"), invalid=Sum("invalid_ids")
    )
    return {
        "purge_jobs_by_state": {state: by_state.get(state, 0) for state in JobState.values},
        "purge_requests": PurgeRequest.objects.count(),
        "documents_purged": totals["purged"] or 0,
        "documents_already_gone": totals["absent"] or 0,
        "documents_invalid_ids": totals["invalid"] or 0,
    }
