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
from django.utils import timezone

from cleanup_ops import sql
from cleanup_ops.dispatch import dispatch_after_commit
from cleanup_ops.models import CleanupJob, Sweep
from properties.models import Portfolio
from retention.eligibility import count_expired_and_held, db_datetime
from retention.models import PolicyVersion
from retention.registry import get_spec


def job_key(sweep: Sweep, portfolio_id: int, property_id: int, record_kind: str) -> str:
    return f"{sweep.key}:{portfolio_id}:{property_id}:{record_kind}"


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
    """Every (portfolio, property, kind) with at least one row past its cutoff.

    Held rows count: such a partition still gets a job, which then ends with
    the outcome ``held`` and so shows up in the sweep's report.
    """
    partitions: list[Partition] = []
    for version in _active_versions():
        kind = version.policy.record_kind
        spec = get_spec(kind)
        cutoff = slot - timedelta(days=version.retention_days)
        rows = sql.execute(
            sql.properties_with_expired_rows(table=spec.table, timestamp_column=spec.timestamp_column),
            [version.policy.portfolio_id, db_datetime(cutoff)],
        )
        partitions.extend(
            Partition(version.policy.portfolio_id, property_id, kind, version, cutoff) for (property_id,) in rows
        )
    return partitions


def sweep_admit(*, sweep_id: int, now: datetime | None = None) -> int:
    """Admit the sweep's jobs if it is still admitting; returns jobs inserted now."""
    now = now or timezone.now()
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
        if sweep.status != Sweep.Status.ADMITTING:
            return 0
        open_elsewhere = set(
            # Only delete jobs: an open purge job (say, waiting on the document
            # store's Retry-After) must not hold back the partition's next delete.
            CleanupJob.objects.open()
            .deletes()
            .exclude(sweep_id=sweep.pk)
            .values_list("portfolio_id", "property_id", "record_kind")
        )
        jobs, carried_over = [], 0
        for part in partitions_due(slot=sweep.slot):
            if (part.portfolio_id, part.property_id, part.record_kind) in open_elsewhere:
                carried_over += 1
                continue
            jobs.append(
                CleanupJob(
                    sweep=sweep,
                    key=job_key(sweep, part.portfolio_id, part.property_id, part.record_kind),
                    portfolio_id=part.portfolio_id,
                    property_id=part.property_id,
                    record_kind=part.record_kind,
                    policy_version=part.version,
                    cutoff=part.cutoff,
                    available_at=now,
                )
            )
        before = CleanupJob.objects.filter(sweep=sweep).count()
        CleanupJob.objects.bulk_create(jobs, batch_size=2000, ignore_conflicts=True)
        admitted = CleanupJob.objects.filter(sweep=sweep).count()
        sweep.jobs_admitted = admitted
        sweep.carried_over = carried_over
        sweep.status = Sweep.Status.RUNNING if admitted else Sweep.Status.DRAINED
        sweep.admitted_at = now
        sweep.finished_at = None if admitted else now
        sweep.save(update_fields=["jobs_admitted", "carried_over", "status", "admitted_at", "finished_at"])
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
    if portfolio_id is not None and not Portfolio.objects.filter(pk=portfolio_id).exists():
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
