"""The overview's figures: what the console's overview page and the API's
``/api/v1/metrics/`` show (the Prometheus exporter reads them too), for the
portfolios a reader may see (``portfolio_ids``, ``None``: every portfolio).

Jobs of the current sweep and the open ones, rows deleted per hour, retries
by category, the dead letters' figures, per-portfolio fairness and the
retention debt; ``overview`` gathers them all. A module of the console's
reads because the overview is its landing page; the API serves the same
figures rather than a second set.

Every function issues a fixed number of queries whatever the data size
(aggregates in the database, never a query per row), so pages stay constant
in queries and fast with 100k jobs and 1M ledger rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, cast

from django.core.cache import cache
from django.db.models import Count, ExpressionWrapper, IntegerField, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone
from psycopg import sql as pg

from cleanup_ops import sql
from cleanup_ops.console_selectors.waiting import PLATFORM_PAUSE_REASON
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    JobState,
    LedgerEntry,
    PipelinePause,
    Sweep,
    due_q,
    live_lease_q,
    open_letter_q,
    open_q,
    superseded_q,
)
from cleanup_ops.ratelimit import effective_limits
from cleanup_ops.recovery.classification import FINAL_CATEGORIES
from cleanup_ops.sweeps import sweep_status_seen
from retention.eligibility import db_datetime, hold_covers_sql
from retention.models import PolicyVersion
from retention.registry import REGISTRY, RecordKindSpec
from retention.scoping import PortfolioScope, portfolio_ids_q

THROUGHPUT_HOURS = 12
DEBT_GRACE = timedelta(hours=24)  # a record is on time if deleted within a day of becoming eligible
DEBT_TARGET = 0.99


def current_sweep() -> Sweep | None:
    return Sweep.objects.order_by("-slot").first()


def sweep_progress(
    sweep: Sweep | None,
    *,
    total: int,
    finished: int,
    rows_deleted: int,
    dead: int = 0,
    portfolio_ids: PortfolioScope = None,
) -> dict[str, Any] | None:
    if sweep is None:
        return None
    status = sweep.status
    if portfolio_ids is not None:
        # ``finished`` counts done and dead jobs; the rest are still open.
        status = sweep_status_seen(status, open_jobs=total - finished, dead_jobs=dead)
    return {
        "id": sweep.pk,
        "key": sweep.key,
        "status": status,
        "jobs": total,
        "finished": finished,
        "percent": round(100 * finished / total, 1) if total else 100.0,
        "rows_deleted": rows_deleted,
        "carried_over": sweep.carried_over if portfolio_ids is None else None,
    }


def jobs_overview(*, now: datetime, sweep: Sweep | None, portfolio_ids: PortfolioScope = None) -> dict[str, Any]:
    """Jobs of the current sweep plus every open job, whatever its sweep.

    Scoped so the cost follows the current sweep and the open work (both
    indexed), not the whole job history.
    """
    scope = open_q()
    if sweep is not None:
        scope |= Q(sweep=sweep)
    agg = CleanupJob.objects.filter(scope, portfolio_ids_q(portfolio_ids)).aggregate(
        **{f"state_{s}": Count("id", filter=Q(state=s)) for s in JobState.values},
        leased=Count("id", filter=live_lease_q(now=now)),
        oldest_due=Min("available_at", filter=due_q(now=now)),
        in_sweep=Count("id", filter=Q(sweep=sweep)),
        done=Count("id", filter=Q(sweep=sweep, state=JobState.DONE)),
        dead=Count("id", filter=Q(sweep=sweep, state=JobState.DEAD)),
        superseded=Count("id", filter=superseded_q()),
        superseded_in_sweep=Count("id", filter=Q(sweep=sweep) & superseded_q()),
        sweep_rows=Sum("rows_deleted", filter=Q(sweep=sweep)),
    )
    # A dead job that was redriven is replaced by its redrive: counted
    # neither as dead nor in the sweep's total, so the figures recover once
    # the redrives are done (issue 30, item 8).
    agg["state_dead"] -= agg["superseded"]
    agg["dead"] -= agg["superseded_in_sweep"]
    agg["in_sweep"] -= agg["superseded_in_sweep"]
    recent = LedgerEntry.objects.filter(
        portfolio_ids_q(portfolio_ids), applied_at__gte=now - timedelta(hours=24)
    ).aggregate(n=Sum("rows_deleted"))
    finished = agg["done"] + agg["dead"]
    return {
        "jobs_by_state": {s: agg[f"state_{s}"] for s in JobState.values},
        "jobs_redriven": agg["superseded"],
        "rows_deleted_24h": recent["n"] or 0,
        "leased": agg["leased"],
        "oldest_due_age_seconds": round((now - agg["oldest_due"]).total_seconds(), 1) if agg["oldest_due"] else None,
        "completion_rate": round(agg["done"] / finished, 4) if finished else None,
        "current_sweep": sweep_progress(
            sweep,
            total=agg["in_sweep"],
            finished=finished,
            rows_deleted=agg["sweep_rows"] or 0,
            dead=agg["dead"],
            portfolio_ids=portfolio_ids,
        ),
    }


def throughput(
    *, now: datetime, hours: int = THROUGHPUT_HOURS, portfolio_ids: PortfolioScope = None
) -> list[dict[str, Any]]:
    """Rows deleted per hour over the last ``hours`` hours (oldest first, gaps as 0)."""
    start = (now - timedelta(hours=hours - 1)).replace(minute=0, second=0, microsecond=0)
    rows = dict(
        LedgerEntry.objects.filter(portfolio_ids_q(portfolio_ids), applied_at__gte=start)
        .annotate(hour=TruncHour("applied_at"))
        .values_list("hour")
        .annotate(n=Sum("rows_deleted"))
        .order_by()
    )
    return [
        {"hour": (start + timedelta(hours=i)).isoformat(), "rows": rows.get(start + timedelta(hours=i), 0) or 0}
        for i in range(hours)
    ]


def retries_by_category(*, sweep: Sweep | None, portfolio_ids: PortfolioScope = None) -> dict[str, int]:
    """Failed attempts by category, for the current sweep's jobs and open ones.

    ``attempt`` is the retry budget spent: a failure that is never retried (a
    4xx from the store, an invalid input: ``FINAL_CATEGORIES``) kills the job
    with ``attempt`` unchanged, 0 on a first try. Summing ``attempt`` alone
    left the chart empty through exactly such an incident; the job that died
    of one counts its final failed attempt too (as ``DeadLetter.failed_attempts``)."""
    scope = open_q()
    if sweep is not None:
        scope |= Q(sweep=sweep)
    final = Q(state=JobState.DEAD, last_error_category__in=sorted(FINAL_CATEGORIES))
    rows = (
        CleanupJob.objects.filter(scope, portfolio_ids_q(portfolio_ids))
        .filter(Q(attempt__gt=0) | final)
        .exclude(last_error_category="")
        .values_list("last_error_category")
        .annotate(n=ExpressionWrapper(Sum("attempt") + Count("id", filter=final), output_field=IntegerField()))
        .order_by("last_error_category")
    )
    return {category: n for category, n in rows if n}


def dead_letter_figures(*, now: datetime, portfolio_ids: PortfolioScope = None) -> dict[str, Any]:
    agg = DeadLetter.objects.filter(portfolio_ids_q(portfolio_ids)).aggregate(
        open=Count("id", filter=open_letter_q()),
        oldest=Min("last_seen_at", filter=open_letter_q()),
        last_24h=Count("id", filter=Q(last_seen_at__gte=now - timedelta(hours=24))),
        decided_24h=Count("id", filter=Q(resolved_at__gte=now - timedelta(hours=24))),
        previous_24h=Count(
            "id", filter=Q(last_seen_at__gte=now - timedelta(hours=48), last_seen_at__lt=now - timedelta(hours=24))
        ),
    )
    return {
        "open": agg["open"],
        "oldest_open_age_seconds": round((now - agg["oldest"]).total_seconds(), 1) if agg["oldest"] else None,
        "new_last_24h": agg["last_24h"],
        # What an operator decided in the same day: "36 new, 36 decided" reads
        # as the recovery it is, where "+36 vs previous day" beside "open 0" did not.
        "decided_last_24h": agg["decided_24h"],
        "growth_vs_previous_24h": agg["last_24h"] - agg["previous_24h"],
    }


def _portfolio_fairness() -> pg.Composed:
    """Per portfolio of a sweep: admission-to-first-lease wait p50/p95
    (percentile_cont), live leases, rows deleted, jobs."""
    return sql.composed(
        """
        SELECT portfolio_id,
            percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM first_leased_at - created_at)),
            percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM first_leased_at - created_at)),
            COUNT(*) FILTER (WHERE state = {leased} AND lease_expires_at > %s),
            COALESCE(SUM(rows_deleted), 0), COUNT(*)
        FROM {job} WHERE sweep_id = %s GROUP BY portfolio_id ORDER BY portfolio_id
        """,
        leased=pg.Literal(JobState.LEASED.value),
    )


def portfolio_fairness(
    *, now: datetime, sweep: Sweep | None, portfolio_ids: PortfolioScope = None
) -> list[dict[str, Any]]:
    """Per portfolio in the current sweep: wait from admission to first lease
    (p50, p95), live leases and rows deleted, in one query."""
    if sweep is None:
        return []
    rows = sql.execute(_portfolio_fairness(), [now, sweep.pk])
    # One row per portfolio: a customer's staff get their own rows only.
    rows = [r for r in rows if portfolio_ids is None or r[0] in portfolio_ids]
    return [
        {
            "portfolio_id": r[0],
            "wait_p50_seconds": None if r[1] is None else round(r[1], 1),
            "wait_p95_seconds": None if r[2] is None else round(r[2], 1),
            "active_leases": r[3],
            "rows_deleted": r[4],
            "jobs": r[5],
        }
        for r in rows
    ]


def retention_debt(*, now: datetime, portfolio_ids: PortfolioScope = None) -> list[dict[str, Any]]:
    """Per record kind: records past their cutoff *now* and not yet deleted.

    ``overdue`` excludes held records (they are kept on purpose, shown as
    ``held``). The target is that 99% of eligible records are deleted within
    ``DEBT_GRACE`` of becoming eligible: ``on_time_share`` is the share of
    records that became eligible and are not overdue by more than the grace
    (deleted in the last grace window, or overdue by less), and ``target_met``
    compares it with 0.99. One query per record kind.
    """
    previous = PolicyVersion.objects.filter(
        policy_id=OuterRef("policy_id"), status=PolicyVersion.Status.SUPERSEDED
    ).order_by("-number")
    versions = list(
        PolicyVersion.objects.in_force()
        .filter(portfolio_ids_q(portfolio_ids, field="policy__portfolio_id"))
        .annotate(
            previous_days=Subquery(previous.values("retention_days")[:1]),
            previous_enabled=Subquery(previous.values("enabled")[:1]),
        )
        .values_list(
            "policy__portfolio_id",
            "policy__record_kind",
            "retention_days",
            "policy_id",
            "reviewed_at",
            "previous_days",
            "previous_enabled",
        )
    )
    late_since = _late_cutoffs(versions, now=now)
    deleted_recently = dict(
        LedgerEntry.objects.filter(portfolio_ids_q(portfolio_ids), applied_at__gte=now - DEBT_GRACE)
        .values_list("record_kind")
        .annotate(n=Sum("rows_deleted"))
        .order_by()
    )
    result = []
    for kind, spec in REGISTRY.items():
        cutoffs = [
            (pid, now - timedelta(days=days), late_since[policy_id])
            for pid, k, days, policy_id, *_ in versions
            if k == kind
        ]
        row: dict[str, Any] = {
            "record_kind": kind,
            "overdue": 0,
            "held": 0,
            "overdue_beyond_grace": 0,
            "oldest_overdue_seconds": None,
        }
        if cutoffs:
            row.update(_debt_for_kind(kind, spec, cutoffs))
        eligible = row["overdue"] + (deleted_recently.get(kind) or 0)
        on_time = 1.0 if eligible == 0 else 1 - row["overdue_beyond_grace"] / eligible
        row["on_time_share"] = round(on_time, 4)
        row["target_met"] = on_time >= DEBT_TARGET
        result.append(row)
    return result


DEBT_CACHE_SECONDS = 60


def retention_debt_cached(*, now: datetime, portfolio_ids: PortfolioScope = None) -> list[dict[str, Any]]:
    """``retention_debt`` at most once a minute per process and scope: it reads
    every overdue record, and debt moves on the scale of sweeps, not seconds."""
    key = "cleanup_ops:retention_debt"
    if portfolio_ids is not None:
        key += ":" + ",".join(str(i) for i in sorted(portfolio_ids))
    # What the lambda computed, now or within the minute (get_or_set's declared type allows None).
    return cast(
        "list[dict[str, Any]]",
        cache.get_or_set(key, lambda: retention_debt(now=now, portfolio_ids=portfolio_ids), DEBT_CACHE_SECONDS),
    )


# Before any record: nothing is late yet (a new policy approved within the grace).
_NOTHING_LATE = datetime(1970, 1, 1, tzinfo=UTC)


def _late_cutoffs(versions: list[tuple[Any, ...]], *, now: datetime) -> dict[int, datetime]:
    """Per policy: records with a timestamp before this are *late* (eligible
    for longer than ``DEBT_GRACE``).

    A record becomes eligible when its retention period ends *or* when the
    version that made it eligible was approved, whichever is later: a
    legitimate shortening approved a minute ago makes many records eligible
    at once, and none of them can be a day late yet. So while the active
    version is younger than the grace, only records the previous version
    (``previous_days``, when it was enabled) already made eligible more than
    the grace ago are late — none, if there was no enabled previous version."""
    late = {}
    for _pid, _kind, days, policy_id, approved_at, previous_days, previous_enabled in versions:
        late[policy_id] = now - timedelta(days=days) - DEBT_GRACE
        if approved_at is not None and approved_at > now - DEBT_GRACE:
            before = now - timedelta(days=previous_days) - DEBT_GRACE if previous_enabled else _NOTHING_LATE
            late[policy_id] = min(late[policy_id], before)
    return late


def _retention_debt(spec: RecordKindSpec, *, hold_sql: pg.Composable, cutoffs: int) -> pg.Composed:
    """Per portfolio: overdue, held, overdue beyond the grace, oldest overdue
    timestamp, for ``cutoffs`` (portfolio, cutoff, late) rows of parameters."""
    names: dict[str, pg.Composable] = {
        "ts": sql.ident(spec.timestamp_column),
        "table": sql.ident(spec.table),
        "held_sql": hold_sql,
        "cutoff": spec.cutoff_sql(pg.SQL("c.cutoff")),
    }
    if spec.property_shape != "direct":
        # A path or no property: the rows of the portfolio (through the path,
        # those of its properties), read by one join.
        if spec.has_property:
            source = sql.composed(
                """
                FROM c JOIN {property} p ON p.{property_portfolio} = c.portfolio_id
                JOIN (SELECT {property_of} AS property_id, r.{ts} AS ts, {held_sql} AS held FROM {table} r) x
                    ON x.property_id = p.{property_pk} AND x.ts < {cutoff}
                """,
                **names,
                property_of=spec.property_of("r"),
            )
        else:
            source = sql.composed(
                """
                FROM c JOIN (SELECT r.{portfolio_column} AS portfolio_id, r.{ts} AS ts, {held_sql} AS held
                    FROM {table} r) x ON x.portfolio_id = c.portfolio_id AND x.ts < {cutoff}
                """,
                **names,
                portfolio_column=sql.ident(spec.portfolio_column),
            )
    else:
        # Per property, an index range scan on (property, timestamp): the cost
        # follows the overdue rows, not the table. OFFSET 0 keeps the hold
        # test computed once per row instead of once per aggregate.
        source = sql.composed(
            """
            FROM c JOIN {property} p ON p.{property_portfolio} = c.portfolio_id CROSS JOIN LATERAL
            (SELECT r.{ts} AS ts, {held_sql} AS held FROM {table} r
                WHERE r.{property_column} = p.{property_pk} AND r.{ts} < {cutoff} OFFSET 0) x
            """,
            **names,
            property_column=sql.ident(spec.property_column),
        )
    row = pg.SQL("(CAST(%s AS {key}), CAST(%s AS timestamptz), CAST(%s AS timestamptz))").format(
        key=pg.SQL(sql.PORTFOLIO_KEY)
    )
    return sql.composed(
        """
        WITH c(portfolio_id, cutoff, late) AS (VALUES {rows})
        SELECT c.portfolio_id, MIN(c.cutoff),
            SUM(CASE WHEN x.held THEN 0 ELSE 1 END), SUM(CASE WHEN x.held THEN 1 ELSE 0 END),
            SUM(CASE WHEN NOT x.held AND x.ts < c.late THEN 1 ELSE 0 END), MIN(CASE WHEN x.held THEN NULL ELSE x.ts END)
        {source} GROUP BY c.portfolio_id
        """,
        rows=pg.SQL(", ").join([row] * cutoffs),
        source=source,
    )


def _debt_for_kind(kind: str, spec: Any, cutoffs: list[tuple[int, datetime, datetime]]) -> dict[str, Any]:
    hold_sql, hold_params = hold_covers_sql(kind)
    params: list[object] = []
    for pid, cutoff, late_cutoff in cutoffs:
        params += [pid, db_datetime(cutoff), db_datetime(late_cutoff)]
    statement = _retention_debt(spec, hold_sql=hold_sql, cutoffs=len(cutoffs))
    rows = sql.execute(statement, [*params, *hold_params])
    oldest = None
    for _pid, cutoff, _overdue, _held, _late, min_ts in rows:
        if min_ts is not None:
            age = (_as_datetime(cutoff) - _as_datetime(min_ts)).total_seconds()
            oldest = age if oldest is None else max(oldest, age)
    return {
        "overdue": sum(r[2] or 0 for r in rows),
        "held": sum(r[3] or 0 for r in rows),
        "overdue_beyond_grace": sum(r[4] or 0 for r in rows),
        "oldest_overdue_seconds": None if oldest is None else round(oldest, 1),
    }


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


class _ScopeArgs(TypedDict):
    """The scope every part of the overview is read with (passed as ``**scope``)."""

    portfolio_ids: PortfolioScope


def overview(*, now: datetime | None = None, portfolio_ids: PortfolioScope = None) -> dict[str, Any]:
    """Everything the console overview and ``/api/v1/metrics/`` show, for the
    portfolios in ``portfolio_ids`` (``None``: every portfolio)."""
    now = now or timezone.now()
    sweep = current_sweep()
    pauses = list(
        PipelinePause.objects.active()
        # OR with an empty Q (every portfolio) would drop it: filter only a customer's view.
        .filter(Q() if portfolio_ids is None else Q(portfolio_id__isnull=True) | portfolio_ids_q(portfolio_ids))
        .values("portfolio_id", "reason", "paused_at")
    )
    if portfolio_ids is not None:
        # A global pause's reason is the platform's own words; a customer
        # learns that the pipeline is paused, not why (it may name another).
        pauses = [{**p, "reason": PLATFORM_PAUSE_REASON} if p["portfolio_id"] is None else p for p in pauses]
    scope: _ScopeArgs = {"portfolio_ids": portfolio_ids}
    return {
        "generated_at": now.isoformat(),
        "paused": any(p["portfolio_id"] is None for p in pauses),
        "pauses": [
            {"portfolio_id": p["portfolio_id"], "reason": p["reason"], "since": p["paused_at"].isoformat()}
            for p in pauses
        ],
        **jobs_overview(now=now, sweep=sweep, **scope),
        "throughput": throughput(now=now, **scope),
        "retries_by_category": retries_by_category(sweep=sweep, **scope),
        "dead_letters": dead_letter_figures(now=now, **scope),
        "fairness": portfolio_fairness(now=now, sweep=sweep, **scope),
        "retention_debt": retention_debt_cached(now=now, **scope),
        "limits": effective_limits(),
    }
