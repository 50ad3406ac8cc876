"""What the open work is waiting for: the console's forecast and "waiting"
figures count only work that can run, and show the rest with its reason.

Each open job (pending or leased) falls in exactly one bucket, in this order:

- **paused**: its portfolio is paused (or the whole pipeline is);
- **no worker**: no cluster serving its kind's queue has reported within
  ``CLEANUP_LIVENESS_STALE_SECONDS`` (``workers.live_job_kinds``) — nothing
  will take it, however long it waits;
- **running**: a worker holds a live lease on it;
- **backing off**: pending, not yet due, after a failed attempt (its
  ``available_at`` is the retry's instant; a 429's ``Retry-After`` included);
- **rate limited**: pending, not yet due, with no failure: a worker found no
  token in the rate limiter and deferred it (a deferral burns no attempt);
- **due**: pending and due now (or leased with an expired lease): it waits
  for a worker, and the oldest of these is "the oldest due job".

Paused and no-worker jobs are *blocked*: they do not finish whatever the rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q
from django.utils.translation import ngettext

from cleanup_ops.console_selectors.names import portfolio_names
from cleanup_ops.models import CleanupJob, JobState, PipelinePause, due_q, live_lease_q, open_q
from retention.scoping import PortfolioScope, portfolio_ids_q

# A customer learns that the pipeline is paused, not why (the platform's words may name another customer).
PLATFORM_PAUSE_REASON = "paused by the platform"
NOTHING = Q(pk__in=[])


@dataclass(frozen=True)
class OpenWork:
    open: int = 0
    paused: int = 0
    no_worker: int = 0
    running: int = 0
    backing_off: int = 0
    rate_limited: int = 0
    due: int = 0
    oldest_due_at: datetime | None = None
    # The pauses that hold open work: {"portfolio_id", "name", "reason", "since", "jobs"}.
    pauses: list[dict[str, Any]] = field(default_factory=list)
    # Job kinds with open work and no live cluster of their queue.
    kinds_without_worker: list[str] = field(default_factory=list)

    @property
    def blocked(self) -> int:
        return self.paused + self.no_worker

    @property
    def runnable(self) -> int:
        return self.open - self.blocked

    def oldest_due_age_seconds(self, *, now: datetime) -> float | None:
        return round((now - self.oldest_due_at).total_seconds(), 1) if self.oldest_due_at else None


def _paused_q(pauses: Sequence[Mapping[str, Any]]) -> Q:
    if any(p["portfolio_id"] is None for p in pauses):
        return Q(pk__isnull=False)  # a global pause holds everything
    ids = [p["portfolio_id"] for p in pauses]
    return Q(portfolio_id__in=ids) if ids else NOTHING


def open_work(
    *,
    now: datetime,
    portfolio_ids: PortfolioScope,
    live_kinds: set[str] | None,
    sweep_id: int | None = None,
    job_ids: list[int] | None = None,
) -> OpenWork:
    """The open work (of one sweep, or every open job) in buckets (see the
    module docstring). ``live_kinds``: job kinds whose queue has a live
    cluster (None: not judged, every kind counts as served). Three queries
    (pauses, one aggregate, open jobs per paused portfolio) and one for names."""
    scope = Q() if portfolio_ids is None else Q(portfolio_id__isnull=True) | portfolio_ids_q(portfolio_ids)
    pauses = list(PipelinePause.objects.active().filter(scope).values("portfolio_id", "reason", "paused_at"))
    paused = _paused_q(pauses)
    no_worker = ~paused & ~Q(job_kind__in=sorted(live_kinds)) if live_kinds is not None else NOTHING
    runnable = ~paused & ~no_worker
    later = runnable & Q(state=JobState.PENDING, available_at__gt=now)
    failed = Q(attempt__gt=0) & ~Q(last_error_category="")
    jobs = CleanupJob.objects.filter(open_q(), portfolio_ids_q(portfolio_ids))
    if sweep_id is not None:
        jobs = jobs.filter(sweep_id=sweep_id)
    if job_ids is not None:
        jobs = jobs.filter(pk__in=job_ids)
    agg = jobs.aggregate(
        open=Count("id"),
        paused=Count("id", filter=paused),
        no_worker=Count("id", filter=no_worker),
        running=Count("id", filter=runnable & live_lease_q(now=now)),
        backing_off=Count("id", filter=later & failed),
        rate_limited=Count("id", filter=later & ~failed),
        due=Count("id", filter=runnable & due_q(now=now)),
        oldest_due=Min("available_at", filter=runnable & due_q(now=now)),
    )
    kinds_without_worker: list[str] = []
    if agg["no_worker"]:
        kinds_without_worker = sorted(set(jobs.filter(no_worker).values_list("job_kind", flat=True).distinct()))
    held: list[dict[str, Any]] = []
    if agg["paused"]:
        per_portfolio = dict(
            jobs.filter(paused).values_list("portfolio_id").annotate(n=Count("id")).order_by("portfolio_id")
        )
        names = portfolio_names(p["portfolio_id"] for p in pauses)
        for p in sorted(pauses, key=lambda p: (p["portfolio_id"] is not None, p["portfolio_id"] or 0)):
            pid = p["portfolio_id"]
            n = agg["paused"] if pid is None else per_portfolio.get(pid, 0)
            if not n:
                continue
            reason = PLATFORM_PAUSE_REASON if pid is None and portfolio_ids is not None else p["reason"]
            held.append(
                {
                    "portfolio_id": pid,
                    "name": names.get(pid) if pid is not None else None,
                    "reason": reason,
                    "since": p["paused_at"],
                    "jobs": n,
                }
            )
            if pid is None:
                break  # a global pause holds every job: the portfolios' own pauses add nothing
    return OpenWork(
        open=agg["open"],
        paused=agg["paused"],
        no_worker=agg["no_worker"],
        running=agg["running"],
        backing_off=agg["backing_off"],
        rate_limited=agg["rate_limited"],
        due=agg["due"],
        oldest_due_at=agg["oldest_due"],
        pauses=held,
        kinds_without_worker=kinds_without_worker,
    )


def pipeline_attention(work: OpenWork, *, letters_open: int) -> list[str]:
    """Why the pipeline, though not paused, is not simply "running": open
    work that cannot run (a portfolio's pause, no cluster for its queue) and
    open dead letters. Empty: nothing needs an operator."""
    notes = []
    if work.paused:
        notes.append(
            ngettext("%(n)d open job waits", "%(n)d open jobs wait", work.paused) % {"n": work.paused}
            + " for a paused portfolio to be resumed"
        )
    if work.no_worker:
        kinds = ", ".join(work.kinds_without_worker)
        jobs = ngettext("%(n)d open job (%(k)s) has", "%(n)d open jobs (%(k)s) have", work.no_worker)
        notes.append(jobs % {"n": work.no_worker, "k": kinds} + " no worker: no cluster serving their queue reported")
    if letters_open:
        notes.append(
            ngettext("%(n)d dead letter waits", "%(n)d dead letters wait", letters_open) % {"n": letters_open}
            + " for a decision"
        )
    return notes


def why_they_will_not_run(
    work: OpenWork, *, stale_seconds: float, start_commands: Mapping[str, str] | None = None
) -> list[str]:
    """Warnings for new work (a redrive, a run now) that nothing will take:
    its portfolio is paused, or no cluster serves its queue."""
    warnings = []
    for p in work.pauses:
        where = f"portfolio {p['name'] or p['portfolio_id']} is" if p["portfolio_id"] else "the whole pipeline is"
        warnings.append(f"{p['jobs']} of these jobs will not run while {where} paused ({p['reason']}).")
    if work.no_worker:
        kinds = ", ".join(work.kinds_without_worker)
        # The command for each queue that lacks a cluster: a purge job needs a
        # cluster of the purge queue, which needs DOCSTORE_URL (issue 30, item 2).
        # ``start_commands``: job kind -> the command that starts a cluster of its queue.
        known = start_commands or {}
        commands = sorted({known.get(kind, "manage.py qcluster") for kind in work.kinds_without_worker})
        warnings.append(
            f"No worker will run {work.no_worker} of these jobs ({kinds}): no cluster serving their queue"
            f" has reported in the last {stale_seconds:g} s. Start one ({'; '.join(commands)}) or run cleanup_drain."
        )
    return warnings
