"""The dispatcher: hands django-q2 a small, fair window of due jobs.

The ORM broker fetches with no ORDER BY and has no index on its queue table,
so it must stay short; fairness is decided here. Each call:

1. counts messages already waiting in the broker and tops the window up to
   ``CLEANUP_DISPATCH_WINDOW`` (default: twice the worker count);
2. picks due jobs round-robin across portfolios (the first due job of every
   portfolio, then the second of every portfolio, …), counting jobs whose
   lease expired as due (that is how a dead worker's job is rescued);
3. marks them ``enqueued_at`` under ``SKIP LOCKED`` row locks so two
   dispatchers never enqueue the same job, and sends the messages after commit.

A job marked enqueued is not dispatched again for ``CLEANUP_LEASE_SECONDS``:
with a window of twice the workers and bounded slices, a message waits far
less than that, so a lost one (its cluster died after fetching it) is re-sent
soon, and a waiting one is not sent twice. A duplicate would be harmless
anyway: the lease is a conditional UPDATE.

Only messages still waiting to be fetched count against the window; messages
a cluster has fetched are bounded by its ``queue_limit``, and one fetched by a
cluster that died stays locked until ``Q_RETRY`` without blocking the window.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django_q.models import OrmQ
from django_q.tasks import async_task

from cleanup_ops.brokers import not_before
from cleanup_ops.models import CleanupJob, JobState, PipelinePause, not_waiting_in_broker_q

DISPATCH_SCAN = 500  # the least number of oldest due jobs the fair order is taken from


def dispatch_window() -> int:
    return settings.CLEANUP_DISPATCH_WINDOW or 2 * settings.Q_CLUSTER["workers"]


def fair_due_job_ids(*, now: datetime, limit: int, exclude_enqueued: bool = True) -> list[int]:
    """Up to ``limit`` due job ids, round-robin across portfolios.

    Paused portfolios (or everything, under a global pause) are skipped, and no
    portfolio gets more jobs than its free lease slots
    (``CLEANUP_PORTFOLIO_MAX_LEASES`` minus its live leases).
    """
    if limit <= 0:
        return []
    paused = set(PipelinePause.objects.active().values_list("portfolio_id", flat=True))
    if None in paused:
        return []
    cap = settings.CLEANUP_PORTFOLIO_MAX_LEASES
    busy = CleanupJob.objects.lease_holders_by_portfolio(now=now)
    if exclude_enqueued:
        # Messages already sent for a portfolio that no worker has leased yet
        # take its slots too, or a burst of sends would overshoot its cap.
        for portfolio_id, n in (
            CleanupJob.objects.filter(state=JobState.PENDING)
            .exclude(not_waiting_in_broker_q(now=now))
            .values_list("portfolio_id")
            .annotate(n=Count("id"))
            .order_by()
        ):
            busy[portfolio_id] = busy.get(portfolio_id, 0) + n
    full = {portfolio for portfolio, n in busy.items() if n >= cap}
    qs = CleanupJob.objects.due(now=now).exclude(portfolio_id__in=paused | full)
    if exclude_enqueued:
        qs = qs.not_waiting_in_broker(now=now)
    # One indexed range scan over the oldest due jobs (the open-and-due
    # index), ranked here: a job's turn is its place among its portfolio's
    # jobs in that prefix. Fair within the oldest ``prefix`` due jobs, which
    # is where the next leases come from anyway; a window function over every
    # due job cost tens of milliseconds per call at 10,000 open jobs.
    prefix = max(DISPATCH_SCAN, limit * cap * 4)
    rows = list(qs.order_by("available_at", "id").values_list("id", "portfolio_id", "available_at")[:prefix])
    seen: dict[int, int] = {}
    ranked = []
    for job_id, portfolio_id, available_at in rows:
        seen[portfolio_id] = seen.get(portfolio_id, 0) + 1
        if seen[portfolio_id] <= cap - busy.get(portfolio_id, 0):
            ranked.append((seen[portfolio_id], available_at, job_id))
    return [job_id for _, _, job_id in sorted(ranked)[:limit]]


def broker_backlog(*, now: datetime) -> int:
    """Messages waiting in the ORM broker that no cluster has fetched yet."""
    return OrmQ.objects.filter(lock__lte=now).count()


def dispatch_due_jobs(*, now: datetime | None = None) -> int:
    """Enqueue due jobs into the broker's free window; returns how many."""
    if settings.Q_CLUSTER.get("sync"):
        return 0  # sync mode runs tasks inline; dispatching from inside one would recurse
    now = now or timezone.now()
    free = dispatch_window() - broker_backlog(now=now)
    ids = fair_due_job_ids(now=now, limit=free)
    if not ids:
        return 0
    with transaction.atomic():
        claimed = list(
            CleanupJob.objects.select_for_update(skip_locked=True)
            .filter(pk__in=ids)
            # Re-checked under the row lock: another dispatcher may have sent it meanwhile.
            .due(now=now)
            .not_waiting_in_broker(now=now)
            .values_list("id", flat=True)
        )
        CleanupJob.objects.filter(pk__in=claimed).update(enqueued_at=now)
        chosen = set(claimed)
        in_fair_order = [job_id for job_id in ids if job_id in chosen]
        transaction.on_commit(lambda: _send(in_fair_order))
    return len(claimed)


def hint_due_at(*, job_ids: list[int], at: datetime) -> None:
    """After commit, tell the broker these jobs become due at ``at`` (retries,
    deferrals): an idle cluster then leases them within a poll of ``at``.
    Marked enqueued until then, so the dispatcher does not send them twice."""
    if settings.Q_CLUSTER.get("sync") or not job_ids:
        return
    CleanupJob.objects.filter(pk__in=job_ids).update(enqueued_at=at)
    transaction.on_commit(lambda: _send(list(job_ids), at=at))


def dispatch_after_commit() -> None:
    """Wake the dispatcher once the current transaction commits (new due work)."""
    transaction.on_commit(dispatch_due_jobs)


def _send(job_ids: list[int], *, at: datetime | None = None) -> None:
    # The broker keeps no order of its own, but with a short window the order
    # we send in is roughly the order workers see.
    with not_before(at or timezone.now()):
        for job_id in job_ids:
            async_task("cleanup_ops.tasks.run_job", job_id, task_name=f"cleanup-job-{job_id}", group="cleanup")
