"""ADMISSION: which partitions of a sweep get a job.

``sweep_admit`` locks the sweep row and, only while the sweep is still
``admitting``, inserts one job per partition (portfolio, property, record
kind) with at least one row past the cutoff of the portfolio's active policy
version. Job keys are stable (``<sweep key>:<portfolio>:<property>:<kind>``)
and inserted with ``ON CONFLICT DO NOTHING``, so a crashed admission is
completed by the next trigger without duplicates. A partition that still has
an open delete job from an earlier sweep is skipped and counted as carried
over (never two delete jobs for one partition). Jobs reach django-q2 only
after the admitting transaction commits (the dispatcher is woken on commit).

``sweep_preview`` is the dry run: per portfolio and kind, rows eligible and
rows held, writing nothing — and, for a kind whose property is a one-hop
path, the rows past the cutoff whose path is NULL (``unreachable``: in no
partition, so never deleted; reported, not kept in silence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from psycopg import sql as pg

from cleanup_ops import clock, sql
from cleanup_ops.dispatch import dispatch_after_commit
from cleanup_ops.lifecycle import OPEN_STATES
from cleanup_ops.models import CleanupJob, JobKind, JobState, Sweep
from retention.domain import portfolio_model
from retention.eligibility import count_expired_and_held, count_unreachable, db_datetime
from retention.models import PolicyVersion
from retention.registry import REGISTRY, RecordKindSpec


@dataclass
class Partition:
    portfolio_id: int
    property_id: int | None  # None: a kind without a property
    record_kind: str
    version: PolicyVersion
    cutoff: datetime


def _active_versions() -> list[PolicyVersion]:
    return list(
        PolicyVersion.objects.in_force()
        .select_related("policy")
        .order_by("policy__portfolio_id", "policy__record_kind")
    )


def _slot_minus_retention() -> pg.SQL:
    """A partition's cutoff: the slot (a parameter) minus the version's retention days."""
    return pg.SQL("(CAST(%s AS timestamptz) - v.retention_days * INTERVAL '1 day')")


def _partitions_due(spec: RecordKindSpec) -> tuple[pg.Composed, pg.Composed]:
    """(CTE, WHERE) of the partitions of one kind due at a slot: every
    property of a portfolio whose active, enabled version of the kind's policy
    has a cutoff some row of the property is older than. Held rows count: such
    a partition still gets a job, which ends ``held`` and so shows in the
    sweep's report. Parameters: slot, kind."""
    if not spec.has_property:
        # A kind without a property: the partition is the portfolio.
        template = """
            WITH due AS (
                SELECT po.{portfolio_pk} AS portfolio_id, CAST(NULL AS {property_key}) AS property_id,
                    v.id AS version_id, {cutoff} AS cutoff
                FROM {portfolio} po
                JOIN {policy} rp ON rp.portfolio_id = po.{portfolio_pk} AND rp.record_kind = %s
                JOIN {version} v ON v.policy_id = rp.id AND v.status = {approved} AND v.enabled
            )
        """
    else:
        template = """
            WITH due AS (
                SELECT p.{property_portfolio} AS portfolio_id, p.{property_pk} AS property_id,
                    v.id AS version_id, {cutoff} AS cutoff
                FROM {property} p
                JOIN {policy} rp ON rp.portfolio_id = p.{property_portfolio} AND rp.record_kind = %s
                JOIN {version} v ON v.policy_id = rp.id AND v.status = {approved} AND v.enabled
            )
        """
    cte = sql.composed(
        template,
        cutoff=_slot_minus_retention(),
        approved=pg.Literal(PolicyVersion.Status.APPROVED.value),
        property_key=pg.SQL(sql.PROPERTY_KEY),
    )
    where = sql.composed(
        "EXISTS (SELECT 1 FROM {table} r WHERE {partition} AND r.{ts} < {cutoff})",
        table=sql.ident(spec.table),
        partition=spec.in_partition("r", property_sql=pg.SQL("d.property_id"), portfolio_sql=pg.SQL("d.portfolio_id")),
        ts=sql.ident(spec.timestamp_column),
        cutoff=spec.cutoff_sql(pg.SQL("d.cutoff")),
    )
    return cte, where


def _open_elsewhere(spec: RecordKindSpec) -> pg.Composed:
    """An open delete job of the same partition in another sweep (parameters: kind, sweep id)."""
    return sql.composed(
        """
        EXISTS (
            SELECT 1 FROM {job} o
            WHERE o.portfolio_id = d.portfolio_id AND {same_property}
                AND o.record_kind = %s AND o.state IN ({states}) AND o.job_kind = {delete} AND o.sweep_id <> %s
        )
        """,
        same_property=pg.SQL("o.property_id = d.property_id" if spec.has_property else "o.property_id IS NULL"),
        states=pg.SQL(", ").join(pg.Literal(state) for state in OPEN_STATES),
        delete=pg.Literal(JobKind.DELETE.value),
    )


def _partitions_due_sql(spec: RecordKindSpec) -> pg.Composed:
    """(portfolio id, property id, version id, cutoff) of one kind; parameters: slot, kind."""
    cte, where = _partitions_due(spec)
    return sql.composed(
        """
        {cte}
        SELECT d.portfolio_id, d.property_id, d.version_id, d.cutoff FROM due d WHERE {where}
        ORDER BY d.portfolio_id, d.property_id
        """,
        cte=cte,
        where=where,
    )


def _admit_partitions(spec: RecordKindSpec) -> pg.Composed:
    """One job per due partition of one kind with no open delete job elsewhere,
    in one set-based INSERT … SELECT; a key that exists (a crashed admission
    being completed) is skipped. Ten parameters, in this order: slot, kind
    (the policy's), sweep id, key prefix (the sweep's key), kind (the key's
    last part), kind (the job's ``record_kind``), available at, created at,
    then kind and sweep id (for the open-elsewhere test)."""
    cte, where = _partitions_due(spec)
    # No conflict target: an existing key (a crashed admission being
    # completed) and an open job of the partition admitted concurrently by
    # another sweep (the partial unique index) are both skipped.
    return sql.composed(
        """
        {cte}
        INSERT INTO {job} (sweep_id, key, job_kind, portfolio_id, property_id, record_kind, policy_version_id,
            cutoff, state, outcome, available_at, lease_owner, leases, attempt, last_error_category,
            last_error_class, cursor, batches, rows_deleted, rows_held, created_at)
        SELECT CAST(%s AS bigint),
            CAST(%s AS varchar) || ':' || d.portfolio_id || ':' || {key_property} || ':' || CAST(%s AS varchar),
            {delete}, d.portfolio_id, d.property_id, CAST(%s AS varchar), d.version_id, d.cutoff,
            {pending}, '', CAST(%s AS timestamptz), '', 0, 0, '', '', 0, 0, 0, 0, CAST(%s AS timestamptz)
        FROM due d WHERE {where} AND NOT {open_elsewhere} ORDER BY d.portfolio_id, d.property_id
        ON CONFLICT DO NOTHING
        """,
        cte=cte,
        where=where,
        open_elsewhere=_open_elsewhere(spec),
        # Without a property the key's property part is "-": <sweep>:<portfolio>:-:<kind>.
        key_property=pg.SQL("d.property_id") if spec.has_property else pg.Literal("-"),
        delete=pg.Literal(JobKind.DELETE.value),
        pending=pg.Literal(JobState.PENDING.value),
    )


def _count_carried_over(spec: RecordKindSpec) -> pg.Composed:
    """Due partitions of one kind skipped because a delete job of theirs is
    still open in another sweep. Parameters: slot, kind, kind, sweep id."""
    cte, where = _partitions_due(spec)
    return sql.composed(
        "{cte} SELECT COUNT(*) FROM due d WHERE {where} AND {open_elsewhere}",
        cte=cte,
        where=where,
        open_elsewhere=_open_elsewhere(spec),
    )


def _kinds_in_force() -> list[tuple[str, RecordKindSpec]]:
    """The registered kinds some portfolio has a version in force of.

    A kind without one has no due partition, so the dry run and the admission
    send no statement over its table: each would be planned over every table
    partition of that table (7.6 ms a plan over tenant activity's ~180), for
    nothing."""
    active = set(PolicyVersion.objects.in_force().values_list("policy__record_kind", flat=True))
    return [(kind, spec) for kind, spec in REGISTRY.items() if kind in active]


def partitions_due(*, slot: datetime) -> list[Partition]:
    """Every (portfolio, property, kind) with at least one row past its cutoff
    (the rule is ``_partitions_due_sql``, the same the admission inserts by)."""
    rows: list[tuple[int, int, str, int, object]] = []
    for kind, spec in _kinds_in_force():
        statement = _partitions_due_sql(spec)
        rows += [
            (pf, prop, kind, vid, cutoff) for pf, prop, vid, cutoff in sql.execute(statement, [db_datetime(slot), kind])
        ]
    versions = PolicyVersion.objects.in_bulk({row[3] for row in rows})
    return [
        Partition(pf, prop, kind, versions[vid], slot - timedelta(days=versions[vid].retention_days))
        for pf, prop, kind, vid, _ in rows
    ]


def sweep_admit(*, sweep_id: int, now: datetime | None = None) -> int:
    """Admit the sweep's jobs if it is still admitting; returns jobs inserted now.

    Per record kind, one ``INSERT … SELECT`` adds a job for every due
    partition that has no open delete job in another sweep (an open purge job
    does not hold back the partition's next delete), and one count says how
    many were carried over instead; only for the kinds in force
    (``_kinds_in_force``).
    """
    now = now or clock.now()
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
        if sweep.status != Sweep.Status.ADMITTING:
            return 0
        before = CleanupJob.objects.filter(sweep=sweep).count()
        carried_over = 0
        slot = db_datetime(sweep.slot)
        for kind, spec in _kinds_in_force():
            sql.execute(
                _admit_partitions(spec),
                [slot, kind, sweep.pk, sweep.key, kind, kind, db_datetime(now), db_datetime(now), kind, sweep.pk],
            )
            carried_over += sql.execute(_count_carried_over(spec), [slot, kind, kind, sweep.pk])[0][0]
        admitted = CleanupJob.objects.filter(sweep=sweep).count()
        sweep.mark_admitted(jobs=admitted, carried_over=carried_over, at=now)
        dispatch_after_commit()
    return admitted - before


@dataclass
class DryRunRow:
    portfolio_id: int
    record_kind: str
    retention_days: int
    cutoff: datetime
    expired: int
    held: int
    # Past the cutoff but in no partition (a one-hop path that is NULL): never deleted, reported.
    unreachable: int = 0

    @property
    def eligible(self) -> int:
        return self.expired - self.held


@dataclass
class DryRun:
    slot: datetime
    rows: list[DryRunRow] = field(default_factory=list)


def sweep_preview(*, slot: datetime, portfolio_id: int | None = None) -> DryRun:
    """Per portfolio and record kind: rows eligible and rows held. Writes nothing."""
    if portfolio_id is not None and not portfolio_model()._default_manager.filter(pk=portfolio_id).exists():
        raise ValueError(f"portfolio: no portfolio with id {portfolio_id}")
    result = DryRun(slot=slot)
    for version in _active_versions():
        if portfolio_id is not None and version.policy.portfolio_id != portfolio_id:
            continue
        cutoff = slot - timedelta(days=version.retention_days)
        expired, held = count_expired_and_held(
            version.policy.record_kind, cutoff=cutoff, portfolio_id=version.policy.portfolio_id
        )
        unreachable = count_unreachable(
            version.policy.record_kind, portfolio_id=version.policy.portfolio_id, cutoff=cutoff
        )
        result.rows.append(
            DryRunRow(
                version.policy.portfolio_id,
                version.policy.record_kind,
                version.retention_days,
                cutoff,
                expired,
                held,
                unreachable,
            )
        )
    return result
