"""The batch transaction: one keyset slice of a delete job, applied exactly once.

Protocol of ``run_batch`` (one database transaction; see
``docs/architecture.md``, "The execution protocol"):

a. Lock the job row where the lease token is ours and not expired
   (``leases.lock_job``, the fence): a worker whose lease expired commits
   nothing.
b. Lock the portfolio and property rows ``FOR SHARE``. Placing a legal hold
   locks one of them ``FOR UPDATE``, so the DELETE below either sees the
   committed hold or commits before the hold exists (the hold race). A missing
   row ends the job as ``scope_missing``.
c. Read the active policy version: none or withdrawn ends the job as
   ``policy_withdrawn``; otherwise the cutoff is the earlier (stricter) of the
   admitted one and the current one.
d. Compute the operation id from (kind, property, cutoff, cursor, limit). If
   the ledger already has it, move the cursor to that row's ``last_id`` and
   stop (replay: redelivery, lost ack, redrive from an earlier cursor).
e. Take the next ``limit`` candidate ids after the cursor, DELETE those the
   eligibility predicate admits (the hold check is inside the statement),
   insert the ledger row, advance the cursor past every candidate (held ones
   too) and renew the lease.
f. Outbox: for record kinds with attachments the DELETE returns the deleted
   rows' document ids; when there are any, the same transaction writes one
   ``PurgeRequest`` (key = the operation id) and one ``purge`` job. A held or
   replayed batch deletes nothing and so purges nothing; a rolled-back batch
   takes its outbox rows with it.

A batch with fewer candidates than the limit (or none) was the last one: the
job is done with its outcome in that same transaction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from cleanup_ops import sql
from cleanup_ops.downstream.urls import document_id_valid
from cleanup_ops.execution.leases import Lease, job_finish, lease_renewal, lock_job
from cleanup_ops.models import CleanupJob, JobKind, JobOutcome, PurgeRequest, scope_of
from retention.eligibility import db_datetime, eligible_sql
from retention.models import PolicyVersion
from retention.registry import get_spec


@dataclass
class JobRef:
    """What a slice needs of its job, read once per lease (no model instance)."""

    id: int
    portfolio_id: int
    property_id: int
    record_kind: str
    cutoff: datetime
    policy_version_id: int
    slot: datetime
    sweep_id: int
    kind: str
    purge_request_id: int | None


def job_load(job_id: int) -> JobRef:
    row = CleanupJob.objects.filter(pk=job_id).values_list(
        "id",
        "portfolio_id",
        "property_id",
        "record_kind",
        "cutoff",
        "policy_version_id",
        "sweep__slot",
        "sweep_id",
        "kind",
        "purge_request_id",
    )[0]
    return JobRef(*row)


def operation_id(*, record_kind: str, property_id: int, cutoff: datetime, after_id: int, limit: int) -> str:
    stamp = cutoff.astimezone(UTC).isoformat().replace("+00:00", "Z")
    raw = f"retention:{record_kind}:{property_id}:{stamp}:{after_id}:{limit}"
    return hashlib.sha256(raw.encode()).hexdigest()


def _lock_scope_and_policy(cur, job: JobRef) -> tuple[bool, tuple[int, int, bool] | None]:  # type: ignore[no-untyped-def]
    """(scope exists, (version id, retention days, enabled) or None)."""
    row = sql.execute(
        sql.scope_lock_and_policy(),
        [job.record_kind, PolicyVersion.Status.APPROVED, job.property_id, job.portfolio_id],
        cur=cur,
    ).fetchone()
    if row is None:
        return False, None
    if row[1] is None:
        return True, None
    return True, (int(row[1]), int(row[2]), bool(row[3]))


def outcome_of(rows_deleted: int, rows_held: int) -> str:
    if rows_deleted:
        return JobOutcome.DELETED
    return JobOutcome.HELD if rows_held else JobOutcome.NOTHING_ELIGIBLE


def run_batch(*, job: JobRef, lease: Lease, limit: int, now: datetime | None = None) -> tuple[int, str]:
    """One batch in one transaction. Returns (rows deleted, outcome if the job finished)."""
    now = now or timezone.now()
    spec = get_spec(job.record_kind)
    with transaction.atomic(), connection.cursor() as cur:
        after_id = lock_job(cur, job_id=job.id, lease=lease, now=now)
        scope_exists, active = _lock_scope_and_policy(cur, job)
        if not scope_exists:
            job_finish(cur, job_id=job.id, outcome=JobOutcome.SCOPE_MISSING, now=now)
            return 0, JobOutcome.SCOPE_MISSING
        if active is None or not active[2]:
            job_finish(cur, job_id=job.id, outcome=JobOutcome.POLICY_WITHDRAWN, now=now)
            return 0, JobOutcome.POLICY_WITHDRAWN
        active_id, active_days, _ = active
        current_cutoff = job.slot - timedelta(days=active_days)
        cutoff, version_id = (
            (current_cutoff, active_id) if current_cutoff < job.cutoff else (job.cutoff, job.policy_version_id)
        )
        op_id = operation_id(
            record_kind=job.record_kind, property_id=job.property_id, cutoff=cutoff, after_id=after_id, limit=limit
        )
        replay_last_id, candidates, last_id = sql.execute(
            sql.batch_replay_and_candidates(table=spec.table, timestamp_column=spec.timestamp_column),
            [op_id, job.property_id, after_id, db_datetime(cutoff), limit],
            cur=cur,
        ).fetchone()
        renew = lease_renewal(now)
        if replay_last_id is not None:
            # Already applied (by this job before a lost ack, or by the job a
            # redrive replaced): skip it, never apply it twice.
            sql.execute(sql.job_skip_replayed(), [max(after_id, int(replay_last_id)), renew, job.id], cur=cur)
            return 0, ""
        if not candidates:
            outcome = outcome_of(*CleanupJob.objects.filter(pk=job.id).values_list("rows_deleted", "rows_held")[0])
            job_finish(cur, job_id=job.id, outcome=outcome, now=now)
            return 0, outcome
        predicate, params = eligible_sql(job.record_kind, cutoff=cutoff, alias=spec.table)
        attachment = attachment_column(job.record_kind)
        sql.execute(
            sql.batch_delete(table=spec.table, predicate=predicate, returning=attachment),
            [job.property_id, after_id, last_id, *params],
            cur=cur,
        )
        if attachment:
            returned = cur.fetchall()
            deleted = len(returned)
            documents = [row[0] for row in returned if row[0]]
        else:
            deleted, documents = cur.rowcount, []
        sql.execute(
            sql.ledger_insert(),
            [
                op_id,
                job.id,
                job.portfolio_id,
                job.property_id,
                job.record_kind,
                version_id,
                db_datetime(cutoff),
                after_id,
                last_id,
                limit,
                candidates,
                deleted,
                db_datetime(now),
            ],
            cur=cur,
        )
        total_deleted, total_held = sql.execute(
            sql.job_advance(), [last_id, deleted, max(0, candidates - deleted), renew, job.id], cur=cur
        ).fetchone()
        outcome = ""
        if candidates < limit:
            # A short batch was the last one: finish now instead of paying for
            # an empty batch. Rows that become eligible later (inserted with
            # old timestamps after this point) are the next sweep's work.
            outcome = outcome_of(total_deleted, total_held)
            job_finish(cur, job_id=job.id, outcome=outcome, now=now)
        if documents:
            purge_outbox_write(job=job, operation=op_id, document_ids=documents, now=now)
    return deleted, outcome


_ATTACHMENTS: dict[str, str | None] = {}


def attachment_column(kind: str) -> str | None:
    """The document id column of a record kind, or None when it has no attachments."""
    if kind not in _ATTACHMENTS:
        model = get_spec(kind).model
        field = next((f for f in model._meta.concrete_fields if f.name == "document_id"), None)
        _ATTACHMENTS[kind] = field.column if field is not None else None
    return _ATTACHMENTS[kind]


def purge_outbox_write(*, job: JobRef, operation: str, document_ids: list[str], now: datetime) -> CleanupJob:
    """The outbox rows of one applied batch: a ``PurgeRequest`` and its ``purge`` job.

    Called inside the batch's transaction. Ids that are not plain identifiers
    are counted, never stored (see ``PurgeRequest``).
    """
    valid = list(dict.fromkeys(d for d in document_ids if document_id_valid(d)))
    invalid = sum(1 for d in document_ids if not document_id_valid(d))
    scope = scope_of(job)
    request = PurgeRequest.objects.create(
        key=operation,
        delete_job_id=job.id,
        portfolio_id=scope["portfolio_id"],
        property_id=scope["property_id"],
        record_kind=scope["record_kind"],
        document_ids=valid,
        invalid_ids=invalid,
        created_at=now,
    )
    return CleanupJob.objects.create(
        sweep_id=job.sweep_id,
        key=f"purge:{operation}",
        kind=JobKind.PURGE,
        purge_request=request,
        cutoff=job.cutoff,
        available_at=now,
        **scope,
    )
