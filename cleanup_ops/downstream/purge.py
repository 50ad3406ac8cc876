"""Downstream purge: remove a deleted batch's attachments from the document store.

Protocol of a purge job's slice (the job is already leased by
``execution.runner.job_run_slice``, which also classifies any failure):

1. Read the job's ``PurgeRequest`` (document ids, key, scope) and its cursor:
   the number of documents already done. A redrive starts from the old cursor.
2. Per document, in order:
   a. if the store answered 429/503 with a ``Retry-After`` that has not
      passed yet (to this worker or any other), give the job back until that
      instant, without counting an attempt; otherwise take a token from the
      store's own buckets (``DOCSTORE_RATE_*``: global and per portfolio,
      apart from the delete buckets); no token soon → give the job back for
      later, again without counting an attempt;
   b. **the decision about that document**, whatever request, scope or
      portfolio asks (lock, then read): lock the document's
      ``DocumentDisposition`` row (``FOR UPDATE``; created on first use) —
      every purge of that document id serialises here, and so does every
      batch that deletes a record naming it (``sql.dispositions_take``), so
      the deleted records read next cannot grow while this decides — then, in
      a later statement, take the scope lock of *every* deleted record that
      named it (their property and portfolio rows ``FOR SHARE``, from
      ``DeletedAttachment``: the lock a batch takes, which placing a hold
      takes ``FOR UPDATE``), then, in later statements that see any hold
      waited for:
      - already ``purged``: by another request, counted as already gone; by
        this same request (a worker that lost its lease after the call),
        counted as purged. Nothing is sent. (A purged id that a deleted
        record names again was reused: the batch made it ``pending`` again.)
      - an active legal hold over any record that named the document —
        deleted by any batch, of any kind or property
        (``retention.eligibility.holds_covering``) → ask the store whether
        it still has the file (``HEAD``): if it does, the document is **set
        aside** (disposition ``set_aside``); if not, it is recorded as
        absent, never as set aside. A set-aside document stays so until
        every such hold is released; the next sweep then hands it to a new
        purge that decides again (``purge_requeue_released``);
      - any remaining record of any kind still naming the document id → the
        document is **skipped as still referenced** (``documents_referenced``)
        and never deleted: that record's own deletion purges it later;
   c. otherwise ``DELETE /documents/<id>`` with ``Idempotency-Key: <request
      key>:<id>`` and a **fencing deadline** (``Fence-Deadline``, on the
      database's clock: the decision's last statement plus the session's idle
      bound, less the allowed clock skew). On PostgreSQL the decision's
      transaction — and so its locks — stays open across this call, which is
      bounded by the store's timeouts; ``idle_in_transaction_session_timeout``
      ends the session of a worker that stalls past that bound, and the store
      refuses a DELETE that arrives after the deadline (412 →
      ``StaleDecision``, retried under a fresh decision). So no hold commits
      between the check and an applied DELETE. The job row is never locked
      during the call. 2xx → deleted; 404 → already gone, also done. The
      disposition becomes ``purged`` in the decision's transaction;
   d. one short fenced transaction that locks the job row where the lease
      token is still ours and moves the cursor past the document, counting it
      (``documents_held``/``held_document_ids`` for a set-aside one). If the
      lease was lost after the decision committed, the next holder finds the
      disposition ``purged`` by this request and sends nothing; if the
      decision's transaction did not commit, it decides again and sends the
      same key, which the store answers from its idempotency record.
3. Cursor at the end → the job is done, in the same fenced way: ``purged``, or
   ``purge_held`` when documents were set aside. If the outbox counted ids
   or keys that cannot be purged (``PurgeRequest.unpurgeable`` names their
   records), the job instead becomes a ``policy_or_input`` dead letter once
   the valid ones are done, naming the kind and those records: the files of
   such records cannot be found safely and an operator has to look.

Stores that are not fenced (a Django storage: ``downstream.stores``; S3, the
file system) follow the same protocol a batch of documents at a time
(``_check_and_delete_many``, up to ``STORAGE_PURGE_BATCH_SIZE``, S3's
``DeleteObjects`` limit of 1,000): in one transaction every document's
disposition row ``FOR UPDATE`` in document order, then the scope rows of
every deleted record that named any of them, then the holds (``HEAD`` before
any set-aside) and the living references, set-based, a verdict per document;
then one call for the clear ones. Nothing can refuse a late call, so it is
started only if the session — and so the locks — is sure to outlive the
call's client-side bound (``_call_gate``; otherwise ``StaleDecision``,
nothing sent). Each key's result is recorded under the locks; after a call
whose effect is unknown (a timeout) the store is asked about each key, and a
file it no longer has is recorded as gone. Step d then moves the cursor past
every document up to the first key the call did not settle (a per-key
``SlowDown``), whose error is raised once the others are recorded. A key the
store refuses (a per-key ``AccessDenied``) names its records in the request's
``unpurgeable`` like a key that could not be sent; docs/architecture.md says
what a hold placed at any moment gets on each backend.

What remains open: a record that starts naming a document id after the
check (record writes by the application take no lock of ours). SQLite (the
demo) has no row locks and serialises writers: the check commits before the
call there, and no deadline is sent.

Failures are exceptions from the client and are classified by
``cleanup_ops.recovery.classification``: 429/503 wait for ``Retry-After``; other 5xx,
connection errors, timeouts and stale decisions back off and retry with the
same key; other 4xx and redirects dead-letter as ``downstream_rejected``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Sum

from cleanup_ops import clock, sql
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.dispatch import dispatch_after_commit
from cleanup_ops.downstream.client import InvalidDocumentId
from cleanup_ops.downstream.stores import (
    ABSENT,
    DELETED,
    DOCSTORE,
    FAILED,
    REFUSED,
    AttachmentStore,
    KeyResult,
    ref_key,
    store_for,
)
from cleanup_ops.execution.batches import JobRef
from cleanup_ops.execution.leases import (
    JobLease,
    job_finish,
    job_release,
    lease_expiry_from,
    lease_renewal,
    lock_job,
    token_wait_next_slice,
    wait_for_token,
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
from cleanup_ops.ratelimit import docstore_buckets_for, docstore_hold_remaining, docstore_hold_until
from cleanup_ops.recovery.classification import (
    DownstreamConnectionError,
    DownstreamError,
    DownstreamTimeout,
    InvalidInput,
    LeaseLost,
    StaleDecision,
    parse_retry_after,
    retry_after_jitter,
)
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from retention.eligibility import holds_covering
from retention.registry import REGISTRY

logger = logging.getLogger(__name__)

Hook = Callable[[int], None]

# What the decision says of one document (step 2b).
CLEAR = "clear"
HELD = "held"
REFERENCED = "referenced"
ALREADY = "already"  # purged before, by another request
PURGED_BY_US = "purged_by_us"  # purged before by this request (a lost lease after the call)


@dataclass
class PurgeProgress:
    """What a purge slice did so far (kept when it raises midway)."""

    requests: int = 0
    outcome: str = ""
    deferred_seconds: float = 0.0
    set_aside: int = 0  # documents set aside under a legal hold
    referenced: int = 0  # documents skipped because a remaining record names them


@dataclass(frozen=True)
class _Request:
    """A purge request as a slice needs it, read once."""

    id: int
    key: str
    document_ids: list[str]
    invalid: int
    portfolio_id: int
    property_id: int | None  # None: a kind without a property (the partition is the portfolio)
    record_kind: str
    store: str


class UnpurgeableDocuments(InvalidDocumentId):
    """Records of the request name files that cannot be purged (an invalid
    id, a key too long, blank or refused by the storage): named in the
    request's ``unpurgeable``, for an operator (a ``policy_or_input`` letter)."""


def idempotency_key(request_key: str, document_id: str) -> str:
    return f"{request_key}:{document_id}"


def purge_run(
    *,
    job: JobRef,
    lease: JobLease,
    progress: PurgeProgress,
    max_requests: int,
    max_seconds: float,
    before_request: Hook | None = None,
    after_request: Hook | None = None,
    lease_until: datetime | None = None,
) -> None:
    """Run a bounded slice of a leased purge job; raises on failure (the caller classifies).

    ``lease_until``: the earliest the lease may expire (read before it was
    taken; by default a lease taken now), which bounds a sleep for the
    store's tokens; each request's advance renews it."""
    request = _request_load(job)
    cursor = CleanupJob.objects.values_list("cursor", flat=True).get(pk=job.id)
    buckets = docstore_buckets_for(job.portfolio_id)
    lease_until = lease_until or lease_expiry_from(clock.now())
    started = time.monotonic()
    steps = 0
    with store_for(request.store) as store:
        while True:
            if cursor >= len(request.document_ids):
                _unpurgeable_raise(request)
                progress.outcome = _purge_finish(job=job, lease=lease, request_id=request.id)
                return
            wait = docstore_hold_remaining(now=clock.now().timestamp())
            if wait > 0:
                wait += retry_after_jitter()
            else:
                slice_left = max_seconds - (time.monotonic() - started)
                wait = wait_for_token(job.portfolio_id, buckets=buckets, lease_until=lease_until, slice_left=slice_left)
                if wait > 0 and token_wait_next_slice(wait):
                    # Only this slice's end comes before the store's token: back
                    # due now, the next slice reserves and sleeps.
                    job_release(lease=lease)
                    return
            if wait > 0:
                progress.deferred_seconds = wait
                job_release(lease=lease, available_at=clock.now() + timedelta(seconds=wait))
                return
            if before_request:
                before_request(job.id)
            outcomes: list[tuple[str, str, str]] = []
            failure: BaseException | None = None
            # The advance renews the lease from its own reading of the clock, later than this one.
            renewed_from = clock.now()
            try:
                if store.fenced:
                    document_id = request.document_ids[cursor]
                    verdict, effect = _check_and_delete(store, request=request, document_id=str(document_id))
                    cursor = _purge_advance(
                        job=job, lease=lease, request=request, cursor=cursor, verdict=verdict, effect=effect
                    )
                    outcomes = [(verdict, effect, "")]
                else:
                    refs = [str(d) for d in request.document_ids[cursor : cursor + store.max_keys]]
                    done, failure = _check_and_delete_many(store, request=request, refs=refs)
                    cursor = _purge_advance_many(job=job, lease=lease, request=request, cursor=cursor, outcomes=done)
                    outcomes = done
            except DownstreamError as exc:
                _hold_all_purges(exc)
                raise
            lease_until = lease_expiry_from(renewed_from)
            _progress_count(progress, outcomes)
            if failure is not None:
                # The documents before it are recorded; this one is retried.
                if isinstance(failure, DownstreamError):
                    _hold_all_purges(failure)
                raise failure
            steps += 1
            if after_request and any(verdict == CLEAR for verdict, _, _ in outcomes):
                after_request(job.id)
            if steps >= max_requests or time.monotonic() - started >= max_seconds:
                job_release(lease=lease)
                return


def _progress_count(progress: PurgeProgress, outcomes: list[tuple[str, str, str]]) -> None:
    for verdict, effect, _ in outcomes:
        if verdict == HELD:
            progress.set_aside += 1
        elif verdict == REFERENCED:
            progress.referenced += 1
        elif verdict == CLEAR and effect != REFUSED:
            progress.requests += 1


def _unpurgeable_raise(request: _Request) -> None:
    """Every document done: records whose files cannot be purged stop the job
    (a dead letter naming the kind and those records, never the keys)."""
    invalid, unpurgeable = PurgeRequest.objects.values_list("invalid_ids", "unpurgeable").get(pk=request.id)
    if not invalid:
        return
    record_ids = [entry.get("record_id") for entry in unpurgeable or [] if isinstance(entry, dict)]
    logger.warning(
        "purge: %s record(s) of kind %s name files that cannot be purged: %s",
        invalid,
        request.record_kind,
        record_ids,
        extra={"purge_request_id": request.id, "record_kind": request.record_kind, "record_ids": record_ids},
    )
    if request.store:
        raise UnpurgeableDocuments(f"{request.record_kind}: records {record_ids} name keys that cannot be purged")
    raise InvalidDocumentId("purge request has invalid document ids")


def _request_load(job: JobRef) -> _Request:
    row = (
        PurgeRequest.objects.filter(pk=job.purge_request_id)  # type: ignore[misc]  # None finds none: raised below
        .values_list("id", "key", "document_ids", "invalid_ids", "portfolio_id", "property_id", "record_kind", "store")
        .first()
    )
    if row is None:
        raise InvalidInput("purge job without a purge request")
    if not isinstance(row[2], list):
        raise InvalidInput("purge request payload is not a list")
    return _Request(*row)


def _check_and_delete(store: AttachmentStore, *, request: _Request, document_id: str) -> tuple[str, str]:
    """Step 2b-c: the verdict, and the store's effect when the document was sent."""
    key = idempotency_key(request.key, document_id)
    if not sql.is_postgres():
        # SQLite serialises writers and has no row locks: decide, commit, call, record.
        with transaction.atomic():
            verdict = _purge_decide(request=request, document_id=document_id)
        if verdict != CLEAR:
            return verdict, ""
        (result,) = store.delete([document_id], idempotency_keys=[key])
        effect = result.effect
        with transaction.atomic():
            _disposition_mark(document_id, state=DispositionState.PURGED, request_id=request.id)
        return verdict, effect
    outermost = not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cur:
        if outermost:
            # Backstop for the locks held across the call: PostgreSQL ends the
            # session if it sits idle in this transaction longer than the
            # call's bound — a stalled worker gives its locks back.
            sql.execute(sql.transaction_idle_timeout(), [str(math.ceil(_lock_bound_seconds() * 1000))], cur=cur)
        verdict = _purge_decide(request=request, document_id=document_id, cur=cur, store=store)
        if verdict != CLEAR:
            return verdict, ""
        checkpoint("purge.before_store_call")
        # Read right before the call, on the decision's own session: a session
        # that ended while the worker stalled (its locks gone, whatever ended
        # it) fails here and sends nothing; one that is alive now lives at
        # least its idle bound past this statement, which the deadline spans.
        deadline = _fence_deadline(cur)
        (result,) = store.delete([document_id], idempotency_keys=[key], deadline=deadline)
        effect = result.effect
        checkpoint("purge.after_store_call")
        # Still under the document's lock: no other purge decides it meanwhile.
        _disposition_mark(document_id, state=DispositionState.PURGED, request_id=request.id)
        return verdict, effect


def _fence_deadline(cur: Any) -> float:
    """The instant (database clock) until which the store may apply this
    decision's DELETE: the last statement's end plus the session's idle
    bound, less the clock skew allowed between the store and the database.

    Why it holds: the decision's locks live as long as its session, and
    PostgreSQL ends the session no earlier than the idle bound after its
    last statement (this one); so a DELETE the store applies by its clock
    before the deadline is applied, in real time, before the locks can be
    gone — as long as the store's clock is within ``DOCSTORE_CLOCK_SKEW_SECONDS``
    of the database's. A worker that stalls past it is refused (412), and
    decides again under fresh locks."""
    (database_now,) = sql.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())", cur=cur).fetchone()
    return float(database_now) + _lock_bound_seconds() - settings.DOCSTORE_CLOCK_SKEW_SECONDS


def _lock_bound_seconds() -> float:
    """The longest one call can take under the client's timeouts (pool, connect,
    write, two reads), plus a margin and the clock skew allowed: how long
    the decision's locks may be held idle, and the fencing deadline's span."""
    connect, read = settings.DOCSTORE_CONNECT_TIMEOUT, settings.DOCSTORE_READ_TIMEOUT
    return 2 * connect + 3 * read + 5 + settings.DOCSTORE_CLOCK_SKEW_SECONDS


def _purge_decide(*, request: _Request, document_id: str, cur: Any = None, store: AttachmentStore | None = None) -> str:
    """Inside the caller's transaction: the one decision about ``document_id``.

    The document's disposition row locked first (every purge of it waits
    here), then the scope rows of every deleted record that named it, then —
    in later statements, which under READ COMMITTED see a hold whose
    placement we waited for — the hold and reference checks.
    """
    DocumentDisposition.objects.bulk_create([DocumentDisposition(document_id=document_id)], ignore_conflicts=True)
    state, decided_by = (
        DocumentDisposition.objects.select_for_update()
        .filter(document_id=document_id)
        .values_list("state", "decided_by_id")[0]
    )
    checkpoint("purge.after_decision_lock")
    if state == DispositionState.PURGED:
        # This request's own earlier call (whose worker lost its lease before
        # moving the cursor) counts as purged here; another's as already gone.
        return PURGED_BY_US if decided_by == request.id else ALREADY
    # Read after the document's lock: every batch that names the document
    # takes that row too (``sql.dispositions_take``), so the deleted records
    # read here are all there will be until this decision ends.
    locked = sql.execute(sql.document_scopes_lock(), [document_id], cur=cur)
    if cur is not None:
        locked.fetchall()
    if any(not spec.has_property for spec in REGISTRY.values()):
        # Records of a kind without a property: their scope is the portfolio row alone.
        locked = sql.execute(sql.document_portfolios_lock(), [document_id], cur=cur)
        if cur is not None:
            locked.fetchall()
    checkpoint("purge.after_scope_lock")
    if document_held(document_id):
        if store is not None and not store.exists(ref_key(request.store, document_id)):
            # The proof says what the store says: a file it no longer has
            # (a call of an earlier decision applied after its locks were
            # gone, or removed by other means) is not "set aside".
            logger.warning(
                "purge: document %s is under a legal hold but the store no longer has it",
                document_id,
                extra={"document_id": document_id, "purge_request_id": request.id},
            )
            _disposition_mark(document_id, state=DispositionState.PURGED, request_id=request.id)
            return ALREADY
        _disposition_mark(document_id, state=DispositionState.SET_ASIDE, request_id=request.id)
        return HELD
    if document_still_referenced(document_id, store=request.store):
        return REFERENCED
    return CLEAR


def _check_and_delete_many(
    store: AttachmentStore, *, request: _Request, refs: list[str]
) -> tuple[list[tuple[str, str, str]], BaseException | None]:
    """Step 2b-c for a store that is not fenced (a Django storage), a batch
    at a time: every document's decision in one transaction, one call for
    the clear ones (``DeleteObjects`` on S3), each key's result recorded.

    Returns (verdict, effect, code) for the documents done, in order, and
    the failure that stops at the first key the call did not settle (its
    error, raised once the documents before it are recorded), or None.
    On PostgreSQL the locks are held across the call as for the HTTP store,
    but nothing can refuse a late call: it is started only if the decision's
    session is sure to outlive the call's client-side bound
    (``_call_gate``), else nothing is sent and the job decides again."""
    if not sql.is_postgres():
        # SQLite serialises writers and has no row locks: decide, commit, call, record.
        with transaction.atomic():
            verdicts = _purge_decide_many(request=request, refs=refs, store=store)
        results = _store_delete(store, request=request, refs=[r for r in refs if verdicts[r] == CLEAR])
        with transaction.atomic():
            _dispositions_mark_gone(results, request_id=request.id)
        return _outcomes(refs, verdicts, results)
    outermost = not connection.in_atomic_block
    bound = _storage_lock_bound_seconds(store)
    with transaction.atomic(), connection.cursor() as cur:
        if outermost:
            sql.execute(sql.transaction_idle_timeout(), [str(math.ceil(bound * 1000))], cur=cur)
        verdicts = _purge_decide_many(request=request, refs=refs, cur=cur, store=store)
        clear = [r for r in refs if verdicts[r] == CLEAR]
        results = {}
        if clear:
            checkpoint("purge.before_store_call")
            _call_gate(cur, store=store, bound=bound)
            results = _store_delete(store, request=request, refs=clear)
            checkpoint("purge.after_store_call")
            # Still under the documents' locks.
            _dispositions_mark_gone(results, request_id=request.id)
        return _outcomes(refs, verdicts, results)


def _storage_lock_bound_seconds(store: AttachmentStore) -> float:
    """How long a storage decision's locks may sit idle: the call's bound plus
    the same margin and skew allowance as the HTTP store's."""
    return store.call_bound_seconds() + 5 + settings.DOCSTORE_CLOCK_SKEW_SECONDS


def _call_gate(cur: Any, *, store: AttachmentStore, bound: float) -> None:
    """Right before a call the store cannot fence: read the database's clock
    on the decision's own session (a session that ended while the worker
    stalled fails here, and nothing is sent); the session then lives at
    least ``bound`` past this statement. Start the call only if what is left
    of that span — the deadline, less the clock skew allowed, less the time
    since the reading — still covers the call's client-side bound; else
    ``StaleDecision`` (nothing sent; retried under a fresh decision)."""
    sql.execute("SELECT 1", cur=cur).fetchone()
    read_at = time.monotonic()
    left = bound - settings.DOCSTORE_CLOCK_SKEW_SECONDS - (time.monotonic() - read_at)
    if left < store.call_bound_seconds():
        raise StaleDecision("the decision's locks may not outlive the call")


def _store_delete(store: AttachmentStore, *, request: _Request, refs: list[str]) -> dict[str, KeyResult]:
    """One call for ``refs``; after a call whose effect is unknown (a timeout,
    a lost connection), ask the store about each key (``exists``): a file it
    no longer has is recorded as gone, one it still has as failed (retried)."""
    if not refs:
        return {}
    keys = [ref_key(request.store, r) for r in refs]
    try:
        results = store.delete(keys)
    except (DownstreamTimeout, DownstreamConnectionError) as exc:
        try:
            results = [KeyResult(FAILED, "", exc) if store.exists(key) else KeyResult(DELETED) for key in keys]
        except Exception:
            raise exc from None
    return dict(zip(refs, results, strict=True))


def _dispositions_mark_gone(results: dict[str, KeyResult], *, request_id: int) -> None:
    gone = [ref for ref, result in results.items() if result.effect in (DELETED, ABSENT)]
    if gone:
        DocumentDisposition.objects.filter(document_id__in=gone).update(
            state=DispositionState.PURGED, decided_by_id=request_id, decided_at=clock.now()
        )


def _outcomes(
    refs: list[str], verdicts: dict[str, str], results: dict[str, KeyResult]
) -> tuple[list[tuple[str, str, str]], BaseException | None]:
    done: list[tuple[str, str, str]] = []
    for ref in refs:
        verdict = verdicts[ref]
        if verdict != CLEAR:
            done.append((verdict, "", ""))
            continue
        result = results[ref]
        if result.effect == FAILED:
            return done, result.error or DownstreamTimeout(result.code or "unknown")
        done.append((verdict, result.effect, result.code))
    return done, None


def _purge_decide_many(
    *, request: _Request, refs: list[str], store: AttachmentStore, cur: Any = None
) -> dict[str, str]:
    """``_purge_decide`` for a batch of documents, in the caller's transaction:
    every document's disposition row locked first (in document order, as a
    batch takes them), then the scope rows of every deleted record that named
    any of them, then — in later statements — the hold and reference checks,
    each set-based."""
    ordered = sorted(set(refs))
    DocumentDisposition.objects.bulk_create(
        [DocumentDisposition(document_id=r) for r in ordered], ignore_conflicts=True
    )
    rows = list(
        DocumentDisposition.objects.select_for_update()
        .filter(document_id__in=ordered)
        .order_by("document_id")
        .values_list("document_id", "state", "decided_by_id")
    )
    checkpoint("purge.after_decision_lock")
    verdicts: dict[str, str] = {}
    undecided = []
    for ref, state, decided_by in rows:
        if state == DispositionState.PURGED:
            verdicts[ref] = PURGED_BY_US if decided_by == request.id else ALREADY
        else:
            undecided.append(ref)
    if undecided and sql.is_postgres():
        sql.execute(sql.document_scopes_lock_many(), [undecided], cur=cur).fetchall()
        if any(not spec.has_property for spec in REGISTRY.values()):
            # Records of a kind without a property: their scope is the portfolio row alone.
            sql.execute(sql.document_portfolios_lock_many(), [undecided], cur=cur).fetchall()
    checkpoint("purge.after_scope_lock")
    held = documents_held(undecided) if undecided else set()
    for ref in sorted(held):
        if store.exists(ref_key(request.store, ref)):
            _disposition_mark(ref, state=DispositionState.SET_ASIDE, request_id=request.id)
            verdicts[ref] = HELD
        else:
            # As for the HTTP store: never "set aside" for a file the store does not have.
            logger.warning(
                "purge: document %s is under a legal hold but the store no longer has it",
                ref,
                extra={"document_id": ref, "purge_request_id": request.id},
            )
            _disposition_mark(ref, state=DispositionState.PURGED, request_id=request.id)
            verdicts[ref] = ALREADY
    rest = [r for r in undecided if r not in held]
    referenced = documents_referenced(rest, store=request.store)
    for ref in rest:
        verdicts[ref] = REFERENCED if ref in referenced else CLEAR
    return verdicts


def documents_held(document_ids: list[str]) -> set[str]:
    """Those of ``document_ids`` that an active hold keeps: it covers a deleted
    record — of any kind, property or portfolio, deleted by any batch — that
    named the document. One query for the whole list."""
    covering = holds_covering(
        portfolio=OuterRef("portfolio_id"),
        property=OuterRef("property_id"),
        kind=OuterRef("record_kind"),
        record=OuterRef("record_id"),
        record_key=OuterRef("record_key"),
    )
    named = DeletedAttachment.objects.filter(document_id__in=document_ids).filter(Exists(covering))
    return set(named.order_by().values_list("document_id", flat=True).distinct())


def document_held(document_id: str) -> bool:
    return bool(documents_held([document_id]))


def _disposition_mark(document_id: str, *, state: str, request_id: int) -> None:
    DocumentDisposition.objects.filter(document_id=document_id).update(
        state=state, decided_by_id=request_id, decided_at=clock.now()
    )


def document_still_referenced(document_id: str, *, store: str = DOCSTORE) -> bool:
    """Does any remaining record, of any kind with attachments in the same
    store, name ``document_id`` (a reference, ``stores.document_ref``)?"""
    key = ref_key(store, document_id)
    return any(
        spec.model._default_manager.filter(**{spec.attachment_field: key}).exists()
        for spec in REGISTRY.values()
        if spec.attachment_field and (spec.attachment_storage or DOCSTORE) == store
    )


def documents_referenced(refs: list[str], *, store: str) -> set[str]:
    """Those of ``refs`` that a remaining record of a kind of ``store`` names: a query per such kind."""
    if not refs:
        return set()
    by_key = {ref_key(store, r): r for r in refs}
    named: set[str] = set()
    for spec in REGISTRY.values():
        if spec.attachment_field and (spec.attachment_storage or DOCSTORE) == store:
            field = spec.attachment_field
            values = spec.model._default_manager.filter(**{f"{field}__in": list(by_key)}).values_list(field, flat=True)
            named.update(str(v) for v in values)
    return {by_key[k] for k in named if k in by_key}


def _hold_all_purges(exc: DownstreamError) -> None:
    if exc.status in (429, 503) and exc.retry_after:
        until = parse_retry_after(exc.retry_after, now=clock.now())
        if until is not None:
            docstore_hold_until(until=until.timestamp())


def _purge_advance(*, job: JobRef, lease: JobLease, request: _Request, cursor: int, verdict: str, effect: str) -> int:
    """Fenced: record one document as done and renew the lease. Returns the new cursor."""
    now = clock.now()
    with transaction.atomic(), connection.cursor() as cur:
        current = lock_job(cur, job_id=job.id, lease=lease, now=now)
        if current != cursor:
            # Someone else moved it (cannot happen while our lease holds): stop.
            raise LeaseLost(job.id)
        sql.execute(sql.purge_advance(), [cursor + 1, lease_renewal(now), job.id], cur=cur)
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
    *, job: JobRef, lease: JobLease, request: _Request, cursor: int, outcomes: list[tuple[str, str, str]]
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
        sql.execute(sql.purge_advance(), [after, lease_renewal(now), job.id], cur=cur)
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
