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
rows held, writing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction

from cleanup_ops import clock, sql
from cleanup_ops.dispatch import dispatch_after_commit
from cleanup_ops.models import CleanupJob, Sweep
from retention.domain import portfolio_model
from retention.eligibility import count_expired_and_held, db_datetime
from retention.models import PolicyVersion
from retention.registry import REGISTRY


@dataclass
class Partition:
    portfolio_id: int
    property_id: int
    record_kind: str
    version: PolicyVersion
    cutoff: datetime


def _active_versions() -> list[PolicyVersion]:
    return list(
        PolicyVersion.objects.filter(status=PolicyVersion.Status.APPROVED, enabled=True)
        .select_related("policy")
        .order_by("policy__portfolio_id", "policy__record_kind")
    )


def partitions_due(*, slot: datetime) -> list[Partition]:
    """Every (portfolio, property, kind) with at least one row past its cutoff
    (the rule is ``sql.partitions_due``, the same the admission inserts by)."""
    rows: list[tuple[int, int, str, int, object]] = []
    for kind, spec in REGISTRY.items():
        statement = sql.partitions_due(spec)
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
    many were carried over instead.
    """
    now = now or clock.now()
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
        if sweep.status != Sweep.Status.ADMITTING:
            return 0
        before = CleanupJob.objects.filter(sweep=sweep).count()
        carried_over = 0
        slot = db_datetime(sweep.slot)
        for kind, spec in REGISTRY.items():
            sql.execute(
                sql.admit_partitions(spec),
                [slot, kind, sweep.pk, sweep.key, kind, kind, db_datetime(now), db_datetime(now), kind, sweep.pk],
            )
            carried_over += sql.execute(sql.count_carried_over(spec), [slot, kind, kind, sweep.pk])[0][0]
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
        result.rows.append(
            DryRunRow(
                version.policy.portfolio_id, version.policy.record_kind, version.retention_days, cutoff, expired, held
            )
        )
    return result
