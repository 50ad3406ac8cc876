"""The purge job: a leased slice walks its request's documents in order and
moves the cursor past each one, then finishes the job (steps 1, 2a, 2d and 3
of the protocol stated in ``cleanup_ops.downstream.decision``); and the
re-queue of set-aside documents once their holds are released.

Apart from the decision (``downstream.decision``) and the store calls
(``downstream.fencing``): this part holds the job row's lease — the store's
tokens, the fenced cursor, the job's outcome — and never locks a document.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Sum
from psycopg import sql as pg

from cleanup_ops import clock, sql
from cleanup_ops.dispatch import dispatch_after_commit
from cleanup_ops.downstream.client import InvalidDocumentId
from cleanup_ops.downstream.decision import ALREADY, CLEAR, HELD, PURGED_BY_US, REFERENCED, SliceRequest, documents_held
from cleanup_ops.downstream.fencing import check_and_delete, check_and_delete_many
from cleanup_ops.downstream.stores import REFUSED, AttachmentStore, store_for
from cleanup_ops.execution.batches import PartitionStep
from cleanup_ops.execution.leases import (
    JobLease,
    JobRef,
    job_finish,
    lease_renewal,
    lock_job,
)
from cleanup_ops.models import (
    CleanupJob,
    DeletedAttachment,
    DispositionState,
    DocumentDisposition,
    JobKind,
    JobOutcome,
    JobState,
    PurgeRequest,
    Sweep,
    scope_of,
)
from cleanup_ops.ratelimit import DOCSTORE, docstore_hold_remaining, docstore_hold_until
from cleanup_ops.recovery.classification import (
    DownstreamError,
    InvalidInput,
    LeaseLost,
    parse_retry_after,
    retry_after_jitter,
)
from cleanup_ops.sweeps import sweep_mark_drained_if_finished

logger = logging.getLogger(__name__)

Hook = Callable[[int], None]


@dataclass
class PurgeProgress:
    """What a purge slice did so far (kept when it raises midway)."""

    requests: int = 0
    outcome: str = ""
    deferred_seconds: float = 0.0
    set_aside: int = 0  # documents set aside under a legal hold
    referenced: int = 0  # documents skipped because a remaining record names them


class UnpurgeableDocuments(InvalidDocumentId):
    """Records of the request name files that cannot be purged (an invalid
    id, a key too long, blank or refused by the storage): named in the
    request's ``unpurgeable``, for an operator (a ``policy_or_input`` letter)."""


class PurgeUnit:
    """A purge job as the slice engine's work unit (``execution.runner``): a
    step is one store request (one document on a fenced store, up to the
    store's ``max_keys`` otherwise) under the job's lease, spending the
    document store's tokens (``ratelimit.DOCSTORE``); the job finishes,
    without a token, once every document is done. The engine reserves,
    sleeps for, defers and gives back those tokens as for any other unit.
    Raises on failure (the engine's caller classifies); what was done before
    it stays counted in ``progress``."""

    family = DOCSTORE

    def __init__(
        self,
        *,
        job: JobRef,
        request: SliceRequest,
        store: AttachmentStore,
        before_request: Hook | None = None,
        after_request: Hook | None = None,
    ) -> None:
        self.job = job
        self.store = store
        self.request = request
        self.cursor = CleanupJob.objects.values_list("cursor", flat=True).get(pk=job.id)
        self.progress = PurgeProgress()
        self.before_request = before_request
        self.after_request = after_request
        self.cleared = False  # the last step cleared a document

    def held_back(self) -> float:
        """Seconds until the store lets purges go again (a 429's Retry-After,
        shared by every worker), jittered; 0 when it does now. Not a token
        wait: the job goes back until then."""
        backoff = docstore_hold_remaining(now=clock.now().timestamp())
        return backoff + retry_after_jitter() if backoff > 0 else 0.0

    def settle(self, jobs: list[JobRef], lease: JobLease) -> dict[int, PartitionStep]:
        """Every document done: the job finishes here, spending no token."""
        if self.cursor < len(self.request.document_ids):
            return {}
        _unpurgeable_raise(self.request)
        self.progress.outcome = _purge_finish(job=self.job, lease=lease, request_id=self.request.id)
        return {self.job.id: PartitionStep(self.job.id, outcome=self.progress.outcome, applied=True)}

    def step(self, jobs: list[JobRef], lease: JobLease) -> dict[int, PartitionStep]:
        job, request, store = self.job, self.request, self.store
        if self.before_request:
            self.before_request(job.id)
        outcomes: list[tuple[str, str, str]] = []
        failure: BaseException | None = None
        before = self.progress.requests
        try:
            if store.fenced:
                document_id = request.document_ids[self.cursor]
                verdict, effect = check_and_delete(store, request=request, document_id=str(document_id))
                self.cursor = _purge_advance(
                    job=job, lease=lease, request=request, cursor=self.cursor, verdict=verdict, effect=effect
                )
                outcomes = [(verdict, effect, "")]
            else:
                refs = [str(d) for d in request.document_ids[self.cursor : self.cursor + store.max_keys]]
                done, failure = check_and_delete_many(store, request=request, refs=refs)
                self.cursor = _purge_advance_many(
                    job=job, lease=lease, request=request, cursor=self.cursor, outcomes=done
                )
                outcomes = done
        except DownstreamError as exc:
            _hold_all_purges(exc)
            raise
        _progress_count(self.progress, outcomes)
        if failure is not None:
            # The documents before it are recorded; this one is retried.
            if isinstance(failure, DownstreamError):
                _hold_all_purges(failure)
            raise failure
        self.cleared = any(verdict == CLEAR for verdict, _, _ in outcomes)
        return {job.id: PartitionStep(job.id, deleted=self.progress.requests - before, applied=True)}

    def after_step(self, jobs: list[JobRef]) -> None:
        if self.after_request and self.cleared:
            self.after_request(self.job.id)


@contextmanager
def purge_unit(
    *, job: JobRef, before_request: Hook | None = None, after_request: Hook | None = None
) -> Iterator[PurgeUnit]:
    """A purge job's unit, with its store's session open for the slice."""
    request = _request_load(job)
    with store_for(request.store) as store:
        yield PurgeUnit(
            job=job, request=request, store=store, before_request=before_request, after_request=after_request
        )


def _progress_count(progress: PurgeProgress, outcomes: list[tuple[str, str, str]]) -> None:
    for verdict, effect, _ in outcomes:
        if verdict == HELD:
            progress.set_aside += 1
        elif verdict == REFERENCED:
            progress.referenced += 1
        elif verdict == CLEAR and effect != REFUSED:
            progress.requests += 1


def _unpurgeable_raise(request: SliceRequest) -> None:
    """Every document done: records whose files cannot be purged stop the job
    (a dead letter naming the kind and those records, never the keys)."""
    invalid, unpurgeable = PurgeRequest.objects.values_list("invalid_ids", "unpurgeable").get(pk=request.id)
    if not invalid:
        return
    record_ids = [entry.get("record_id") for entry in unpurgeable or [] if isinstance(entry, dict)]
    logger.warning(
        "purge: %s of kind %s name files that cannot be purged: %s",
        f"{invalid} record{'' if invalid == 1 else 's'}",
        request.record_kind,
        record_ids,
        extra={"purge_request_id": request.id, "record_kind": request.record_kind, "record_ids": record_ids},
    )
    if request.store:
        raise UnpurgeableDocuments(f"{request.record_kind}: records {record_ids} name keys that cannot be purged")
    raise InvalidDocumentId("purge request has invalid document ids")


def _request_load(job: JobRef) -> SliceRequest:
    row = (
        PurgeRequest.objects.filter(pk=job.purge_request_id)  # type: ignore[misc]  # None finds none: raised below
        .values_list("id", "key", "document_ids", "invalid_ids", "portfolio_id", "property_id", "record_kind", "store")
        .first()
    )
    if row is None:
        raise InvalidInput("purge job without a purge request")
    if not isinstance(row[2], list):
        raise InvalidInput("purge request payload is not a list")
    return SliceRequest(*row)


def _hold_all_purges(exc: DownstreamError) -> None:
    if exc.status in (429, 503) and exc.retry_after:
        until = parse_retry_after(exc.retry_after, now=clock.now())
        if until is not None:
            docstore_hold_until(until=until.timestamp())


def _purge_advance_sql() -> pg.Composed:
    """One document done: cursor + 1, counted as a request, lease renewed."""
    return sql.composed("UPDATE {job} SET cursor = %s, batches = batches + 1, lease_expires_at = %s WHERE id = %s")


def _purge_advance(
    *, job: JobRef, lease: JobLease, request: SliceRequest, cursor: int, verdict: str, effect: str
) -> int:
    """Fenced: record one document as done and renew the lease. Returns the new cursor."""
    now = clock.now()
    with transaction.atomic(), connection.cursor() as cur:
        current = lock_job(cur, job_id=job.id, lease=lease, now=now)
        if current != cursor:
            # Someone else moved it (cannot happen while our lease holds): stop.
            raise LeaseLost(job.id)
        sql.execute(_purge_advance_sql(), [cursor + 1, lease_renewal(now), job.id], cur=cur)
        if verdict == HELD:
            row = PurgeRequest.objects.select_for_update().get(pk=request.id)
            document_id = str(request.document_ids[cursor])
            if document_id not in row.held_document_ids:
                row.held_document_ids = [*row.held_document_ids, document_id]
            row.documents_held += 1
            row.save(update_fields=["held_document_ids", "documents_held"])
        else:
            counter = _COUNTERS[effect if verdict == CLEAR else verdict]
            PurgeRequest.objects.filter(pk=request.id).update(**{counter: F(counter) + 1})
    return cursor + 1


def _purge_advance_many(
    *, job: JobRef, lease: JobLease, request: SliceRequest, cursor: int, outcomes: list[tuple[str, str, str]]
) -> int:
    """``_purge_advance`` for a batch: one fenced transaction moves the cursor
    past every document done and counts each; a key the store refused names
    its records in ``unpurgeable`` (the store's error code as the problem)."""
    if not outcomes:
        return cursor
    now = clock.now()
    with transaction.atomic(), connection.cursor() as cur:
        current = lock_job(cur, job_id=job.id, lease=lease, now=now)
        if current != cursor:
            raise LeaseLost(job.id)
        after = cursor + len(outcomes)
        sql.execute(_purge_advance_sql(), [after, lease_renewal(now), job.id], cur=cur)
        refs = [str(d) for d in request.document_ids[cursor:after]]
        counts: dict[str, int] = {}
        held: list[str] = []
        refused: dict[str, str] = {}
        for ref, (verdict, effect, code) in zip(refs, outcomes, strict=True):
            if verdict == HELD:
                held.append(ref)
            elif verdict == CLEAR and effect == REFUSED:
                refused[ref] = code
            else:
                counter = _COUNTERS[effect if verdict == CLEAR else verdict]
                counts[counter] = counts.get(counter, 0) + 1
        if held or refused:
            row = PurgeRequest.objects.select_for_update().get(pk=request.id)
            row.held_document_ids = [*row.held_document_ids, *(r for r in held if r not in row.held_document_ids)]
            row.documents_held += len(held)
            if refused:
                named = DeletedAttachment.objects.filter(
                    document_id__in=list(refused), record_kind=request.record_kind
                ).values_list("document_id", "record_id")
                entries = [{"record_id": rid, "problem": f"refused:{refused[ref] or 'unknown'}"} for ref, rid in named]
                row.unpurgeable = [*row.unpurgeable, *entries]
                row.invalid_ids += len(refused)
            row.save(update_fields=["held_document_ids", "documents_held", "unpurgeable", "invalid_ids"])
        if counts:
            PurgeRequest.objects.filter(pk=request.id).update(
                **{counter: F(counter) + n for counter, n in counts.items()}
            )
    return after


# The request's counter for each way a document is done.
_COUNTERS = {
    "deleted": "documents_purged",
    "absent": "documents_absent",
    ALREADY: "documents_absent",
    PURGED_BY_US: "documents_purged",
    REFERENCED: "documents_referenced",
}


def _purge_finish(*, job: JobRef, lease: JobLease, request_id: int) -> str:
    """Fenced: the job is done; ``purge_held`` when its request set documents aside."""
    now = clock.now()
    held = PurgeRequest.objects.filter(pk=request_id, documents_held__gt=0).exists()
    outcome = JobOutcome.PURGE_HELD if held else JobOutcome.PURGED
    with transaction.atomic(), connection.cursor() as cur:
        lock_job(cur, job_id=job.id, lease=lease, now=now)
        job_finish(cur, job_id=job.id, outcome=outcome, now=now)
        sweep_mark_drained_if_finished(sweep_id=job.sweep_id, now=now)
    return outcome


def purge_requeue_released(*, sweep: Sweep, now: datetime | None = None) -> list[CleanupJob]:
    """Hand documents set aside under holds that are all released to a new purge in ``sweep``.

    Per request with set-aside documents (``held_document_ids``), with its
    row locked: a document some other purge has since purged is dropped; one
    that an active hold still covers (any record that named it, anywhere:
    ``documents_held``) stays set aside; the rest go to a new
    ``PurgeRequest`` (``origin``: the original; key derived from the
    original's) and its ``purge`` job in ``sweep``, which decides about each
    document again under its lock, exactly like any purge. Returns the jobs
    created.
    """
    now = now or clock.now()
    jobs = []
    pending = PurgeRequest.objects.filter(documents_held__gt=0).order_by("id").values_list("id", "held_document_ids")
    for request_id, held in pending:
        if not held:
            continue  # already handed on
        with transaction.atomic():
            request = PurgeRequest.objects.select_for_update(of=("self",)).select_related("origin").get(pk=request_id)
            if not request.held_document_ids:
                continue
            purged = set(
                DocumentDisposition.objects.filter(
                    document_id__in=request.held_document_ids, state=DispositionState.PURGED
                ).values_list("document_id", flat=True)
            )
            waiting = [d for d in request.held_document_ids if d not in purged]
            held_now = documents_held(waiting)
            still_held = [d for d in waiting if d in held_now]
            released = [d for d in waiting if d not in still_held]
            if len(still_held) == len(request.held_document_ids):
                continue
            request.held_document_ids = still_held
            request.save(update_fields=["held_document_ids"])
            if not released:
                continue
            origin = request.origin or request
            number = PurgeRequest.objects.filter(origin=origin).count() + 1
            key = hashlib.sha256(f"{origin.key}:released:{number}".encode()).hexdigest()
            again = PurgeRequest.objects.create(
                key=key,
                delete_job_id=request.delete_job_id,
                portfolio_id=request.portfolio_id,
                property_id=request.property_id,
                record_kind=request.record_kind,
                store=request.store,
                document_ids=released,
                origin=origin,
                created_at=now,
            )
            delete_job = CleanupJob.objects.get(pk=request.delete_job_id)
            jobs.append(
                CleanupJob.objects.create(
                    sweep=sweep,
                    key=f"purge:{key}",
                    job_kind=JobKind.PURGE,
                    purge_request=again,
                    cutoff=delete_job.cutoff,
                    available_at=now,
                    **scope_of(delete_job),
                )
            )
            Sweep.objects.reopen(sweep_ids={sweep.pk})
            dispatch_after_commit()
    return jobs


def purge_summary() -> dict[str, Any]:
    """Purge jobs by state and documents purged: what ``cleanup_drain`` prints."""
    by_state = dict(
        CleanupJob.objects.filter(job_kind=JobKind.PURGE).values_list("state").annotate(n=Count("id")).order_by()
    )
    totals = PurgeRequest.objects.aggregate(
        purged=Sum("documents_purged"),
        absent=Sum("documents_absent"),
        invalid=Sum("invalid_ids"),
        held=Sum("documents_held"),
        referenced=Sum("documents_referenced"),
    )
    return {
        "purge_jobs_by_state": {state: by_state.get(state, 0) for state in JobState.values},
        "purge_requests": PurgeRequest.objects.count(),
        "documents_purged": totals["purged"] or 0,
        "documents_already_gone": totals["absent"] or 0,
        "documents_invalid_ids": totals["invalid"] or 0,
        "documents_set_aside_under_hold": totals["held"] or 0,
        "documents_still_referenced": totals["referenced"] or 0,
    }
