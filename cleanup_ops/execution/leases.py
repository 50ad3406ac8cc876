"""Leases: who may work on a job right now, and the fence that enforces it.

Protocol:

- **Lease.** A conditional UPDATE claims the job only if it is due (pending
  and ``available_at <= now``, or leased with an expired lease) and sets a
  fresh ``lease_token``. No row matched → this delivery was a duplicate or
  early: the caller returns quietly. The portfolio's lease cap
  (``CLEANUP_PORTFOLIO_MAX_LEASES``) and any active pause are checked in the
  same transaction, under an advisory lock on the portfolio's *stripe*
  (``lease_stripe``: its id — a stable hash of a non-integer key — modulo
  ``CLEANUP_LEASE_LOCK_STRIPES``), so two
  workers cannot both see "one slot left" and both take it. Stripes bound the locks one lease
  transaction takes — at most ``CLEANUP_LEASE_LOCK_STRIPES``, however many
  portfolios a group pick spans — so thousands of due portfolios cannot
  exhaust PostgreSQL's lock table; two portfolios sharing a stripe only
  serialise their (short) lease transactions.
- **Fencing.** Every write to a job made under a lease first locks the job
  row *where the lease token is ours and not expired* — the batch's first
  statement for a whole group (``execution.statements.group_fence_scopes_and_policies``), and
  ``lock_job`` for the purge's cursor and the finishing writes: a worker
  whose lease expired gets no row and commits nothing for that job (a purge's
  decision about a document is fenced by the document's own lock and the
  store's deadline instead, ``downstream.purge``).
- **Release.** The job goes back to pending with its cursor kept, due now or
  at a later instant (a rate-limit deferral), only if the lease is still ours.
- **Tokens.** A worker reserves its rate-limit tokens for the instant they
  are there (``ratelimit.tokens_reserve``: one statement) and sleeps until
  then with its lease kept (``token_sleep``), if that wait fits what is left
  of its slice, ``CLEANUP_TOKEN_WAIT_SECONDS`` and what its lease can bear
  (``token_wait_bound``: the sleep ends a quarter of ``CLEANUP_LEASE_SECONDS``
  before the lease would expire, so the batch after it still fences and
  renews). A longer wait reserves nothing: when only the slice's end is
  nearer than the tokens (``token_wait_next_slice``) the job goes back due
  now and the next slice sleeps; otherwise it is deferred until exactly when
  its tokens will be there (no attempt counted). The sleep checks the
  stop flag (``stop_requested``, set by SIGTERM: ``runner.stop_on_sigterm``)
  every ``SLEEP_STEP_SECONDS``; a stopped sleeper gives its reserved tokens
  back and its job back.

Time is the database's (``cleanup_ops.clock``): a lease's expiry, the
holders counted against the cap and due-ness are compared with timestamps
the database stores, and a worker whose clock runs ahead would otherwise see
another's live lease as expired. Tests still move it with time-machine.

Lock, then read: the cap and the pauses are read after the stripe locks, by
statements that start once those locks are held; placing a pause takes the
same stripe locks (``pause_locks``), so a pause either committed before a
lease read it or waits for that lease transaction to end.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from psycopg import sql as pg

from cleanup_ops import clock, sql
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.dispatch import hint_due_at
from cleanup_ops.lifecycle import JobEvent, leased_fields, next_state, released_fields
from cleanup_ops.models import CleanupJob, JobState
from cleanup_ops.ratelimit import (
    DELETES,
    Member,
    Reservation,
    TokenFamily,
    portfolio_max_leases,
    tokens_give_back,
    tokens_reserve,
)
from cleanup_ops.recovery.classification import LeaseLost
from retention.domain import key_number
from retention.eligibility import db_datetime


@dataclass
class JobLease:
    """A worker's lease on a job (the job id, its token and owner) — not the ``lease`` record kind."""

    job_id: int
    token: uuid.UUID
    owner: str


@dataclass
class JobRef:
    """What a slice needs of its job, read once per lease (no model instance)."""

    id: int
    portfolio_id: int
    property_id: int | None  # None: a kind without a property (the partition is the portfolio)
    record_kind: str
    cutoff: datetime
    policy_version_id: int
    slot: datetime
    sweep_id: int
    job_kind: str
    purge_request_id: int | None


# ``JobRef``'s fields, in its order, as the job's queryset names them.
JOB_FIELDS = (
    "id",
    "portfolio_id",
    "property_id",
    "record_kind",
    "cutoff",
    "policy_version_id",
    "sweep__slot",
    "sweep_id",
    "job_kind",
    "purge_request_id",
)


# --- This module's statements ---------------------------------------------------

# pg_advisory_xact_lock(namespace, stripe) around a lease's cap check.
LEASE_LOCK_NAMESPACE = 7401


def _cap_lock() -> pg.SQL:
    """Serialises the cap check and the claim of one portfolio's stripe."""
    return pg.SQL("SELECT pg_advisory_xact_lock(%s, %s)")


@sql.statement
def _caps_lock(stripes: int) -> pg.Composed:
    """The cap locks of several stripes, taken in stripe order
    (parameters: the namespace, then the stripe numbers)."""
    return sql.composed(
        "SELECT pg_advisory_xact_lock(CAST(%s AS integer), v.p) FROM (VALUES {rows}) AS v(p) ORDER BY v.p",
        rows=sql.values_list(stripes, ["integer"]),
    )


@sql.statement
def _job_lock_fenced() -> pg.Composed:
    """The job's cursor, row-locked, only while our lease token is valid: a
    worker whose lease expired gets no row and commits nothing."""
    return sql.composed(
        """
        SELECT cursor FROM {job}
        WHERE id = %s AND state = %s AND lease_token = %s AND lease_expires_at > %s
        FOR UPDATE
        """
    )


@sql.statement
def _job_finish() -> pg.Composed:
    return sql.composed(
        "UPDATE {job} SET state = %s, outcome = %s, finished_at = %s, {cleared} WHERE id = %s",
        cleared=sql.lease_cleared(),
    )


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def lease_stripe(portfolio_id: Any) -> int:
    """The advisory lock a portfolio's cap check takes (see the module docstring):
    an integer key modulo the stripes, any other key (a UUID, a string) by a
    stable 63-bit hash of its text first (``retention.domain.key_number``)."""
    return key_number(portfolio_id) % settings.CLEANUP_LEASE_LOCK_STRIPES


def pause_locks(portfolio_id: int | None) -> None:
    """The stripe locks a pause takes before it is written: its
    portfolio's stripe, or every stripe for a pause of the whole pipeline —
    the locks a lease holds while it reads the pauses. Waited for at most
    ``CLEANUP_SCOPE_LOCK_WAIT_SECONDS`` (a lease transaction takes
    milliseconds; a stalled one is ended by the idle-in-transaction bound)."""
    stripes = (
        [lease_stripe(portfolio_id)] if portfolio_id is not None else list(range(settings.CLEANUP_LEASE_LOCK_STRIPES))
    )
    timeout = str(max(1, round(settings.CLEANUP_SCOPE_LOCK_WAIT_SECONDS * 1000)))
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)", [timeout])
        (previous, _) = cur.fetchone()
        try:
            sql.execute(_caps_lock(len(stripes)), [LEASE_LOCK_NAMESPACE, *stripes], cur=cur)
        finally:
            cur.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def token_param(token: uuid.UUID) -> object:
    return CleanupJob._meta.get_field("lease_token").get_db_prep_value(token, connection)


def job_lease(*, job_id: int, owner: str, now: datetime | None = None) -> JobLease | None:
    """Claim the job if it is due, not validly leased, not paused and its
    portfolio is under its lease cap; None when not."""
    now = now or clock.now()
    token = uuid.uuid4()
    with transaction.atomic():
        # The job row first, then the portfolio's cap lock: the same order as
        # a group lease (rows, then cap locks in portfolio order), so the two
        # never wait on each other in a cycle.
        portfolio_id = (
            CleanupJob.objects.select_for_update().filter(pk=job_id).values_list("portfolio_id", flat=True).first()
        )
        if portfolio_id is None:
            return None
        sql.execute(_cap_lock(), [LEASE_LOCK_NAMESPACE, lease_stripe(portfolio_id)])
        checkpoint("lease.after_cap_lock")
        paused, holders = CleanupJob.objects.exclude(pk=job_id).filter(portfolio_id=portfolio_id).lease_slots(now=now)
        if paused & {None, portfolio_id}:
            return None
        if holders.get(portfolio_id, 0) >= portfolio_max_leases():
            # Let the dispatcher send it again once a slot frees up.
            CleanupJob.objects.filter(pk=job_id).update(enqueued_at=None)
            return None
        claimed = (
            CleanupJob.objects.filter(pk=job_id).due(now=now).update(**leased_fields(token=token, owner=owner, now=now))
        )
    return JobLease(job_id=job_id, token=token, owner=owner) if claimed == 1 else None


# A group lease takes at least this many of a portfolio's due jobs (when it
# has them), however many lease slots the portfolio has left.
GROUP_SHARE_MIN = 4


@dataclass
class GroupJobLease:
    """One lease (one token) over several jobs, worked in shared transactions."""

    lease: JobLease
    jobs: dict[int, JobRef]  # in the order the slice takes them

    @property
    def job_ids(self) -> list[int]:
        return list(self.jobs)


def jobs_lease_group(
    *, owner: str, limit: int, now: datetime | None = None, exclude_enqueued: bool = False
) -> GroupJobLease | None:
    """Lease up to ``limit`` due delete jobs under one token; None when none is due.

    The pick is one indexed query over the open-and-due index, oldest
    ``available_at`` first, ``FOR UPDATE SKIP LOCKED`` so concurrent workers
    take disjoint jobs; it reads what the slice needs of each job
    (``JobRef``), under the row lock, so the slice loads nothing after the
    lease. A released job is due again "now", so it goes behind every job
    that was waiting: over time each portfolio gets its turn. Jobs are then
    taken round-robin across the portfolios in the pick, leaving out paused
    portfolios and those at their lease cap (re-checked under the portfolios'
    stripe locks, taken in stripe order), and at most one job per (property,
    kind). With ``exclude_enqueued`` jobs a broker message waits for are left
    to the worker that message reaches (a worker's turn after its first group,
    ``runner.worker_turn``).
    """
    now = now or clock.now()
    token = uuid.uuid4()
    cap = portfolio_max_leases()
    with transaction.atomic():
        paused, holders = CleanupJob.objects.lease_slots(now=now)
        if None in paused:
            return None
        full = {portfolio for portfolio, n in holders.items() if n >= cap}
        due = CleanupJob.objects.select_for_update(skip_locked=True, of=("self",)).due(now=now).deletes()
        if exclude_enqueued:
            due = due.not_waiting_in_broker(now=now)
        rows = [
            JobRef(*row)
            for row in due.exclude(portfolio_id__in=paused | full)
            .order_by("available_at", "id")
            .values_list(*JOB_FIELDS)[: limit * 4]
        ]
        if not rows:
            return None
        portfolios = sorted({row.portfolio_id for row in rows})
        stripes = sorted({lease_stripe(p) for p in portfolios})
        sql.execute(_caps_lock(len(stripes)), [LEASE_LOCK_NAMESPACE, *stripes])
        checkpoint("lease_group.after_stripe_locks")
        # Re-read under the locks: another worker may have taken the last
        # slot, or an operator paused a portfolio since the pick.
        paused, holders = CleanupJob.objects.filter(portfolio_id__in=portfolios).lease_slots(now=now)
        if None in paused:
            return None
        rows = [row for row in rows if row.portfolio_id not in paused]
        queues: dict[int, list[JobRef]] = {}
        seen: set[tuple[int, int | None, str]] = set()
        for row in rows:
            # A partition: (property, kind), or (portfolio, kind) for a kind without a property.
            partition = (row.portfolio_id if row.property_id is None else 0, row.property_id, row.record_kind)
            if holders.get(row.portfolio_id, 0) >= cap or partition in seen:
                continue
            seen.add(partition)
            queues.setdefault(row.portfolio_id, []).append(row)
        # A portfolio's due jobs are split over the lease slots it has left:
        # one group taking all of them would leave the portfolio's other slots
        # nothing to work (in a backlog's tail, one big portfolio left, a
        # second worker would stand idle).
        # A few jobs stay together all the same (small ones share a transaction).
        for portfolio_id, queue in queues.items():
            share = -(-len(queue) // max(1, cap - holders.get(portfolio_id, 0)))
            del queue[max(share, GROUP_SHARE_MIN) :]
        chosen: list[JobRef] = []
        while queues and len(chosen) < limit:
            for portfolio_id in list(queues):
                chosen.append(queues[portfolio_id].pop(0))
                if not queues[portfolio_id]:
                    del queues[portfolio_id]
                if len(chosen) == limit:
                    break
        if not chosen:
            return None
        ids = [job.id for job in chosen]
        CleanupJob.objects.filter(pk__in=ids).update(**leased_fields(token=token, owner=owner, now=now))
    return GroupJobLease(lease=JobLease(job_id=ids[0], token=token, owner=owner), jobs={job.id: job for job in chosen})


def jobs_release(
    *, lease: JobLease, job_ids: list[int], available_at: datetime | None = None, keep_place: bool = False
) -> int:
    """Give back those of ``job_ids`` still held by ``lease`` (pending, cursors kept).

    Released jobs are due again now, behind every job already waiting (the
    lease pick takes the oldest ``available_at`` first), unless
    ``keep_place``: jobs a slice leased but never reached keep their
    ``available_at`` and so their place at the front. A release for later (a
    rate-limit deferral) also tells the broker when the jobs become due, so
    an idle cluster takes them up then.
    """
    held = CleanupJob.objects.filter(pk__in=job_ids, state=JobState.LEASED, lease_token=lease.token)
    back = released_fields(available_at=None if keep_place else available_at or clock.now())
    if available_at is None:
        return held.update(**back)
    with transaction.atomic():
        # Only the jobs this lease still holds get the hint (a lost one is
        # another worker's now).
        ids = list(held.select_for_update().values_list("id", flat=True))
        released = CleanupJob.objects.filter(pk__in=ids).update(**back)
        hint_due_at(job_ids=ids, at=available_at)
    return released


def job_release(*, lease: JobLease, available_at: datetime | None = None) -> bool:
    """Give the job back (pending, cursor kept). False if the lease was lost."""
    return jobs_release(lease=lease, job_ids=[lease.job_id], available_at=available_at) == 1


def lock_job(cur: Any, *, job_id: int, lease: JobLease, now: datetime) -> int:
    """Fence: lock the job row while our lease is valid; its cursor, or ``LeaseLost``."""
    row = sql.execute(
        _job_lock_fenced(), [job_id, JobState.LEASED, token_param(lease.token), db_datetime(now)], cur=cur
    ).fetchone()
    if row is None:
        raise LeaseLost(job_id)
    return int(row[0])


def job_finish(cur: Any, *, job_id: int, outcome: str, now: datetime) -> None:
    """Done with an outcome, lease cleared; the caller holds the fenced row lock."""
    done = next_state(JobEvent.FINISH, JobState.LEASED)
    sql.execute(_job_finish(), [done, outcome, db_datetime(now), job_id], cur=cur)


def lease_renewal(now: datetime) -> object:
    """The new lease expiry a batch writes as it advances."""
    return db_datetime(now + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS))


# Set by SIGTERM in a worker process (``runner.stop_on_sigterm``): take no new
# lease, finish the batch in flight, give the rest back — and wake from a
# token sleep.
stop_event = threading.Event()

# How often a token sleep looks at the stop flag. Not an Event.wait woken by
# the signal handler: the handler runs in this (main) thread, and setting the
# event there while this thread holds the event's lock would deadlock.
SLEEP_STEP_SECONDS = 0.1


def stop_requested() -> bool:
    return stop_event.is_set()


def token_sleep(seconds: float) -> bool:
    """Sleep ``seconds`` (host time: the wait was computed on the database's
    clock) unless a stop is requested first; True when slept to the end."""
    end = time.monotonic() + max(0.0, seconds)
    while not stop_requested():
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(SLEEP_STEP_SECONDS, left))
    return False


# A slice's or a turn's seconds count its work, not its sleeps for rate
# tokens, up to this many times its seconds in all. Under a limit that binds,
# a turn bounded by wall seconds alone holds few batches (at 5/s shared by two
# workers, 12 of its 20 in 5 s), and each turn costs a lease, a release, a
# broker task and its health check: paid per batch, they were most of the
# statements a limit added. The liveness floor (cleanup_ops.E113) counts it.
TOKEN_SLEEP_STRETCH = 2


@dataclass
class SliceBudget:
    """Seconds of work (sleeps for tokens not counted) within ``wall`` seconds in all."""

    seconds: float
    wall: float
    started: float = field(default_factory=lambda: time.monotonic())
    slept: float = 0.0

    @classmethod
    def of(cls, seconds: float, wall: float | None = None) -> SliceBudget:
        return cls(seconds=seconds, wall=seconds * TOKEN_SLEEP_STRETCH if wall is None else wall)

    def left(self) -> float:
        total = time.monotonic() - self.started
        return min(self.seconds - (total - self.slept), self.wall - total)

    def wall_left(self) -> float:
        return self.wall - (time.monotonic() - self.started)


def lease_expiry_from(start: datetime) -> datetime:
    """The earliest a lease taken or renewed at ``start`` or later expires (the
    caller reads ``start`` before the statement that leases or renews)."""
    return start + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS)


def token_wait_bound(*, lease_until: datetime, slice_left: float, now: datetime | None = None) -> float:
    """The longest a worker may sleep for tokens with its lease kept: within
    ``CLEANUP_TOKEN_WAIT_SECONDS``, what is left of its slice, and its lease's
    expiry less a quarter of ``CLEANUP_LEASE_SECONDS`` (the batch after the
    sleep must still fence and renew)."""
    now = now or clock.now()
    lease_left = (lease_until - now).total_seconds() - settings.CLEANUP_LEASE_SECONDS / 4
    return max(0.0, min(float(settings.CLEANUP_TOKEN_WAIT_SECONDS), slice_left, lease_left))


def token_wait_next_slice(wait: float) -> bool:
    """Whether the next slice would sleep through ``wait`` with a fresh lease:
    within a whole slice (``CLEANUP_SLICE_SECONDS``), ``CLEANUP_TOKEN_WAIT_SECONDS``
    and three quarters of ``CLEANUP_LEASE_SECONDS``. A slice that meets such a
    wait only because its own end is nearer gives its jobs back due now instead
    of deferring them: a deferral sends a broker message per job and leases each
    again for it, and the next slice reserves and sleeps anyway."""
    fresh = min(
        float(settings.CLEANUP_TOKEN_WAIT_SECONDS),
        float(settings.CLEANUP_SLICE_SECONDS),
        settings.CLEANUP_LEASE_SECONDS * 3 / 4,
    )
    return wait <= fresh


def jobs_give_back_for_tokens(*, lease: JobLease, job_ids: list[int], wait: float) -> float:
    """The token protocol's one give-back, for jobs whose tokens are ``wait``
    seconds away and which this slice will not sleep for: due now when the next
    slice could sleep through the wait (``token_wait_next_slice``: a deferral
    would cost a broker message and a lease per job, and the next slice
    reserves and sleeps anyway), else released until their tokens are there
    (not an attempt). Every path that takes tokens calls it — a single job, a
    group's left-out partitions, a purge. (A group none of whose tokens come
    within this slice but all within the next ends the slice instead: its
    partitions go back due now by the slice's own release, ``_Turns.release``,
    which keeps the untouched ones' places.) Returns the deferral (0: due now)."""
    if token_wait_next_slice(wait):
        jobs_release(lease=lease, job_ids=job_ids)
        return 0.0
    jobs_release(lease=lease, job_ids=job_ids, available_at=clock.now() + timedelta(seconds=wait))
    return wait


def group_tokens_unused(portfolio_ids: set[int], *, touched_none: bool = False, family: TokenFamily = DELETES) -> None:
    """Give back the tokens of portfolios a transaction was allowed but did not
    touch; with ``touched_none`` (it applied nothing, raised, or never ran)
    the shared (global) one as well."""
    tokens_give_back(portfolio_ids=portfolio_ids, include_global=touched_none, family=family)


def group_tokens(
    portfolio_ids: set[int], *, max_wait: float = 0.0, now: datetime | None = None, family: TokenFamily = DELETES
) -> Reservation:
    """Tokens for one step of a slice over the portfolios it may touch (a
    single job's slice is a group of one), reserved in one statement: one
    from each portfolio's bucket of ``family`` whose token is there by the
    instant ``at`` (``allowed``), and one from each shared bucket, ``at``
    being the earliest instant the shared tokens and some portfolio's are all
    there. Reserved only when ``at`` is within ``max_wait``; the caller
    sleeps until ``at`` (``token_sleep``). ``ready`` says when each portfolio
    left out could go. Unlimited rates cost no statement. Tokens of allowed
    portfolios the step then leaves untouched go back (``group_tokens_unused``)."""
    members: list[Member] = [(p, bucket) for p in sorted(portfolio_ids) for bucket in family.own(p)]
    members += [(None, bucket) for bucket in family.shared()]
    if not members:
        # No statement, and no clock reading either.
        return Reservation(
            now=0.0, at=0.0, reserved=True, allowed=frozenset(portfolio_ids), ready=dict.fromkeys(portfolio_ids, 0.0)
        )
    at = (now or clock.now()).timestamp()
    return tokens_reserve(members=members, now=at, max_wait=max_wait, portfolio_ids=portfolio_ids)
