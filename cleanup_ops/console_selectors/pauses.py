"""Pauses and one portfolio's pipeline."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q, Sum

from cleanup_ops.console_selectors.overview import current_sweep
from cleanup_ops.models import (
    OPEN_STATES,
    CleanupJob,
    DeadLetter,
    JobState,
    PipelinePause,
    live_lease_q,
    open_letter_q,
    open_q,
)
from retention.models import AuditEvent
from retention.scoping import PortfolioScope, portfolio_ids_q

# --- Pauses and portfolios ------------------------------------------------------


def paused_portfolio_ids() -> frozenset[int | None]:
    """The portfolios with an active pause; ``None`` in the set: the whole
    pipeline is paused. One query. What a job row or page marks "paused"."""
    return frozenset(PipelinePause.objects.active().values_list("portfolio_id", flat=True))


def jobs_mark_paused(jobs: list[CleanupJob]) -> None:
    """Set ``paused`` on each open job whose portfolio (or the whole
    pipeline) is paused: no worker takes it until a resume, whatever its due
    time says. One query."""
    paused = paused_portfolio_ids()
    for job in jobs:
        job.paused = job.state in OPEN_STATES and (None in paused or job.portfolio_id in paused)


def pauses_overview(*, portfolio_ids: PortfolioScope, recent: int = 20) -> dict[str, Any]:
    """Active pauses (the global one first) and the most recent resumed ones,
    with who paused and resumed them. Two queries."""
    # (Not ``Q(global) | portfolio_ids_q(None)``: OR with an empty Q drops it.)
    scope = Q() if portfolio_ids is None else Q(portfolio_id__isnull=True) | portfolio_ids_q(portfolio_ids)
    base = PipelinePause.objects.filter(scope).select_related("paused_by", "resumed_by")
    active = sorted(base.active(), key=lambda p: (p.portfolio_id is not None, p.paused_at))
    history = list(base.filter(resumed_at__isnull=False).order_by("-resumed_at")[:recent])
    return {"active": active, "history": history, "global": next((p for p in active if p.portfolio_id is None), None)}


def portfolio_summary(portfolio_id: int, *, now: datetime) -> dict[str, Any]:
    """A portfolio's pipeline at a glance: its open jobs by state and its jobs
    in the current sweep (with their rows deleted), open dead letters, its
    pause and the audit events whose object is the portfolio. Five queries,
    each on an index (open jobs by portfolio, the current sweep's jobs)."""
    current = current_sweep()
    in_current = Q(sweep_id=current.pk) if current is not None else Q(pk__in=[])
    jobs = CleanupJob.objects.filter(Q(state__in=OPEN_STATES) | in_current, portfolio_id=portfolio_id).aggregate(
        **{f"state_{s}": Count("id", filter=Q(state=s)) for s in JobState.values},
        leased_live=Count("id", filter=live_lease_q(now=now)),
        current=Count("id", filter=in_current),
        current_open=Count("id", filter=in_current & open_q()),
        current_rows=Sum("rows_deleted", filter=in_current),
    )
    letters = DeadLetter.objects.filter(portfolio_id=portfolio_id).aggregate(
        open=Count("id", filter=open_letter_q()), oldest=Min("last_seen_at", filter=open_letter_q())
    )
    pause = PipelinePause.objects.active().filter(portfolio_id=portfolio_id).select_related("paused_by").first()
    events = list(
        AuditEvent.objects.filter(object_type="portfolio", object_id=str(portfolio_id))
        .select_related("actor")
        .order_by("-id")[:20]
    )
    return {
        "current_sweep": current,
        "jobs_by_state": {s: jobs[f"state_{s}"] for s in JobState.values},
        "leased_live": jobs["leased_live"],
        "current_jobs": jobs["current"],
        "current_open": jobs["current_open"],
        "letters_open": letters["open"],
        "letters_oldest": letters["oldest"],
        "current_rows": jobs["current_rows"] or 0,
        "pause": pause,
        "events": events,
    }
