"""The overview: the pipeline at a glance, its charts and the current sweep's forecast."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from cleanup_ops.charts import bar_chart
from cleanup_ops.console_selectors import (
    portfolio_names,
    sweep_forecast,
)
from cleanup_ops.console_selectors.breakdown import jobs_by_portfolio_and_state
from cleanup_ops.console_selectors.overview import THROUGHPUT_HOURS, overview, throughput
from cleanup_ops.console_selectors.waiting import open_work, pipeline_attention
from cleanup_ops.console_selectors.workers import queue_clusters
from cleanup_ops.dispatch import queues
from cleanup_ops.models import JobState, Sweep
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.views.common import (
    VIEW_PERM,
    bad_input_as_400,
    live_kinds_now,
    render_live,
)
from retention.actors import request_actor
from retention.filters import FilterError
from retention.models import Membership
from retention.scoping import (
    portfolio_ids_where,
)

# Chart time ranges (hours); above 48 h the bars are 6-hour buckets.
CHART_HOURS = (6, 12, 24, 48, 168)


def chart_hours(raw: str | None) -> int:
    if raw in (None, ""):
        return THROUGHPUT_HOURS
    if raw not in {str(h) for h in CHART_HOURS}:
        raise FilterError("hours", f"hours must be one of {', '.join(map(str, CHART_HOURS))}.")
    return int(raw)


LONG_RANGE_CACHE_SECONDS = 60


def throughput_cached(*, now: datetime, hours: int, scope: frozenset[int] | None) -> list[dict[str, Any]]:
    """A long range (days of ledger rows) at most once a minute per process,
    scope and hour: hourly buckets move on the scale of hours, not seconds."""
    scope_key = "all" if scope is None else ",".join(map(str, sorted(scope)))
    key = f"console:throughput:{hours}:{now:%Y%m%dT%H}:{scope_key}"
    # What the lambda computed, now or within the minute (get_or_set's declared type allows None).
    return cast(
        "list[dict[str, Any]]",
        cache.get_or_set(key, lambda: throughput(now=now, hours=hours, portfolio_ids=scope), LONG_RANGE_CACHE_SECONDS),
    )


def throughput_chart(points: list[dict[str, Any]], *, hours: int) -> dict[str, Any]:
    """Rows deleted per hour (or per 6 hours above two days), labelled in the
    viewer's zone (``retention.middleware.ViewerTimeZone``; UTC without it),
    the zone named on the axis. A zone half an hour off UTC labels "05:30"."""
    bucket = 1 if hours <= 48 else 6
    bars: list[tuple[str, int]] = []
    for i in range(0, len(points), bucket):
        chunk = points[i : i + bucket]
        start = timezone.localtime(datetime.fromisoformat(chunk[0]["hour"]))
        clock = f"{start:%H}h" if start.minute == 0 else f"{start:%H:%M}"
        label = clock if hours <= 24 else f"{start:%a} {clock}"
        bars.append((label, sum(p["rows"] for p in chunk)))
    unit = "hour" if bucket == 1 else f"{bucket} hours"
    zone = timezone.get_current_timezone_name()
    return bar_chart(bars, x_label=f"{zone}, last {hours} h (one bar per {unit})", y_label=f"rows deleted per {unit}")


def landing_page(request: HttpRequest) -> HttpResponse:
    """Where a user whose roles reach none of the pipeline's pages lands (a
    customer's property manager or reviewer, logging in at the console or at
    ``/``): their portfolios and roles, and links to what they may do."""
    memberships = list(
        Membership.objects.filter(user_id=request_actor(request).pk)
        .select_related("portfolio")
        .order_by("portfolio__name")
    )
    portfolios = list({m.portfolio_id: m.portfolio for m in memberships}.values())
    roles = sorted({m.get_role_display().lower() for m in memberships})
    return render(request, "console/landing.html", {"portfolios": portfolios, "roles": roles})


@login_required
@bad_input_as_400
def overview_page(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(VIEW_PERM):
        return landing_page(request)
    scope = portfolio_ids_where(request.user, VIEW_PERM)
    now = timezone.now()
    hours = chart_hours(request.GET.get("hours"))
    figures = overview(now=now, portfolio_ids=scope)
    points = (
        figures["throughput"] if hours == THROUGHPUT_HOURS else throughput_cached(now=now, hours=hours, scope=scope)
    )
    sweep = figures["current_sweep"]
    live = live_kinds_now(now)
    work = open_work(now=now, portfolio_ids=scope, live_kinds=live)
    forecast = None
    if sweep is not None and sweep["status"] in {Sweep.Status.RUNNING, Sweep.Status.ADMITTING}:
        current = Sweep.objects.filter(pk=sweep["id"]).first()
        forecast = sweep_forecast(current, now=now, portfolio_ids=scope, live_kinds=live) if current else None
    breakdown = jobs_by_portfolio_and_state(sweep_id=sweep["id"] if sweep else None, portfolio_ids=scope)
    names = portfolio_names(
        [p["portfolio_id"] for p in figures["fairness"]]
        + [p["portfolio_id"] for p in figures["pauses"]]
        + [row.portfolio_id for row in breakdown.portfolios]
    )
    return render_live(
        request,
        "console/overview.html",
        {
            "f": figures,
            "names": names,
            "forecast": forecast,
            "work": work,
            "oldest_due_age_seconds": work.oldest_due_age_seconds(now=now),
            "hours": hours,
            "hour_choices": CHART_HOURS,
            "throughput_chart": throughput_chart(points, hours=hours),
            "retries_chart": bar_chart(
                [
                    (FailureCategory(c).label if c in FailureCategory.values else c, n)
                    for c, n in figures["retries_by_category"].items()
                ],
                x_label="failure category (current sweep and open jobs)",
                y_label="failed attempts",
            ),
            "breakdown": breakdown,
            "now": now,
            "job_states": JobState.choices,
            "state_chart": bar_chart(
                [(JobState(state).label, n) for state, n in breakdown.by_state.items()],
                x_label="job state (current sweep)",
                y_label="jobs",
            ),
            "portfolio_chart": bar_chart(
                [(names.get(row.portfolio_id, str(row.portfolio_id)), row.total) for row in breakdown.portfolios],
                x_label="portfolio (current sweep, most jobs first)",
                y_label="jobs",
            ),
            "can_pause": request.user.has_perm("cleanup_ops.add_pipelinepause"),
            # Issue 30, item 11: "running" only when nothing waits for an operator.
            "attention": pipeline_attention(work, letters_open=figures["dead_letters"]["open"]),
            "clusters": queue_clusters(now=now, queues=queues())
            if request.user.has_perm("cleanup_ops.view_workerheartbeat")
            else None,
        },
    )
