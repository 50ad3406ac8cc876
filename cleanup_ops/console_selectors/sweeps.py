"""Sweeps: the history and the drain forecast."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import croniter
from django.conf import settings
from django.db.models import Count, Max, Min, Q, Sum

from cleanup_ops.console_selectors.waiting import OpenWork, open_work
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    JobOutcome,
    JobState,
    Sweep,
    open_letter_q,
    open_q,
    superseded_q,
)
from cleanup_ops.sweeps import sweep_status_seen
from retention.scoping import PortfolioScope, portfolio_ids_q

# --- Sweeps: history and the drain forecast ------------------------------------

# The drain forecast measures the rate over this window (or since the sweep
# started, when that is shorter) and trusts no rate measured over less than
# the minimum.
FORECAST_WINDOW = timedelta(minutes=15)
FORECAST_MIN_WINDOW = timedelta(minutes=1)
# A rate measured over less than the minimum window is trusted all the same
# once this many jobs finished in it (work that drains in seconds).
FORECAST_MIN_FINISHES = 5

OUTCOMES = list(JobOutcome.values)


def finished_since_q(since: datetime) -> Q:
    """Jobs that finished at or after ``since`` (a dead job keeps no finish
    time, so in practice: done jobs). A job cannot finish before its sweep
    started, so counting from ``now - window`` also gives the right count for
    a sweep younger than the window."""
    return Q(state__in=[JobState.DONE, JobState.DEAD], finished_at__gte=since)


def sweeps_figures(sweep_ids: list[int], *, now: datetime, portfolio_ids: PortfolioScope) -> dict[int, dict[str, Any]]:
    """Per sweep: jobs, open, dead, rows deleted and held, jobs per outcome,
    last finish, jobs finished within ``FORECAST_WINDOW`` (the forecast's
    rate), dead letters (all and open). Two grouped queries."""
    if not sweep_ids:
        return {}
    scope = portfolio_ids_q(portfolio_ids)
    rows = (
        CleanupJob.objects.filter(scope, sweep_id__in=sweep_ids)
        .values("sweep_id")
        .annotate(
            jobs=Count("id"),
            open=Count("id", filter=open_q()),
            dead=Count("id", filter=Q(state=JobState.DEAD)),
            superseded=Count("id", filter=superseded_q()),
            rows=Sum("rows_deleted"),
            held=Sum("rows_held"),
            last_finished=Max("finished_at"),
            finished_recently=Count("id", filter=finished_since_q(now - FORECAST_WINDOW)),
            **{f"outcome_{o}": Count("id", filter=Q(outcome=o)) for o in OUTCOMES},
        )
        .order_by()
    )
    letters = dict(
        (r["sweep_id"], r)
        for r in DeadLetter.objects.filter(scope, sweep_id__in=sweep_ids)
        .values("sweep_id")
        .annotate(letters=Count("id"), letters_open=Count("id", filter=open_letter_q()))
        .order_by()
    )
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        out[r["sweep_id"]] = {
            "jobs": r["jobs"],
            "open": r["open"],
            # Dead and not redriven: a redriven job's work is its redrive's.
            "dead": r["dead"] - r["superseded"],
            "rows": r["rows"] or 0,
            "held": r["held"] or 0,
            "last_finished": r["last_finished"],
            "finished_recently": r["finished_recently"],
            "outcomes": {o: r[f"outcome_{o}"] for o in OUTCOMES if r[f"outcome_{o}"]},
        }
    for sweep_id in sweep_ids:
        entry = out.setdefault(
            sweep_id,
            {
                "jobs": 0,
                "open": 0,
                "dead": 0,
                "rows": 0,
                "held": 0,
                "last_finished": None,
                "finished_recently": 0,
                "outcomes": {},
            },
        )
        letter = letters.get(sweep_id, {})
        entry["letters"] = letter.get("letters", 0)
        entry["letters_open"] = letter.get("letters_open", 0)
    return out


def sweep_status_for(sweep: Sweep, figures: Mapping[str, Any], *, portfolio_ids: PortfolioScope) -> str:
    """The platform's status, or for a customer's staff the status their own
    jobs give (another customer's open or dead jobs never show through)."""
    if portfolio_ids is None:
        return sweep.status
    return sweep_status_seen(sweep.status, open_jobs=figures["open"], dead_jobs=figures["dead"])


def sweep_row(sweep: Sweep, figures: Mapping[str, Any], *, now: datetime, portfolio_ids: PortfolioScope) -> dict:
    """One line of the sweeps history: slot, status, duration, counts."""
    status = sweep_status_for(sweep, figures, portfolio_ids=portfolio_ids)
    running = status in {Sweep.Status.ADMITTING, Sweep.Status.RUNNING}
    if portfolio_ids is None:
        finished = sweep.finished_at
    else:
        finished = None if running else (figures["last_finished"] or sweep.admitted_at)
    end = now if running else (finished or sweep.admitted_at or sweep.created_at)
    return {
        "sweep": sweep,
        "status": status,
        "running": running,
        "started_at": sweep.created_at,
        "finished_at": None if running else finished,
        "duration_seconds": max(0.0, (end - sweep.created_at).total_seconds()),
        **figures,
    }


def sweeps_history(sweeps: list[Sweep], *, now: datetime, portfolio_ids: PortfolioScope) -> list[dict[str, Any]]:
    figures = sweeps_figures([s.pk for s in sweeps], now=now, portfolio_ids=portfolio_ids)
    return [sweep_row(s, figures[s.pk], now=now, portfolio_ids=portfolio_ids) for s in sweeps]


class ForecastStatus:
    DONE = "done"  # nothing left
    MEASURING = "measuring"  # too early to measure a rate
    ON_TIME = "on_time"  # projected to finish before the next slot
    LATE = "late"  # projected to finish after the next slot
    STALLED = "stalled"  # nothing finished in the window: no finish in sight
    OVERRAN = "overran"  # the next slot has already begun
    BLOCKED = "blocked"  # every open job is paused or has no worker: no rate finishes it

    WARNINGS = frozenset({LATE, STALLED, OVERRAN, BLOCKED})


@dataclass(frozen=True)
class DrainForecast:
    status: str
    remaining: int
    finished_in_window: int
    window_seconds: float
    rate_per_minute: float | None
    eta_seconds: float | None
    projected_finish: datetime | None
    next_slot: datetime
    seconds_to_next_slot: float
    margin_seconds: float | None  # next slot - projected finish (negative: late)
    blocked: int = 0  # open jobs that cannot run (paused, no worker): not in ``remaining``
    work: OpenWork | None = None  # the buckets, with the pauses' names and reasons

    @property
    def warning(self) -> bool:
        return self.status in ForecastStatus.WARNINGS

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "warning": self.warning,
            "remaining": self.remaining,
            "finished_in_window": self.finished_in_window,
            "window_seconds": self.window_seconds,
            "rate_per_minute": self.rate_per_minute,
            "eta_seconds": self.eta_seconds,
            "projected_finish": self.projected_finish,
            "next_slot": self.next_slot,
            "seconds_to_next_slot": self.seconds_to_next_slot,
            "margin_seconds": self.margin_seconds,
            "blocked": self.blocked,
        }


def drain_forecast(
    *,
    now: datetime,
    started_at: datetime,
    remaining: int,
    finished_recently: int,
    next_slot: datetime,
    window: timedelta = FORECAST_WINDOW,
    blocked: int = 0,
    work: OpenWork | None = None,
    first_finished_at: datetime | None = None,
) -> DrainForecast:
    """When will the open work finish at the rate measured over the last
    ``window`` (or since ``started_at`` when that is shorter), and is that
    before ``next_slot``, the next sweep of the schedule?

    The rate is the recent throughput: with ``first_finished_at`` (the
    earliest finish within the window) and two finishes or more, it is
    measured from that first finish to now, over the finishes after it.
    After a recovery (workers back, a pause lifted, the store answering
    again) the window's first minutes were idle: counted, they would give a
    rate of a fraction of the real one (35 min forecast for 25 s of work).

    ``remaining``: open jobs that can run; ``blocked``: open jobs that cannot
    (a paused portfolio, no worker for their queue), which no rate finishes:
    when nothing else is open the forecast is ``blocked``, never "on track".
    ``finished_recently``: jobs finished (done or dead) within that span.
    Pure: counts and times in, a forecast out."""
    measured_from = max(now - window, started_at)
    counted = finished_recently
    if first_finished_at is not None and finished_recently >= 2 and first_finished_at > measured_from:
        # Measured from the first finish, that finish is the start line: the
        # ones after it are what finished in the span.
        measured_from, counted = min(first_finished_at, now), finished_recently - 1
    span = max(0.0, (now - measured_from).total_seconds())
    to_next = (next_slot - now).total_seconds()

    def result(status: str, *, rate: float | None = None, eta: float | None = None) -> DrainForecast:
        finish = now + timedelta(seconds=eta) if eta is not None else None
        return DrainForecast(
            status=status,
            remaining=remaining,
            finished_in_window=finished_recently,
            window_seconds=span,
            rate_per_minute=rate,
            eta_seconds=eta,
            projected_finish=finish,
            next_slot=next_slot,
            seconds_to_next_slot=to_next,
            margin_seconds=(next_slot - finish).total_seconds() if finish is not None else None,
            blocked=blocked,
            work=work,
        )

    if remaining <= 0 and blocked > 0:
        return result(ForecastStatus.BLOCKED)
    if remaining <= 0:
        return result(ForecastStatus.DONE, eta=0.0)
    rate = counted / (span / 60) if span > 0 else None
    if to_next <= 0:
        eta = remaining / rate * 60 if rate else None
        return result(ForecastStatus.OVERRAN, rate=rate, eta=eta)
    if span < FORECAST_MIN_WINDOW.total_seconds() and counted < FORECAST_MIN_FINISHES:
        return result(ForecastStatus.MEASURING, rate=rate)
    if not rate:
        return result(ForecastStatus.STALLED, rate=0.0)
    eta = remaining / rate * 60
    return result(ForecastStatus.ON_TIME if eta <= to_next else ForecastStatus.LATE, rate=rate, eta=eta)


def next_slot_after(slot: datetime, *, schedule: str | None = None) -> datetime:
    """The schedule's next slot after ``slot``: the next retention boundary."""
    return croniter(schedule or settings.CLEANUP_SCHEDULE, slot.astimezone(UTC)).get_next(datetime).astimezone(UTC)


def sweep_forecast(
    sweep: Sweep,
    *,
    now: datetime,
    portfolio_ids: PortfolioScope,
    window: timedelta = FORECAST_WINDOW,
    live_kinds: set[str] | None = None,
) -> DrainForecast:
    """The forecast of a sweep: its open work in buckets (``waiting.open_work``;
    ``live_kinds`` as there) and one aggregate of the jobs it finished lately.
    Only work that can run is projected; the rest is ``blocked``, with reasons."""
    started_at = sweep.admitted_at or sweep.created_at
    since = max(now - window, started_at)
    finished = CleanupJob.objects.filter(
        portfolio_ids_q(portfolio_ids), finished_since_q(since), sweep_id=sweep.pk
    ).aggregate(count=Count("id"), first=Min("finished_at"))
    work = open_work(now=now, portfolio_ids=portfolio_ids, live_kinds=live_kinds, sweep_id=sweep.pk)
    return drain_forecast(
        now=now,
        started_at=started_at,
        remaining=work.runnable,
        blocked=work.blocked,
        work=work,
        finished_recently=finished["count"],
        first_finished_at=finished["first"],
        next_slot=next_slot_after(sweep.slot),
        window=window,
    )
