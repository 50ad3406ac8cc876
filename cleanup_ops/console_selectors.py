"""Reads of the console's pages beyond the overview: the sweeps history and
the drain forecast, the jobs list and a job, a dead letter, the workers, the
pauses and a portfolio. The same rules as ``selectors``:

- every function issues a fixed number of queries whatever the data size
  (aggregates and bounded lists, never a query per row);
- every read of tenant data takes ``portfolio_ids`` (``None``: every
  portfolio, the platform's staff; a set: a customer's staff, from
  ``retention.scoping.portfolio_ids_where`` for the page's permission) and narrows with
  ``retention.scoping.portfolio_ids_q``;
- filters are parsed once from request parameters (``job_filter_parse``,
  like ``selectors.dead_letter_filter_parse``), strictly for the API and
  leniently for the console's links.

The drain forecast is a pure function of counts and times
(``drain_forecast``); ``sweep_forecast`` only gathers its inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import croniter
from django.conf import settings
from django.db.models import Count, Max, Min, Q, Sum

from cleanup_ops.models import (
    OPEN_STATES,
    CleanupJob,
    DeadLetter,
    JobKind,
    JobOutcome,
    JobState,
    LedgerEntry,
    PipelinePause,
    Sweep,
    WorkerHeartbeat,
    due_q,
    expired_lease_q,
    live_lease_q,
    liveness_verdict,
    open_letter_q,
    open_q,
    sweep_status_seen,
)
from cleanup_ops.recovery.classification import FailureCategory
from properties.models import Portfolio
from retention.filters import choice_param, id_param
from retention.models import AuditEvent
from retention.registry import REGISTRY
from retention.scoping import portfolio_ids_q

# None: every portfolio (platform staff); a set: a customer's portfolios.
PortfolioScope = frozenset[int] | None

PAGE_SIZE = 50

# The drain forecast measures the rate over this window (or since the sweep
# started, when that is shorter) and trusts no rate measured over less than
# the minimum.
FORECAST_WINDOW = timedelta(minutes=15)
FORECAST_MIN_WINDOW = timedelta(minutes=1)

# --- Names -------------------------------------------------------------------


def portfolio_names(ids: Iterable[int | None]) -> dict[int, str]:
    """Portfolio id → name for the ids a page shows: one query (none if empty)."""
    wanted = sorted({i for i in ids if i is not None})
    if not wanted:
        return {}
    return dict(Portfolio.objects.filter(pk__in=wanted).values_list("id", "name"))


def portfolio_choices(*, portfolio_ids: PortfolioScope) -> list[dict[str, Any]]:
    """Every portfolio the user may see, by name (a pause form's select)."""
    qs = Portfolio.objects.filter(portfolio_ids_q(portfolio_ids, field="pk")).order_by("name", "id")
    return list(qs.values("id", "name", "slug"))


# --- Jobs: the filter, the list, one job ------------------------------------


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: the console's jobs list (and its links from other pages)."""

    sweep_id: int | None = None
    state: str | None = None
    portfolio_id: int | None = None
    record_kind: str | None = None
    category: str | None = None
    job_kind: str | None = None

    def q(self) -> Q:
        q = Q()
        if self.sweep_id is not None:
            q &= Q(sweep_id=self.sweep_id)
        if self.state is not None:
            q &= Q(state=self.state)
        if self.portfolio_id is not None:
            q &= Q(portfolio_id=self.portfolio_id)
        if self.record_kind is not None:
            q &= Q(record_kind=self.record_kind)
        if self.category is not None:
            q &= Q(last_error_category=self.category)
        if self.job_kind is not None:
            q &= Q(kind=self.job_kind)
        return q

    def as_params(self) -> dict[str, str]:
        pairs = {
            "sweep": self.sweep_id,
            "state": self.state,
            "portfolio": self.portfolio_id,
            "kind": self.record_kind,
            "category": self.category,
            "job_kind": self.job_kind,
        }
        return {name: str(value) for name, value in pairs.items() if value is not None}


def job_filter_parse(params: Mapping[str, Any], *, strict: bool) -> JobFilter:
    """``sweep``, ``state``, ``portfolio``, ``kind`` (record kind), ``category``
    (last failure category), ``job_kind`` (delete or purge).

    ``strict``: an invalid value raises ``FilterError`` naming the parameter;
    otherwise it is ignored."""
    return JobFilter(
        sweep_id=id_param(params, "sweep", strict=strict),
        state=choice_param(params, "state", JobState.values, strict=strict),
        portfolio_id=id_param(params, "portfolio", strict=strict),
        record_kind=choice_param(params, "kind", list(REGISTRY), strict=strict),
        category=choice_param(params, "category", FailureCategory.values, strict=strict),
        job_kind=choice_param(params, "job_kind", JobKind.values, strict=strict),
    )


@dataclass
class JobsPage:
    jobs: list[CleanupJob]
    count: int
    older: int | None  # the ``before`` id of the next (older) page
    newest: bool  # no ``before``: the first page


def jobs_page(
    job_filter: JobFilter, *, portfolio_ids: PortfolioScope, before: int | None = None, size: int = PAGE_SIZE
) -> JobsPage:
    """Newest first, keyset-paginated on the id (``before``): two queries
    (the count and the page) whatever the page number."""
    qs = CleanupJob.objects.filter(job_filter.q(), portfolio_ids_q(portfolio_ids))
    count = qs.count()
    page = qs.order_by("-id")
    if before is not None:
        page = page.filter(id__lt=before)
    jobs = list(page.select_related("sweep")[: size + 1])
    older = jobs[size - 1].pk if len(jobs) > size else None
    return JobsPage(jobs=jobs[:size], count=count, older=older, newest=before is None)


LEDGER_ROWS = 50


def job_chain(job: CleanupJob) -> list[CleanupJob]:
    """The job and every redrive of its partition, oldest first, each with its
    dead letter (``dead_letter_or_none``): the failure history of the work.

    A partition has one job per sweep (a unique key) and its redrives share
    the sweep and the scope, so they are found by that, in one query."""
    chain = list(
        CleanupJob.objects.filter(
            sweep_id=job.sweep_id,
            portfolio_id=job.portfolio_id,
            property_id=job.property_id,
            record_kind=job.record_kind,
            kind=job.kind,
            purge_request_id=job.purge_request_id,
        )
        .select_related("dead_letter")
        .order_by("id")
    )
    for item in chain:
        try:
            letter = item.dead_letter  # loaded by select_related: no query
        except DeadLetter.DoesNotExist:
            letter = None
        item.dead_letter_or_none = letter
    return chain


def job_detail(job: CleanupJob, *, scope_audit: Any) -> dict[str, Any]:
    """Everything the job page shows: its ledger operations (the newest
    ``LEDGER_ROWS`` and the totals), its redrive chain with dead letters, and
    the audit events of those letters (narrowed by ``scope_audit``, a
    function of a queryset). Four queries."""
    ledger = LedgerEntry.objects.filter(job_id=job.pk)
    totals = ledger.aggregate(
        n=Count("id"),
        rows=Sum("rows_deleted"),
        candidates=Sum("candidates"),
        first=Min("applied_at"),
        last=Max("applied_at"),
    )
    entries = list(ledger.order_by("-id")[:LEDGER_ROWS])
    chain = job_chain(job)
    letter_ids = [str(item.dead_letter_or_none.pk) for item in chain if item.dead_letter_or_none is not None]
    events = []
    if letter_ids:
        events = list(
            scope_audit(
                AuditEvent.objects.filter(object_type="dead_letter", object_id__in=letter_ids).select_related("actor")
            ).order_by("id")[:100]
        )
    this = next((item for item in chain if item.pk == job.pk), job)
    return {
        "ledger": entries,
        "ledger_totals": {k: v or 0 for k, v in totals.items() if k not in {"first", "last"}}
        | {"first": totals["first"], "last": totals["last"]},
        "ledger_more": max(0, (totals["n"] or 0) - len(entries)),
        "chain": chain,
        "letter": getattr(this, "dead_letter_or_none", None),
        "redrives": [item for item in chain if item.redrive_of_id == job.pk],
        "events": events,
    }


# --- Sweeps: history and the drain forecast ------------------------------------

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
            "dead": r["dead"],
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

    WARNINGS = frozenset({LATE, STALLED, OVERRAN})


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
        }


def drain_forecast(
    *,
    now: datetime,
    started_at: datetime,
    remaining: int,
    finished_recently: int,
    next_slot: datetime,
    window: timedelta = FORECAST_WINDOW,
) -> DrainForecast:
    """When will the open work finish at the rate measured over the last
    ``window`` (or since ``started_at`` when that is shorter), and is that
    before ``next_slot``, the next sweep of the schedule?

    ``finished_recently``: jobs finished (done or dead) within that span.
    Pure: counts and times in, a forecast out."""
    measured_from = max(now - window, started_at)
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
        )

    if remaining <= 0:
        return result(ForecastStatus.DONE, eta=0.0)
    rate = finished_recently / (span / 60) if span > 0 else None
    if to_next <= 0:
        eta = remaining / rate * 60 if rate else None
        return result(ForecastStatus.OVERRAN, rate=rate, eta=eta)
    if span < FORECAST_MIN_WINDOW.total_seconds():
        return result(ForecastStatus.MEASURING, rate=rate)
    if not rate:
        return result(ForecastStatus.STALLED, rate=0.0)
    eta = remaining / rate * 60
    return result(ForecastStatus.ON_TIME if eta <= to_next else ForecastStatus.LATE, rate=rate, eta=eta)


def next_slot_after(slot: datetime, *, schedule: str | None = None) -> datetime:
    """The schedule's next slot after ``slot``: the next retention boundary."""
    return croniter(schedule or settings.CLEANUP_SCHEDULE, slot.astimezone(UTC)).get_next(datetime).astimezone(UTC)


def sweep_forecast(
    sweep: Sweep, *, now: datetime, portfolio_ids: PortfolioScope, window: timedelta = FORECAST_WINDOW
) -> DrainForecast:
    """The forecast of a sweep from one aggregate over its jobs."""
    started_at = sweep.admitted_at or sweep.created_at
    since = max(now - window, started_at)
    agg = CleanupJob.objects.filter(portfolio_ids_q(portfolio_ids), sweep_id=sweep.pk).aggregate(
        remaining=Count("id", filter=open_q()),
        finished=Count("id", filter=finished_since_q(since)),
    )
    return drain_forecast(
        now=now,
        started_at=started_at,
        remaining=agg["remaining"],
        finished_recently=agg["finished"],
        next_slot=next_slot_after(sweep.slot),
        window=window,
    )


# --- Workers ------------------------------------------------------------------


def _owner_host(owner: str) -> str:
    # ``execution.leases.worker_name``: "<host>:<pid>".
    return owner.rsplit(":", 1)[0] if ":" in owner else owner


def workers_overview(*, now: datetime) -> dict[str, Any]:
    """Clusters (their heartbeats, judged like ``cleanup_health --liveness``),
    the leases each worker holds, and expired leases waiting to be recovered.
    Three queries. Platform staff only (it names no portfolio)."""
    stale = float(settings.CLEANUP_LIVENESS_STALE_SECONDS)
    oldest_due = CleanupJob.objects.filter(due_q(now=now)).aggregate(at=Min("available_at"))["at"]
    waited = (now - oldest_due).total_seconds() if oldest_due else None
    owners = list(
        CleanupJob.objects.filter(state=JobState.LEASED)
        .values("lease_owner")
        .annotate(
            jobs=Count("id", filter=live_lease_q(now=now)),
            holders=Count("lease_token", distinct=True, filter=live_lease_q(now=now)),
            expired=Count("id", filter=expired_lease_q(now=now)),
            expires=Max("lease_expires_at", filter=live_lease_q(now=now)),
            expired_since=Min("lease_expires_at", filter=expired_lease_q(now=now)),
            portfolios=Count("portfolio_id", distinct=True, filter=live_lease_q(now=now)),
        )
        .order_by("lease_owner")
    )
    by_host: dict[str, dict[str, int]] = {}
    for row in owners:
        row["host"] = _owner_host(row["lease_owner"])
        totals = by_host.setdefault(row["host"], {"jobs": 0, "holders": 0, "expired": 0})
        totals["jobs"] += row["jobs"]
        totals["holders"] += row["holders"]
        totals["expired"] += row["expired"]
    clusters = []
    for hb in WorkerHeartbeat.objects.order_by("host", "cluster"):
        state, quiet = liveness_verdict(waited=waited, heartbeat=hb, now=now, stale=stale)
        detail = {"idle": "no due work", "working": ""}.get(
            state, f"no progress while due work waited {int(waited or 0)} s"
        )
        clusters.append(
            {
                "hb": hb,
                "state": state,
                "detail": detail,
                "heartbeat_age_seconds": (now - hb.updated_at).total_seconds(),
                "quiet_seconds": quiet,
                "host_leases": by_host.get(hb.host, {"jobs": 0, "holders": 0, "expired": 0}),
            }
        )
    return {
        "clusters": clusters,
        "owners": owners,
        "due_waiting_seconds": waited,
        "stale_seconds": stale,
        "expired_total": sum(r["expired"] for r in owners),
    }


# --- Pauses and portfolios ------------------------------------------------------


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
    current = Sweep.objects.order_by("-slot").first()
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
