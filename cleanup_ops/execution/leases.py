"""Leases: who may work on a job right now, and the fence that enforces it.

Protocol:

- **Lease.** A conditional UPDATE claims the job only if it is due (pending
  and ``available_at <= now``, or leased with an expired lease) and sets a
  fresh ``lease_token``. No row matched → this delivery was a duplicate or
  early: the caller returns quietly. The portfolio's lease cap
  (``CLEANUP_PORTFOLIO_MAX_LEASES``) and any active pause are checked in the
  same transaction, under a per-portfolio advisory lock on PostgreSQL, so two
  workers cannot both see "one slot left" and both take it (SQLite serialises
  writers anyway).
- **Fencing.** Every write made under a lease first locks the job row *where
  the lease token is ours and not expired* (``lock_job``): a worker whose
  lease expired gets no row, raises ``LeaseLost`` and commits nothing.
- **Release.** The job goes back to pending with its cursor kept, due now or
  at a later instant (a rate-limit deferral), only if the lease is still ours.
- **Tokens.** ``wait_for_token`` takes a rate-limit token or says how long
  until one is there; a long wait defers the job rather than sleeping with
  the lease held.

Time comes from ``django.utils.timezone.now()`` (never the database clock) so
tests control it with time-machine.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from cleanup_ops import sql
from cleanup_ops.models import CleanupJob, JobState, PipelinePause
from cleanup_ops.ratelimit import BucketConfig, tokens_acquire
from cleanup_ops.recovery.classification import LeaseLost
from retention.eligibility import db_datetime


@dataclass
class Lease:
    job_id: int
    token: uuid.UUID
    owner: str


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def token_param(token: uuid.UUID) -> object:
    return CleanupJob._meta.get_field("lease_token").get_db_prep_value(token, connection)


def job_lease(*, job_id: int, owner: str, now: datetime | None = None) -> Lease | None:
    """Claim the job if it is due, not validly leased, not paused and its
    portfolio is under its lease cap; None when not."""
    now = now or timezone.now()
    portfolio_id = CleanupJob.objects.filter(pk=job_id).values_list("portfolio_id", flat=True).first()
    if portfolio_id is None:
        return None
    token = uuid.uuid4()
    with transaction.atomic():
        if sql.is_postgres():
            sql.execute(sql.lease_cap_lock(), [sql.LEASE_LOCK_NAMESPACE, portfolio_id % 2**31])
        if PipelinePause.objects.covering(portfolio_id=portfolio_id).exists():
            return None
        leased_now = (
            CleanupJob.objects.live_leases(now=now).filter(portfolio_id=portfolio_id).exclude(pk=job_id).count()
        )
        if leased_now >= settings.CLEANUP_PORTFOLIO_MAX_LEASES:
            # Let the dispatcher send it again once a slot frees up.
            CleanupJob.objects.filter(pk=job_id).update(enqueued_at=None)
            return None
        claimed = (
            CleanupJob.objects.filter(pk=job_id)
            .due(now=now)
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


def lock_job(cur: Any, *, job_id: int, lease: Lease, now: datetime) -> int:
    """Fence: lock the job row while our lease is valid; its cursor, or ``LeaseLost``."""
    row = sql.execute(
        sql.job_lock_fenced(), [job_id, JobState.LEASED, token_param(lease.token), db_datetime(now)], cur=cur
    ).fetchone()
    if row is None:
        raise LeaseLost(job_id)
    return int(row[0])


def job_finish(cur: Any, *, job_id: int, outcome: str, now: datetime) -> None:
    """Done with an outcome, lease cleared; the caller holds the fenced row lock."""
    sql.execute(sql.job_finish(), [JobState.DONE, outcome, db_datetime(now), job_id], cur=cur)


def lease_renewal(now: datetime) -> object:
    """The new lease expiry a batch writes as it advances."""
    return db_datetime(now + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS))


def wait_for_token(portfolio_id: int, buckets: list[BucketConfig] | None = None) -> float:
    """0 once a token is taken; else the deferral, after at most one short wait."""
    wait = tokens_acquire(portfolio_id=portfolio_id, now=timezone.now().timestamp(), buckets=buckets)
    if 0 < wait <= settings.CLEANUP_TOKEN_WAIT_SECONDS:
        time.sleep(wait)
        wait = tokens_acquire(portfolio_id=portfolio_id, now=timezone.now().timestamp(), buckets=buckets)
    return wait
