"""Running jobs: a slice under one lease, a worker's turn, the in-process drain.

A **slice** leases one job, runs a bounded number of batches (or purge
requests) — ``CLEANUP_SLICE_BATCHES`` or ``CLEANUP_SLICE_SECONDS``, whichever
comes first — then releases it with its cursor saved, so one big property
never holds a worker for long and other portfolios get a turn. Rate-limit
tokens are reserved for the instant they are there and slept for, lease
kept; a wait longer than the slice, ``CLEANUP_TOKEN_WAIT_SECONDS`` or the
lease can bear gives the job back until then, without counting an attempt
(``execution.leases``, "Tokens"). Any exception is classified
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
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

from cleanup_ops import clock
from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.downstream.purge import PurgeProgress, purge_run
from cleanup_ops.execution.batches import PartitionStep, job_load, run_batch, run_group_batch
from cleanup_ops.execution.leases import (
    JobLease,
    JobRef,
    SliceBudget,
    group_tokens,
    group_tokens_unused,
    job_lease,
    job_release,
    jobs_give_back_for_tokens,
    jobs_lease_group,
    jobs_release,
    lease_expiry_from,
    stop_event,
    stop_requested,
    token_sleep,
    token_wait_bound,
    token_wait_next_slice,
    wait_for_token,
    worker_name,
)
from cleanup_ops.models import CleanupJob, JobKind, JobState
from cleanup_ops.ratelimit import Reservation, slice_seconds
from cleanup_ops.recovery.classification import FailureCategory, LeaseLost, classify
from cleanup_ops.recovery.failures import job_fail
from retention.conf import MAX_BATCH_SIZE

logger = logging.getLogger(__name__)

# Set by SIGTERM in a worker process: take no new lease, finish the batch in
# flight, give the rest back, wake from a token sleep. (django-q2 stops a
# cluster by letting each worker finish its current task; a SIGTERM that
# reaches a worker directly — a whole-group stop, a container runtime — must
# not cut a batch short either, and must not start another.) The flag lives
# in ``execution.leases``, whose token sleep watches it.
_stopping = stop_event


def stop_on_sigterm() -> None:
    """Install the SIGTERM handler in this (worker) process, once."""
    if threading.current_thread() is not threading.main_thread():
        return
    if getattr(signal.getsignal(signal.SIGTERM), "cleanup_stop", False):
        return

    def request_stop(signum: int, frame: object) -> None:
        _stopping.set()

    request_stop.cleanup_stop = True  # type: ignore[attr-defined]  # a marker on the handler function
    signal.signal(signal.SIGTERM, request_stop)


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


def worker_session_bound() -> None:
    """End this worker's session once it sits idle inside a
    transaction longer than ``CLEANUP_IDLE_IN_TRANSACTION_SECONDS``. A worker
    that stalls mid-transaction (a GC pause, SIGSTOP, a frozen VM) then gives
    its row locks back instead of blocking hold placement and approvals in
    its portfolio for as long as it stalls; its transaction rolls back whole.
    Set once per database connection (a purge's decision sets its own,
    shorter bound for its transaction). A session that failed is replaced
    first."""
    if connection.errors_occurred and not connection.in_atomic_block:
        # The last slice failed on the database (say PostgreSQL ended this
        # session after a stall): reconnect if the session is gone, as
        # django-q2 does between tasks — the drain runs many slices in one.
        connection.close_if_unusable_or_obsolete()
    connection.ensure_connection()
    raw = connection.connection
    if getattr(connection, "_cleanup_bounded_session", None) is raw:
        return
    milliseconds = str(round(settings.CLEANUP_IDLE_IN_TRANSACTION_SECONDS * 1000))
    with connection.cursor() as cur:
        cur.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", [milliseconds])
    if not connection.in_atomic_block:
        connection._cleanup_bounded_session = raw  # type: ignore[attr-defined]  # our marker on the connection


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
    if stop_requested():
        return result
    worker_session_bound()
    lease_until = lease_expiry_from(clock.now())
    lease = job_lease(job_id=job_id, owner=owner or worker_name())
    if lease is None:
        return result
    result.leased = True
    max_batches = max_batches or settings.CLEANUP_SLICE_BATCHES
    max_seconds = max_seconds if max_seconds is not None else slice_seconds()
    # None: each partition's own policy batch size (a fixed size is for tests and benchmarks).
    limit = min(batch_size, MAX_BATCH_SIZE) if batch_size else None
    job = job_load(job_id)
    started = time.monotonic()
    try:
        if job.job_kind == JobKind.PURGE:
            progress = PurgeProgress()
            try:
                purge_run(
                    job=job,
                    lease=lease,
                    progress=progress,
                    max_requests=max_batches,
                    max_seconds=max_seconds,
                    lease_until=lease_until,
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
                slice_left = max_seconds - (time.monotonic() - started)
                wait = wait_for_token(job.portfolio_id, lease_until=lease_until, slice_left=slice_left)
                if wait > 0:
                    # No token within what this slice and the lease can bear.
                    result.deferred_seconds = jobs_give_back_for_tokens(lease=lease, job_ids=[job_id], wait=wait)
                    break
                if before_batch:
                    before_batch(job_id)
                # The batch renews the lease from its own reading of the clock, later than this one.
                renewed_from = clock.now()
                deleted, outcome = run_batch(job=job, lease=lease, limit=limit)
                lease_until = lease_expiry_from(renewed_from)
                result.batches += 1
                result.rows_deleted += deleted
                if after_batch:
                    after_batch(job_id)
                if outcome:
                    result.outcome = outcome
                    break
                if result.batches >= max_batches or time.monotonic() - started >= max_seconds or stop_requested():
                    job_release(lease=lease)
                    break
    except Exception as exc:
        classification = classify(exc, now=clock.now())
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
    return result


# The smallest shared transaction after one that could not take every
# partition it covered.
MIN_WINDOW = 2


@dataclass
class GroupSliceResult:
    leased: int = 0  # jobs the lease took
    transactions: int = 0
    rows_deleted: int = 0
    finished: int = 0
    deferred_seconds: float = 0.0
    fell_back: bool = False  # a transaction failed: its jobs ran alone
    out_of_time: bool = False  # the next tokens come after the slice's end: its jobs went back due now
    slept_seconds: float = 0.0  # asleep for rate tokens (not counted in the slice's seconds)


@dataclass
class _Turns:
    """Whose turn it is among a group slice's leased partitions (processor sharing)."""

    pending: list[int]  # leased and not finished, in turn order
    # How many partitions the next shared transaction covers: all of them at
    # first (small nightly partitions all fit one batch), then twice as many
    # as the last one took, so a backlog (a partition or two fill a batch)
    # does not fence, lock and replay-check every leased partition for each.
    window: int
    large: set[int] = field(default_factory=set)  # filled their last batch
    worked: set[int] = field(default_factory=set)  # applied a batch in this slice

    def next_working(self) -> list[int]:
        """The partitions the next transaction may cover. A partition that
        filled its last batch takes the next one alone: fencing, locking and
        replay-checking the whole group for it again would cost more than its batch."""
        if self.pending[0] in self.large:
            return self.pending[:1]
        return [job_id for job_id in self.pending if job_id not in self.large][: self.window]

    def drop(self, gone: set[int]) -> None:
        self.pending = [job_id for job_id in self.pending if job_id not in gone]

    def after(self, working: list[int], steps: dict[int, PartitionStep], applied: set[int]) -> None:
        """Processor sharing: the partitions this transaction worked go to the
        back, so every leased partition gets a batch before any gets a second,
        and a large one never keeps the small ones waiting for its slice; those
        it did not reach keep their place at the front. Finished and lost ones leave."""
        self.large = {job_id for job_id, step in steps.items() if step.full} | (self.large - set(steps))
        done = {job_id for job_id, step in steps.items() if step.outcome or step.lost}
        self.worked |= applied
        if len(working) > 1:
            self.window = len(working) * 2 if applied >= set(working) else max(MIN_WINDOW, 2 * len(applied))
        waiting = [job_id for job_id in self.pending if job_id not in done and job_id not in applied]
        self.pending = waiting + [job_id for job_id in self.pending if job_id in applied and job_id not in done]

    def release(self, lease: JobLease) -> None:
        """The slice's end: worked partitions are due again now, behind every
        waiting one; the ones this slice did not reach keep their place in the queue."""
        if not self.pending:
            return
        untouched = [job_id for job_id in self.pending if job_id not in self.worked]
        if untouched:
            jobs_release(lease=lease, job_ids=untouched, keep_place=True)
        if len(untouched) < len(self.pending):
            jobs_release(lease=lease, job_ids=[job_id for job_id in self.pending if job_id in self.worked])


def group_run_slice(
    *,
    owner: str | None = None,
    max_jobs: int | None = None,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    max_wall_seconds: float | None = None,
    batch_size: int | None = None,
) -> GroupSliceResult:
    """Lease several due delete jobs at once and run them in shared transactions.

    Each transaction covers as many of the leased partitions as fit in one
    batch of candidate rows (``run_group_batch``); partitions that finish
    drop out, a large one runs alone. The slice is bounded by
    ``CLEANUP_SLICE_SECONDS`` of work (time asleep for rate tokens not
    counted, within ``max_wall_seconds``, by default ``TOKEN_SLEEP_STRETCH``
    times the seconds, in all: ``SliceBudget``) and ``max_batches``
    transactions (by default ``CLEANUP_SLICE_BATCHES`` per partition leased);
    what is left is released with its cursors. With rate limits configured a
    transaction takes one token per portfolio it touches and one global token
    (tokens drawn for portfolios it then leaves untouched go back); a
    portfolio without a token is left out of it and deferred until its own
    token is due, not waited for.

    If a transaction fails, which partition caused it is unknown: the slice
    releases the jobs and runs each alone (``job_run_slice``), whose failure
    handling classifies and records it for exactly that job, within what is
    left of the slice's seconds (``_run_alone``).
    """
    owner = owner or worker_name()
    result = GroupSliceResult()
    if stop_requested():
        return result
    worker_session_bound()
    leased_from = clock.now()
    group = jobs_lease_group(owner=owner, limit=max_jobs or settings.CLEANUP_LEASE_JOBS)
    if group is None:
        return result
    lease, turns = group.lease, _Turns(list(group.job_ids), window=len(group.job_ids))
    # The earliest each job's lease may expire: from the lease, then from each
    # transaction that advanced it (a job a transaction did not reach keeps
    # the older expiry). A token sleep must end well before the earliest.
    lease_until = dict.fromkeys(turns.pending, lease_expiry_from(leased_from))
    result.leased = len(turns.pending)
    # By default (the in-process drain) up to a slice's batches for each
    # partition leased, within the seconds: with processor sharing every
    # partition gets its turn inside the lease, and the drain leases and
    # releases less often. A worker's turn passes its own budget.
    # The drain's slice also ends once fewer than half of the partitions it
    # leased are left: holding on to a few large ones while other partitions
    # wait unleased would undo the processor sharing.
    refill_below = 0 if max_batches else (len(turns.pending) + 1) // 2
    max_batches = max_batches or settings.CLEANUP_SLICE_BATCHES * len(turns.pending)
    max_seconds = max_seconds if max_seconds is not None else slice_seconds()
    # None: each partition's own policy batch size (a fixed size is for tests and benchmarks).
    limit = min(batch_size, MAX_BATCH_SIZE) if batch_size else None
    jobs = group.jobs
    budget = SliceBudget.of(max_seconds, max_wall_seconds)
    started = budget.started
    while turns.pending:
        working = turns.next_working()
        # Tokens only for the portfolios this transaction may touch (a large
        # partition alone spends its own portfolio's token, nobody else's),
        # reserved in one statement for the instant they are there. A wait
        # within what the slice and the leases can bear is slept, lease kept:
        # giving the partitions back and leasing them again would cost more
        # statements than the batch the limit is there to slow down.
        now = clock.now()
        bound = token_wait_bound(
            lease_until=min(lease_until[job_id] for job_id in working),
            slice_left=budget.left(),
            now=now,
        )
        grant = group_tokens({jobs[job_id].portfolio_id for job_id in working}, max_wait=bound, now=now)
        if not grant.reserved and token_wait_next_slice(grant.wait):
            # Only this slice's end comes before the tokens: end it here, its
            # partitions go back due now (below) and the next slice sleeps.
            result.out_of_time = True
            break
        allowed = set(grant.allowed)
        working = _defer_without_tokens(working, grant, jobs=jobs, lease=lease, turns=turns, result=result)
        if not working:
            continue
        if grant.wait > 0 and not token_sleep(grant.wait):
            # Stopped while asleep: these tokens will not be used.
            group_tokens_unused(allowed, touched_none=True)
            break
        budget.slept += grant.wait
        renewed_from = clock.now()
        try:
            steps = run_group_batch(jobs=[jobs[job_id] for job_id in working], lease=lease, limit=limit)
        except LeaseLost:
            logger.warning("cleanup group of %s jobs: lease lost, stopping without committing", len(turns.pending))
            if allowed:
                group_tokens_unused(allowed, touched_none=True)
            turns.pending = []
            break
        except Exception as exc:
            if allowed:
                # Rolled back: it spent nothing, so its tokens (global too) go back.
                group_tokens_unused(allowed, touched_none=True)
            logger.warning(
                "cleanup group of %s jobs: %s; running them one by one",
                len(turns.pending),
                type(exc).__name__,
                extra={"category": classify(exc, now=clock.now()).category},
            )
            jobs_release(lease=lease, job_ids=turns.pending)
            result.fell_back = True
            _run_alone(
                turns.pending, owner=owner, batch_size=batch_size, result=result, started=started, budget=max_seconds
            )
            turns.pending = []
            break
        result.transactions += 1
        applied = {job_id for job_id, step in steps.items() if step.applied}
        lease_until.update(dict.fromkeys(applied, lease_expiry_from(renewed_from)))
        touched = {jobs[job_id].portfolio_id for job_id in applied}
        if allowed - touched:
            group_tokens_unused(allowed - touched, touched_none=not touched)
        for step in steps.values():
            result.rows_deleted += step.deleted
            result.finished += int(bool(step.outcome))
        turns.after(working, steps, applied)
        if result.transactions >= max_batches or budget.left() <= 0 or stop_requested():
            break
        if len(turns.pending) < refill_below:
            break
    turns.release(lease)
    result.slept_seconds = budget.slept
    return result


def _defer_without_tokens(
    working: list[int],
    grant: Reservation,
    *,
    jobs: dict[int, JobRef],
    lease: JobLease,
    turns: _Turns,
    result: GroupSliceResult,
) -> list[int]:
    """The partitions of ``working`` whose portfolio has its token. The
    others are kept for a later transaction of this slice (or the next slice)
    when the next slice could sleep through their wait, else released until
    exactly when their tokens will be there."""
    left_out = [job_id for job_id in working if jobs[job_id].portfolio_id not in grant.allowed]
    deferred = [job_id for job_id in left_out if not token_wait_next_slice(grant.wait_of(jobs[job_id].portfolio_id))]
    if deferred:
        by_wait: dict[float, list[int]] = {}
        for job_id in deferred:
            by_wait.setdefault(grant.wait_of(jobs[job_id].portfolio_id), []).append(job_id)
        for wait, ids in sorted(by_wait.items()):
            jobs_give_back_for_tokens(lease=lease, job_ids=ids, wait=wait)
        result.deferred_seconds = max(result.deferred_seconds, *by_wait)
        turns.drop(set(deferred))
    return [job_id for job_id in working if jobs[job_id].portfolio_id in grant.allowed]


def _run_alone(
    job_ids: list[int], *, owner: str, batch_size: int | None, result: GroupSliceResult, started: float, budget: float
) -> None:
    """The fallback after a failed shared transaction: each job alone, where a
    failure is classified for that job only — within the slice's deadline.
    The first always runs (so a failing partition is found and recorded
    however short the budget); the rest were released, due now, and wait for
    the next turn once the budget is spent."""
    for index, job_id in enumerate(job_ids):
        left = budget - (time.monotonic() - started)
        if index and (left <= 0 or stop_requested()):
            break
        alone = job_run_slice(job_id=job_id, owner=owner, batch_size=batch_size, max_seconds=max(0.0, left))
        result.rows_deleted += alone.rows_deleted
        result.finished += int(bool(alone.outcome))


@dataclass
class TurnResult:
    slices: int = 0
    rows_deleted: int = 0
    jobs_leased: int = 0  # for the cluster's heartbeat (cleanup_ops.health)


def worker_turn(*, job_id: int, owner: str | None = None) -> TurnResult:
    """One broker task's work: a purge job's slice, or groups of due delete jobs.

    Handing every small partition through the broker would cost a fetch, a
    poll wait and a dispatcher call each; instead a turn leases due
    partitions in groups and works them in shared transactions. A turn is as
    bounded as one slice: ``CLEANUP_SLICE_BATCHES`` transactions or
    ``CLEANUP_SLICE_SECONDS`` of work (a ``SliceBudget``), so that the due work of a small sweep spreads
    over the workers and clusters that fetch its messages. (A turn bounded by
    seconds alone measured about 10% faster on a 1M backlog with one worker,
    but let one cluster's first turns take all of a small sweep.)
    """
    owner = owner or worker_name()
    budget = SliceBudget.of(slice_seconds())
    batches_left = settings.CLEANUP_SLICE_BATCHES
    turn = TurnResult()
    kind = CleanupJob.objects.filter(pk=job_id).values_list("job_kind", flat=True).first()
    if kind == JobKind.PURGE:
        # Purges are bound by the store's latency: one at a time, alone.
        purge = job_run_slice(job_id=job_id, owner=owner)
        turn.rows_deleted += purge.rows_deleted
        turn.jobs_leased += int(purge.leased)
        turn.slices += 1
        return turn
    # Delete jobs: the message is only a hint that work is due. Take due
    # partitions in groups (the delivered one among them when it is due)
    # until one slice's budget of transactions or seconds is spent, so a
    # stopping cluster waits for at most that much; a SIGTERM that reaches
    # this process ends the turn after the batch in flight.
    while batches_left > 0 and budget.left() > 0 and not stop_requested():
        group = group_run_slice(
            owner=owner,
            max_batches=batches_left,
            max_seconds=max(0.1, budget.left()),
            max_wall_seconds=max(0.1, budget.wall_left()),
        )
        budget.slept += group.slept_seconds
        if not group.leased:
            break
        turn.slices += 1
        turn.rows_deleted += group.rows_deleted
        turn.jobs_leased += group.leased
        batches_left -= max(1, group.transactions)
        if group.out_of_time or (group.deferred_seconds and not group.transactions):
            # The next tokens come after this turn's end (or much later): a
            # group leased now would only be given back.
            break
    # The message for ``job_id`` is consumed. If this turn did not lease that
    # job (another worker's group took it, or its portfolio was at its cap),
    # un-mark it, so the dispatcher may send it again at once rather than
    # after a lease's length.
    CleanupJob.objects.filter(pk=job_id, state=JobState.PENDING, enqueued_at__lte=clock.now()).update(enqueued_at=None)
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
    # A SIGTERM (when the caller installed stop_on_sigterm) ends the drain
    # after the batch in flight; the slices below would lease nothing more.
    while not stop_requested():
        group = group_run_slice(owner=owner)
        if group.leased:
            result.slices += 1
            result.rows_deleted += group.rows_deleted
            if progress:
                progress(result.slices, result.slices + CleanupJob.objects.open().count())
            continue
        # No delete job is due: purge jobs (and anything the group lease
        # leaves to single slices) in the dispatcher's fair order.
        ids = fair_due_job_ids(now=clock.now(), limit=20, exclude_enqueued=False)
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
