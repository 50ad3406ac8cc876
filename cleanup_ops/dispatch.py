"""The dispatcher: hands django-q2 a small, fair window of due jobs.

A broker keeps no fair order (the ORM broker fetches with no ORDER BY and has
no index on its queue table; Redis, SQS and RabbitMQ are FIFO at best), so
each queue is kept short and fairness is decided here. There are two queues
(``queue_for``): delete jobs on the main cluster's, purge jobs on
``Q_PURGE_CLUSTER``'s, so a slow document store never occupies the workers
that delete. For each queue, each call:

1. asks the broker how many messages wait in it (django-q2's broker
   interface, ``queue_size``) and tops the window up to
   ``CLEANUP_DISPATCH_WINDOW`` (default: twice the worker count) for deletes,
   twice ``Q_PURGE_WORKERS`` for purges;
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
cluster that died (locked until ``Q_RETRY`` on ORM and SQS, gone on Redis and
RabbitMQ) does not block the window. A broker that cannot be reached costs
nothing but time: the jobs it was to carry are un-marked and the next call
tries again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Collection
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django_q.brokers import Broker, get_broker
from django_q.tasks import async_task

from cleanup_ops import clock
from cleanup_ops.brokers import not_before
from cleanup_ops.models import CleanupJob, JobKind, JobState, not_waiting_in_broker_q
from cleanup_ops.ratelimit import portfolio_max_leases

logger = logging.getLogger(__name__)

DISPATCH_SCAN = 500  # the least number of oldest due jobs the fair order is taken from


def queue_for(kind: str) -> str:
    """The django-q2 queue (cluster name) that carries messages for jobs of ``kind``."""
    return settings.Q_PURGE_CLUSTER if kind == JobKind.PURGE else settings.Q_CLUSTER["name"]


def queues() -> dict[str, list[str]]:
    """Each queue and the job kinds it carries (one queue when purges share the main one)."""
    routes: dict[str, list[str]] = {}
    for kind in (JobKind.DELETE, JobKind.PURGE):
        routes.setdefault(queue_for(kind), []).append(str(kind))
    return routes


def cluster_queue() -> str:
    """The queue this process's cluster serves (``Q_CLUSTER_NAME``, default the main queue)."""
    return os.environ.get("Q_CLUSTER_NAME") or settings.Q_CLUSTER["name"]


def cluster_job_kinds(cluster_name: str | None = None) -> list[str]:
    """The job kinds the cluster named ``cluster_name`` (default: this process's,
    from ``Q_CLUSTER_NAME``) is sent; e.g. for a liveness check."""
    return queues().get(cluster_name or cluster_queue(), [])


def dispatch_window(queue: str | None = None) -> int:
    """Messages the dispatcher keeps waiting in ``queue`` (default: the main queue)."""
    if queue is not None and queue != settings.Q_CLUSTER["name"]:
        return 2 * settings.Q_PURGE_WORKERS
    return settings.CLEANUP_DISPATCH_WINDOW or 2 * settings.Q_CLUSTER["workers"]


def fair_due_job_ids(
    *, now: datetime, limit: int, exclude_enqueued: bool = True, kinds: Collection[str] | None = None
) -> list[int]:
    """Up to ``limit`` due job ids (of ``kinds``, default every kind), round-robin
    across portfolios.

    Paused portfolios (or everything, under a global pause) are skipped, and no
    portfolio gets more jobs than its free lease slots
    (``CLEANUP_PORTFOLIO_MAX_LEASES`` minus its live leases).
    """
    picked = _fair_pick(now=now, limit=limit, exclude_enqueued=exclude_enqueued, kinds=kinds)
    return [job_id for job_id, _ in picked]


def _fair_pick(
    *,
    now: datetime,
    limit: int,
    exclude_enqueued: bool = True,
    kinds: Collection[str] | None = None,
    slots: tuple[set[int | None], dict[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """``fair_due_job_ids`` as (job id, portfolio id) pairs; ``slots`` as read by
    ``_portfolio_slots`` (read here when not given)."""
    if limit <= 0:
        return []
    paused, busy = slots if slots is not None else _portfolio_slots(now=now, exclude_enqueued=exclude_enqueued)
    if None in paused:
        return []
    cap = portfolio_max_leases()
    full = {portfolio for portfolio, n in busy.items() if n >= cap}
    qs = CleanupJob.objects.due(now=now).exclude(portfolio_id__in=(paused - {None}) | full)
    if kinds is not None:
        qs = qs.filter(job_kind__in=list(kinds))
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
            ranked.append((seen[portfolio_id], available_at, job_id, portfolio_id))
    return [(job_id, portfolio_id) for _, _, job_id, portfolio_id in sorted(ranked)[:limit]]


def _portfolio_slots(*, now: datetime, exclude_enqueued: bool) -> tuple[set[int | None], dict[int, int]]:
    """(paused portfolio ids — None for a global pause —, lease slots taken per portfolio)."""
    paused, busy = CleanupJob.objects.lease_slots(now=now)
    if None in paused:
        return paused, {}
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
    return paused, busy


# --------------------------------------------------------------------------- brokers

_brokers = threading.local()


def broker(queue: str) -> Broker:
    """This process's (and thread's) django-q2 broker for ``queue``: connecting is
    not free (a TCP and AMQP handshake, an SQS queue lookup), so it is kept.
    A forked worker gets its own."""
    cache: dict[tuple[int, str], Broker] = getattr(_brokers, "by_queue", None) or {}
    _brokers.by_queue = cache
    key = (os.getpid(), queue)
    if key not in cache:
        cache[key] = get_broker(queue)
    return cache[key]


def _forget_broker(queue: str) -> None:
    getattr(_brokers, "by_queue", {}).pop((os.getpid(), queue), None)


def broker_backlog(*, now: datetime | None = None, queue: str | None = None) -> int:
    """Messages waiting in ``queue`` (default: the main queue) that no cluster has
    fetched yet, as the broker counts them (``queue_size``): on ORM the unclaimed
    rows whose instant has come, on Redis the list plus the due part of the
    sorted set, on SQS ``ApproximateNumberOfMessages``, on RabbitMQ the ready
    messages. Hints held back for later are not counted until they are due."""
    queue = queue or settings.Q_CLUSTER["name"]
    try:
        return int(broker(queue).queue_size() or 0)
    except Exception:
        _forget_broker(queue)
        return int(broker(queue).queue_size() or 0)


def broker_status() -> dict[str, Any]:
    """What ``cleanup_status``, the console and the bench show about the broker:
    its kind and, per queue, the job kinds it carries, the messages waiting and
    the window; ``error`` (the exception's class name) when it cannot be reached."""
    result: dict[str, Any] = {"broker": settings.Q_BROKER, "queues": {}}
    for queue, kinds in queues().items():
        entry: dict[str, Any] = {"kinds": kinds, "window": dispatch_window(queue)}
        try:
            entry["waiting"] = broker_backlog(queue=queue)
        except Exception as exc:
            entry["waiting"], entry["error"] = None, type(exc).__name__
        result["queues"][queue] = entry
    return result


def broker_max_delay_seconds() -> float | None:
    """How far ahead the configured broker can hold a message back (None: no limit)."""
    broker_class = get_broker_class()
    return getattr(broker_class, "max_delay_seconds", 0.0)


def get_broker_class() -> type:
    from django_q.conf import Conf

    if not Conf.BROKER_CLASS:
        return Broker
    module, name = Conf.BROKER_CLASS.rsplit(".", 1)
    return getattr(__import__(module, fromlist=[name]), name)


# --------------------------------------------------------------------------- dispatch


def dispatch_due_jobs(*, now: datetime | None = None) -> int:
    """Enqueue due jobs into each queue's free window; returns how many."""
    if settings.Q_CLUSTER.get("sync"):
        return 0  # sync mode runs tasks inline; dispatching from inside one would recurse
    now = now or clock.now()
    picked: dict[str, list[int]] = {}
    slots = None  # paused portfolios and taken lease slots, read once for every queue
    for queue, kinds in queues().items():
        try:
            free = dispatch_window(queue) - broker_backlog(now=now, queue=queue)
        except Exception as exc:
            logger.warning(
                "dispatch: the broker for queue %s cannot be reached (%s)",
                queue,
                type(exc).__name__,
                extra={"category": "broker_unavailable"},
            )
            continue
        if free <= 0:
            continue
        slots = slots or _portfolio_slots(now=now, exclude_enqueued=True)
        pairs = _fair_pick(now=now, limit=free, kinds=kinds, slots=slots)
        if pairs:
            picked[queue] = [job_id for job_id, _ in pairs]
            # The next queue's jobs must not overshoot a portfolio's cap either.
            for _, portfolio_id in pairs:
                slots[1][portfolio_id] = slots[1].get(portfolio_id, 0) + 1
    if not picked:
        return 0
    with transaction.atomic():
        claimed = set(
            CleanupJob.objects.select_for_update(skip_locked=True)
            .filter(pk__in=[job_id for ids in picked.values() for job_id in ids])
            # Re-checked under the row lock: another dispatcher may have sent it meanwhile.
            .due(now=now)
            .not_waiting_in_broker(now=now)
            .values_list("id", flat=True)
        )
        CleanupJob.objects.filter(pk__in=claimed).update(enqueued_at=now)
        for queue, ids in picked.items():
            in_fair_order = [job_id for job_id in ids if job_id in claimed]
            if in_fair_order:
                transaction.on_commit(partial(_send, queue, in_fair_order, stamp=now))
    return len(claimed)


def hint_due_at(*, job_ids: list[int], at: datetime) -> None:
    """After commit, tell the broker these jobs become due at ``at`` (retries,
    deferrals): an idle cluster then leases them within a poll of ``at``.
    Marked enqueued until then, so the dispatcher does not send them twice.

    A broker that cannot hold a message back that long (SQS: 900 s) gets no
    hint: the job stays unmarked and the dispatcher sends it once it is due
    (its once-a-minute schedule, or any finished task, whichever comes first)."""
    if settings.Q_CLUSTER.get("sync") or not job_ids:
        return
    limit = broker_max_delay_seconds()
    if limit is not None and (at - clock.now()) > timedelta(seconds=limit):
        return
    kinds = dict(CleanupJob.objects.filter(pk__in=job_ids).values_list("id", "job_kind"))
    CleanupJob.objects.filter(pk__in=job_ids).update(enqueued_at=at)
    by_queue: dict[str, list[int]] = {}
    for job_id in job_ids:
        by_queue.setdefault(queue_for(kinds.get(job_id, JobKind.DELETE)), []).append(job_id)
    for queue, ids in by_queue.items():
        transaction.on_commit(partial(_send, queue, ids, at=at, stamp=at))


def dispatch_after_commit() -> None:
    """Wake the dispatcher once the current transaction commits (new due work)."""
    transaction.on_commit(dispatch_due_jobs)


def _send(queue: str, job_ids: list[int], *, at: datetime | None = None, stamp: datetime | None = None) -> int:
    """Send one message per job to ``queue``, in order; returns how many were sent.

    Runs after commit. If the broker fails, the jobs not sent lose their
    ``enqueued_at`` mark (when it is still ours), so the next dispatcher call
    sends them instead of waiting a lease for a message that never left."""
    sent = 0
    try:
        with not_before(at or clock.now()):
            for job_id in job_ids:
                _enqueue(queue, job_id)
                sent += 1
    except Exception as exc:
        unsent = job_ids[sent:]
        logger.warning(
            "dispatch: %s of %s messages not sent to queue %s (%s); they will be sent again",
            len(unsent),
            len(job_ids),
            queue,
            type(exc).__name__,
            extra={"category": "broker_unavailable"},
        )
        if stamp is not None:
            CleanupJob.objects.filter(pk__in=unsent, enqueued_at=stamp).update(enqueued_at=None)
    return sent


def _enqueue(queue: str, job_id: int) -> None:
    options = {"task_name": f"cleanup-job-{job_id}", "group": "cleanup"}
    try:
        async_task("cleanup_ops.tasks.run_job", job_id, broker=broker(queue), **options)
    except Exception:
        # A kept connection may have died (a broker restart): once more on a new one.
        _forget_broker(queue)
        async_task("cleanup_ops.tasks.run_job", job_id, broker=broker(queue), **options)
