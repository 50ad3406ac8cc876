"""Running jobs: a slice under one lease, a worker's turn, the in-process drain.

A **slice** leases one job or a group of jobs, runs a bounded number of
steps — ``CLEANUP_SLICE_BATCHES`` or ``CLEANUP_SLICE_SECONDS``, whichever
comes first — then releases what is left with its cursors saved, so one big
property never holds a worker for long and other portfolios get a turn.
Every slice is one engine (``_SliceEngine``) over a work unit (``WorkUnit``:
a delete batch over one or many partitions, or a purge's store request); a
single job is a group of one. Rate-limit tokens are reserved per step for
the instant they are there and slept for, lease kept; a wait longer than the
slice, ``CLEANUP_TOKEN_WAIT_SECONDS`` or the lease can bear gives the job
back until then, without counting an attempt (``execution.leases``,
"Tokens"). A single job's exception is classified
(``recovery.classification``) and recorded under the lease
(``recovery.failures``); a group's failed transaction runs each job alone. A
slice never raises for a job's failure, so the django-q2 task always
returns normally.

A **worker's turn** is one broker task's work: group slices of due delete
jobs, oldest due first (the delivered job among them), one after the other
without a broker round trip until ``CLEANUP_SLICE_SECONDS`` of work are spent;
after its first group only jobs with no message waiting in the broker, so it
never takes work the dispatcher sent to another worker.
The **drain** (``cleanup_drain``) runs due jobs in this process until none is.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from django.db import connection

from cleanup_ops import clock
from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.downstream.purge import PurgeUnit, purge_unit
from cleanup_ops.execution.batches import PartitionStep, job_load, run_group_batch
from cleanup_ops.execution.leases import (
    JobLease,
    JobRef,
    SliceBudget,
    group_tokens,
    group_tokens_unused,
    job_lease,
    jobs_give_back_for_tokens,
    jobs_lease_group,
    jobs_release,
    lease_expiry_from,
    stop_event,
    stop_requested,
    token_sleep,
    token_wait_bound,
    token_wait_next_slice,
    worker_name,
)
from cleanup_ops.models import CleanupJob, JobKind, JobState
from cleanup_ops.ratelimit import DELETES, Reservation, TokenFamily, slice_seconds
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


class WorkUnit(Protocol):
    """A kind of work a slice runs under its lease, one step at a time: a
    delete batch over one or many partitions (``DeleteUnit``) or a purge's
    store request (``downstream.purge.PurgeUnit``). The engine
    (``_SliceEngine``) does the rest once for every kind: the tokens of
    ``family`` reserved per step, slept for with the lease kept, deferred or
    given back; the turns among the partitions; the slice's budget."""

    family: TokenFamily

    def held_back(self) -> float:
        """Seconds every job of this kind must wait whatever its tokens (0: none)."""
        ...

    def settle(self, jobs: list[JobRef], lease: JobLease) -> dict[int, PartitionStep]:
        """Jobs that finish without a step (so without a token)."""
        ...

    def step(self, jobs: list[JobRef], lease: JobLease) -> dict[int, PartitionStep]:
        """One step over ``jobs``; raises on failure (nothing of it applied)."""
        ...

    def after_step(self, jobs: list[JobRef]) -> None:
        """After a step committed and was counted (a hook that raises fails
        the slice with the step's work kept)."""
        ...


@dataclass
class DeleteUnit:
    """Delete jobs' unit: a step is one batch transaction over the partitions
    it is given (``run_group_batch``; one partition alone is a group of one).
    ``before_batch``/``after_batch`` are called with each job id around it:
    the place a downstream call (or a test's failing executor) sits."""

    limit: int | None = None
    before_batch: BatchHook | None = None
    after_batch: BatchHook | None = None
    family: TokenFamily = DELETES

    def held_back(self) -> float:
        return 0.0

    def settle(self, jobs: list[JobRef], lease: JobLease) -> dict[int, PartitionStep]:
        return {}

    def step(self, jobs: list[JobRef], lease: JobLease) -> dict[int, PartitionStep]:
        if self.before_batch:
            for job in jobs:
                self.before_batch(job.id)
        return run_group_batch(jobs=jobs, lease=lease, limit=self.limit)

    def after_step(self, jobs: list[JobRef]) -> None:
        if self.after_batch:
            for job in jobs:
                self.after_batch(job.id)


class StepFailed(Exception):
    """A step raised: its tokens went back and nothing of it was applied; the
    caller decides what the failure means for the slice's jobs."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause


@dataclass
class GroupSliceResult:
    leased: int = 0  # jobs the lease took
    transactions: int = 0  # steps (batch transactions, store requests)
    rows_deleted: int = 0  # rows deleted (a purge: documents purged)
    finished: int = 0
    deferred_seconds: float = 0.0
    fell_back: bool = False  # a transaction failed: its jobs ran alone
    out_of_time: bool = False  # the next tokens come after the slice's end: its jobs went back due now
    slept_seconds: float = 0.0  # asleep for rate tokens (not counted in the slice's seconds)
    outcomes: dict[int, str] = field(default_factory=dict)  # each finished job's outcome


# The smallest shared transaction after one that could not take every
# partition it covered.
MIN_WINDOW = 2


@dataclass
class _Turns:
    """Whose turn it is among a slice's leased partitions (processor sharing)."""

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


@dataclass
class _SliceEngine:
    """The one slice loop every kind of work runs: a single job is a group of
    one, a purge a kind of unit. Each step's tokens are reserved only for the
    portfolios it may touch, in one statement, for the instant they are there
    (``group_tokens``); a wait within what the slice and the leases can bear
    is slept, lease kept (giving the jobs back and leasing them again would
    cost more statements than the step the limit is there to slow down); a
    job whose portfolio has no token within the next slice is deferred until
    exactly then (``jobs_give_back_for_tokens``); tokens a step did not use go
    back (``group_tokens_unused``). ``run`` raises ``StepFailed`` with the
    jobs still pending when a step raised; otherwise it releases what is left
    with its cursors."""

    lease: JobLease
    jobs: dict[int, JobRef]
    unit: WorkUnit
    budget: SliceBudget
    max_steps: int
    refill_below: int
    leased_from: datetime
    result: GroupSliceResult = field(default_factory=GroupSliceResult)

    def __post_init__(self) -> None:
        self.turns = _Turns(list(self.jobs), window=len(self.jobs))
        # The earliest each job's lease may expire: from the lease, then from
        # each step that advanced it (a job a step did not reach keeps the
        # older expiry). A token sleep must end well before the earliest.
        self.lease_until = dict.fromkeys(self.turns.pending, lease_expiry_from(self.leased_from))
        self.result.leased = len(self.turns.pending)

    def run(self) -> GroupSliceResult:
        turns, jobs, lease, unit, result = self.turns, self.jobs, self.lease, self.unit, self.result
        budget = self.budget
        while turns.pending:
            working = turns.next_working()
            settled = unit.settle([jobs[job_id] for job_id in working], lease)
            if settled:
                self._count(settled)
                turns.after(working, settled, set(settled))
                continue
            held_back = unit.held_back()
            if held_back > 0:
                until = clock.now() + timedelta(seconds=held_back)
                jobs_release(lease=lease, job_ids=turns.pending, available_at=until)
                result.deferred_seconds = held_back
                turns.pending = []
                break
            now = clock.now()
            bound = token_wait_bound(
                lease_until=min(self.lease_until[job_id] for job_id in working), slice_left=budget.left(), now=now
            )
            grant = group_tokens(
                {jobs[job_id].portfolio_id for job_id in working}, max_wait=bound, now=now, family=unit.family
            )
            if not grant.reserved and token_wait_next_slice(grant.wait):
                # Only this slice's end comes before the tokens: end it here,
                # its jobs go back due now (below) and the next slice sleeps.
                result.out_of_time = True
                break
            allowed = set(grant.allowed)
            working = self._defer_without_tokens(working, grant)
            if not working:
                continue
            if grant.wait > 0 and not token_sleep(grant.wait):
                # Stopped while asleep: these tokens will not be used.
                group_tokens_unused(allowed, touched_none=True, family=unit.family)
                break
            budget.slept += grant.wait
            renewed_from = clock.now()
            try:
                steps = unit.step([jobs[job_id] for job_id in working], lease)
            except Exception as exc:
                if allowed:
                    # Nothing of it applied: its tokens (the shared ones too) go back.
                    group_tokens_unused(allowed, touched_none=True, family=unit.family)
                raise StepFailed(exc) from exc
            result.transactions += 1
            applied = {job_id for job_id, step in steps.items() if step.applied}
            self.lease_until.update(dict.fromkeys(applied, lease_expiry_from(renewed_from)))
            touched = {jobs[job_id].portfolio_id for job_id in applied}
            if allowed - touched:
                group_tokens_unused(allowed - touched, touched_none=not touched, family=unit.family)
            self._count(steps)
            turns.after(working, steps, applied)
            try:
                unit.after_step([jobs[job_id] for job_id in working])
            except Exception as exc:
                raise StepFailed(exc) from exc
            if result.transactions >= self.max_steps or budget.left() <= 0 or stop_requested():
                break
            if len(turns.pending) < self.refill_below:
                break
        turns.release(lease)
        result.slept_seconds = budget.slept
        return result

    def _count(self, steps: dict[int, PartitionStep]) -> None:
        for step in steps.values():
            self.result.rows_deleted += step.deleted
            if step.outcome:
                self.result.finished += 1
                self.result.outcomes[step.job_id] = step.outcome

    def _defer_without_tokens(self, working: list[int], grant: Reservation) -> list[int]:
        """The jobs of ``working`` whose portfolio has its token. The others
        are kept for a later step of this slice (or the next slice) when the
        next slice could sleep through their wait, else released until
        exactly when their tokens will be there."""
        jobs = self.jobs
        left_out = [job_id for job_id in working if jobs[job_id].portfolio_id not in grant.allowed]
        deferred = [j for j in left_out if not token_wait_next_slice(grant.wait_of(jobs[j].portfolio_id))]
        if deferred:
            by_wait: dict[float, list[int]] = {}
            for job_id in deferred:
                by_wait.setdefault(grant.wait_of(jobs[job_id].portfolio_id), []).append(job_id)
            for wait, ids in sorted(by_wait.items()):
                jobs_give_back_for_tokens(lease=self.lease, job_ids=ids, wait=wait)
            self.result.deferred_seconds = max(self.result.deferred_seconds, *by_wait)
            self.turns.drop(set(deferred))
        return [job_id for job_id in working if jobs[job_id].portfolio_id in grant.allowed]


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
    """Lease ``job_id`` and run a bounded slice of it: the engine's group of
    one (a delete job's batches, a purge's requests); never raises for job
    failures: any is classified and recorded under the lease.

    ``before_batch``/``after_batch`` are called with the job id around each
    batch (or each purge request that cleared a document: ``after``): the
    place a downstream call (or a test's failing executor) sits.
    """
    result = SliceResult(job_id=job_id)
    if stop_requested():
        return result
    worker_session_bound()
    leased_from = clock.now()
    lease = job_lease(job_id=job_id, owner=owner or worker_name())
    if lease is None:
        return result
    result.leased = True
    max_seconds = max_seconds if max_seconds is not None else slice_seconds()
    # None: each partition's own policy batch size (a fixed size is for tests and benchmarks).
    limit = min(batch_size, MAX_BATCH_SIZE) if batch_size else None
    job = job_load(job_id)
    purge: PurgeUnit | None = None
    try:
        with ExitStack() as units:
            unit: WorkUnit
            if job.job_kind == JobKind.PURGE:
                unit = purge = units.enter_context(
                    purge_unit(job=job, before_request=before_batch, after_request=after_batch)
                )
            else:
                unit = DeleteUnit(limit=limit, before_batch=before_batch, after_batch=after_batch)
            engine = _SliceEngine(
                lease=lease,
                jobs={job_id: job},
                unit=unit,
                budget=SliceBudget.of(max_seconds),
                max_steps=max_batches or settings.CLEANUP_SLICE_BATCHES,
                refill_below=0,
                leased_from=leased_from,
            )
            try:
                engine.run()
            finally:
                # Steps made before a failure count too.
                done = engine.result
                result.batches, result.rows_deleted = done.transactions, done.rows_deleted
                result.outcome = done.outcomes.get(job_id, "")
                result.deferred_seconds = done.deferred_seconds
    except Exception as exc:
        cause = exc.cause if isinstance(exc, StepFailed) else exc
        _record_failure(result, cause, lease=lease)
    if purge is not None:
        # A purge's figures are its documents, not rows.
        result.documents_purged = result.batches = purge.progress.requests
        result.rows_deleted = 0
        result.outcome = result.outcome or purge.progress.outcome
    if result.outcome:
        logger.info(
            "cleanup job %s finished: %s",
            job_id,
            result.outcome,
            extra={"job_id": job_id, "status": result.outcome, "record_kind": job.record_kind},
        )
    return result


def _record_failure(result: SliceResult, exc: Exception, *, lease: JobLease) -> None:
    """A single job's failure, classified and recorded under its lease."""
    job_id = lease.job_id
    classification = classify(exc, now=clock.now())
    result.error_category = classification.category
    if classification.category == FailureCategory.LEASE_LOST:
        result.lease_lost = True
        logger.warning(
            "cleanup job %s: lease lost, stopping without committing",
            job_id,
            extra={"job_id": job_id, "category": classification.category},
        )
        return
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


def group_run_slice(
    *,
    owner: str | None = None,
    max_jobs: int | None = None,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    max_wall_seconds: float | None = None,
    batch_size: int | None = None,
    exclude_enqueued: bool = False,
) -> GroupSliceResult:
    """Lease several due delete jobs at once and run them in shared transactions.

    Each transaction covers as many of the leased partitions as fit in one
    batch of candidate rows (``run_group_batch``); partitions that finish
    drop out, a large one runs alone. The slice is bounded by
    ``CLEANUP_SLICE_SECONDS`` of work (time asleep for rate tokens not
    counted, within ``max_wall_seconds``, by default ``TOKEN_SLEEP_STRETCH``
    times the seconds, in all: ``SliceBudget``) and ``max_batches``
    transactions (by default ``CLEANUP_SLICE_BATCHES`` per partition leased);
    what is left is released with its cursors. ``exclude_enqueued`` leaves jobs
    a broker message waits for to that message (``jobs_lease_group``). With rate limits configured a
    transaction takes one token per portfolio it touches and one global token
    (tokens drawn for portfolios it then leaves untouched go back); a
    portfolio without a token is left out of it and deferred until its own
    token is due, not waited for (``_SliceEngine``).

    If a transaction fails, which partition caused it is unknown: the slice
    releases the jobs and runs each alone (``job_run_slice``), whose failure
    handling classifies and records it for exactly that job, within what is
    left of the slice's seconds (``_run_alone``).
    """
    owner = owner or worker_name()
    if stop_requested():
        return GroupSliceResult()
    worker_session_bound()
    leased_from = clock.now()
    group = jobs_lease_group(
        owner=owner, limit=max_jobs or settings.CLEANUP_LEASE_JOBS, exclude_enqueued=exclude_enqueued
    )
    if group is None:
        return GroupSliceResult()
    leased = len(group.jobs)
    # By default (the in-process drain) up to a slice's batches for each
    # partition leased, within the seconds: with processor sharing every
    # partition gets its turn inside the lease, and the drain leases and
    # releases less often. A worker's turn passes its own budget.
    # The drain's slice also ends once fewer than half of the partitions it
    # leased are left: holding on to a few large ones while other partitions
    # wait unleased would undo the processor sharing.
    max_seconds = max_seconds if max_seconds is not None else slice_seconds()
    # None: each partition's own policy batch size (a fixed size is for tests and benchmarks).
    limit = min(batch_size, MAX_BATCH_SIZE) if batch_size else None
    engine = _SliceEngine(
        lease=group.lease,
        jobs=group.jobs,
        unit=DeleteUnit(limit=limit),
        budget=SliceBudget.of(max_seconds, max_wall_seconds),
        max_steps=max_batches or settings.CLEANUP_SLICE_BATCHES * leased,
        refill_below=0 if max_batches else (leased + 1) // 2,
        leased_from=leased_from,
    )
    try:
        return engine.run()
    except StepFailed as failed:
        result, pending = engine.result, engine.turns.pending
        if isinstance(failed.cause, LeaseLost):
            logger.warning("cleanup group of %s jobs: lease lost, stopping without committing", len(pending))
            return result
        logger.warning(
            "cleanup group of %s jobs: %s; running them one by one",
            len(pending),
            type(failed.cause).__name__,
            extra={"category": classify(failed.cause, now=clock.now()).category},
        )
        jobs_release(lease=group.lease, job_ids=pending)
        result.fell_back = True
        _run_alone(
            pending,
            owner=owner,
            batch_size=batch_size,
            result=result,
            started=engine.budget.started,
            budget=max_seconds,
        )
        result.slept_seconds = engine.budget.slept
        return result


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
    partitions in groups and works them in shared transactions, group after
    group without a broker round trip, until ``CLEANUP_SLICE_SECONDS`` of work
    are spent (a ``SliceBudget``: sleeps for rate tokens not counted, within
    twice the seconds in all). Each group is the slice a turn used to be:
    ``CLEANUP_SLICE_BATCHES`` transactions, then the partitions worked go back
    due now and the ones not reached keep their place, so the order of work
    is the one turns of 20 transactions gave, without the broker hand-off
    between them (issue 40: 58 hand-offs for 1,081 batches at 1M rows with one
    worker when a turn held one such slice).

    The first group takes the oldest due partitions; the later ones leave
    jobs a broker message waits for to the worker that message reaches
    (``exclude_enqueued``). So a turn that keeps going never takes the work
    the dispatcher just sent to another worker or cluster: a small sweep
    still spreads over every worker that fetches its messages.
    """
    owner = owner or worker_name()
    budget = SliceBudget.of(slice_seconds())
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
    # until the turn's seconds are spent, so a stopping cluster waits for at
    # most that much; a SIGTERM that reaches this process ends the turn after
    # the batch in flight.
    while budget.left() > 0 and not stop_requested():
        group = group_run_slice(
            owner=owner,
            max_batches=settings.CLEANUP_SLICE_BATCHES,
            max_seconds=max(0.1, budget.left()),
            max_wall_seconds=max(0.1, budget.wall_left()),
            exclude_enqueued=turn.slices > 0,
        )
        budget.slept += group.slept_seconds
        if not group.leased:
            break
        turn.slices += 1
        turn.rows_deleted += group.rows_deleted
        turn.jobs_leased += group.leased
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
