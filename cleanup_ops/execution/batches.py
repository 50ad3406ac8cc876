"""The batch transaction: keyset slices of one or many delete jobs, each applied exactly once.

Protocol of ``run_group_batch`` (one database transaction over the leased
jobs of a group; ``run_batch`` is a group of one; see ``docs/architecture.md``,
"Lock, then read" and "One batch, one transaction"):

a. **Fence and scope, one statement** (``statements.group_fence_scopes_and_policies``):
   the job rows ``FOR UPDATE`` where the lease token is ours and not expired
   (on the database's clock, ``cleanup_ops.clock``) — jobs whose lease is lost
   drop out and are reported, ``LeaseLost`` only when none is left — then the
   portfolio and property rows ``FOR SHARE``. Placing a legal hold or
   approving a version locks one of them ``FOR UPDATE``, so nothing below
   can be changed under the batch by either. A missing scope ends the job as
   ``scope_missing``.
b. **Policy, after the locks** (``statements.policies_and_ledger_lookup``): the
   active version read by a statement that starts once every lock is held;
   the first statement's reading is only the guess the replay lookup is made
   with (looked up again when the two differ). None or withdrawn ends the job
   as ``policy_withdrawn``; otherwise the cutoff is the earlier (stricter) of
   the admitted one and the current one.
c. **Replay**: the operation id from (kind, property, slot, cutoff, cursor,
   limit). If the ledger already has it, move the cursor to that row's
   ``last_id`` (redelivery, lost ack, redrive from an earlier cursor).
d. **Delete**: the next ``limit`` candidate ids after the cursor; a DELETE of
   those the eligibility predicate admits that also re-tests property and
   portfolio (a row the application moved while the DELETE waited for it is
   judged as it is now). The same statement counts, in its own snapshot, the
   rows of the range (so deleted never exceeds candidates) and those an
   active hold covers (the ledger's held: never candidates minus deleted).
   Partitions are taken in order while their candidates fit in one
   transaction's rows; the others wait, still leased, for the next one.
e. **Ledger and cursor**: insert the ledger rows, advance the cursors past
   every candidate (held ones too) and renew the lease, in one statement.
f. **Outbox**: for record kinds with attachments the DELETE returns the
   deleted rows' document ids; the same transaction takes each document's
   disposition row (``sql.dispositions_take``: a purge deciding about that
   document waits for this commit, or this batch for its decision) and writes
   one ``PurgeRequest`` (key = the operation id), one ``purge`` job and one
   ``DeletedAttachment`` per record. A held or replayed batch deletes nothing
   and so purges nothing; a rolled-back batch takes its outbox rows with it.

A batch with fewer candidates than the limit (or none) was the last one: the
job is done with its outcome in that same transaction, and so is its sweep
when no job of it is left open (``sweeps.sweep_mark_drained_if_finished``).
Checkpoints (``cleanup_ops.checkpoints``) mark the steps for the
interleaving tests.

A kind whose key is not an integer (``retention.registry``, "Keys") carries
its cursor as text: after the fence, one statement reads the text cursors of
such jobs (their rows are already locked by it), and before the commit one
writes them (``statements.jobs_cursor_keys``/``jobs_cursor_keys_set``); their ledger
rows take the range as ``after_key``/``last_key``. A kind without a property
is partitioned by its portfolio: its rows in a group are told apart by the
portfolio, not the property.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from cleanup_ops import clock, sql
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.downstream import stores
from cleanup_ops.execution import statements
from cleanup_ops.execution.leases import JobLease, lease_renewal, token_param
from cleanup_ops.lifecycle import JobAdvance, after_batch
from cleanup_ops.models import (
    CleanupJob,
    DeletedAttachment,
    DispositionState,
    JobKind,
    JobOutcome,
    JobState,
    PurgeRequest,
    scope_of,
)
from cleanup_ops.recovery.classification import LeaseLost
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from retention.conf import MAX_BATCH_SIZE
from retention.eligibility import db_datetime, eligible_sql_for
from retention.models import PolicyVersion
from retention.registry import REGISTRY, get_spec


@dataclass
class JobRef:
    """What a slice needs of its job, read once per lease (no model instance)."""

    id: int
    portfolio_id: int
    property_id: int | None  # None: a kind without a property (the partition is the portfolio)
    record_kind: str
    cutoff: datetime
    policy_version_id: int
    slot: datetime
    sweep_id: int
    job_kind: str
    purge_request_id: int | None


_JOB_FIELDS = (
    "id",
    "portfolio_id",
    "property_id",
    "record_kind",
    "cutoff",
    "policy_version_id",
    "sweep__slot",
    "sweep_id",
    "job_kind",
    "purge_request_id",
)


def job_load(job_id: int) -> JobRef:
    return JobRef(*CleanupJob.objects.filter(pk=job_id).values_list(*_JOB_FIELDS)[0])


def jobs_load(job_ids: list[int]) -> dict[int, JobRef]:
    """Several jobs in one query."""
    rows = CleanupJob.objects.filter(pk__in=job_ids).values_list(*_JOB_FIELDS)
    return {row[0]: JobRef(*row) for row in rows}


Key = int | str  # a cursor: an integer key, or a non-integer one's text ("" before the first)


def operation_partition(*, property_id: int | None, portfolio_id: int) -> str:
    """The partition's part of an operation id: the property id, or
    ``portfolio-<id>`` for a kind without a property (two portfolios'
    batches must never share an operation id)."""
    return str(property_id) if property_id is not None else f"portfolio-{portfolio_id}"


def operation_id(
    *, record_kind: str, property_id: int | str, slot: datetime, cutoff: datetime, after_id: Key, limit: int
) -> str:
    """sha256 of ``retention:<kind>:<property>:<slot>:<cutoff>:<after_id>:<limit>`` (RFC 3339 UTC).

    ``property_id`` is ``operation_partition``'s; ``after_id`` the cursor as
    carried (a non-integer key's text, "" for the first batch).

    The slot is in it so that a later sweep whose cutoff happens to equal an
    earlier one's (a policy shortened by exactly the time between the slots)
    never replays the earlier sweep's ledger rows; a redrive (same sweep)
    replays them as it should.
    """

    def stamp(value: datetime) -> str:
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")

    raw = f"retention:{record_kind}:{property_id}:{stamp(slot)}:{stamp(cutoff)}:{after_id}:{limit}"
    return hashlib.sha256(raw.encode()).hexdigest()


# Up to this many partitions of one kind count their candidates with one
# statement each (planned with their own values: the keyset walk); more share
# the lateral statement (one round trip, a generic plan).
GROUP_STATEMENT_FROM = 4


@dataclass
class PartitionStep:
    """What one batch transaction did for one job of its group."""

    job_id: int
    deleted: int = 0
    outcome: str = ""  # set when the job finished in this transaction
    applied: bool = False  # a ledger row was written or replayed, or the job finished
    lost: bool = False  # our lease on it is gone: nothing was written for it
    full: bool = False  # a full batch of candidates: a large partition, more to come


@dataclass
class _Work:
    job: JobRef
    after_id: Key
    cutoff: datetime
    version_id: int
    limit: int = MAX_BATCH_SIZE  # this partition's batch size
    operation: str = ""
    candidates: int = 0  # counted to choose the range: (after_id, last_id]
    last_id: Key | None = None
    counted: bool = False
    # The candidates' ids (PostgreSQL): what the group DELETE deletes from.
    ids: list[Any] | None = None
    # What the ledger says: the candidates, and of those the ones a hold
    # covers, counted in the DELETE's own snapshot.
    in_range: int = 0
    held: int = 0


def run_batch(
    *, job: JobRef, lease: JobLease, limit: int | None = None, now: datetime | None = None
) -> tuple[int, str]:
    """One batch of one job in one transaction. Returns (rows deleted, outcome if the job finished)."""
    step = run_group_batch(jobs=[job], lease=lease, limit=limit, now=now)[job.id]
    return step.deleted, step.outcome


def run_group_batch(
    *, jobs: list[JobRef], lease: JobLease, limit: int | None = None, now: datetime | None = None
) -> dict[int, PartitionStep]:
    """One batch transaction over the leased ``jobs`` (one or many partitions).

    Each partition keeps its own operation id, cursor and ledger row, exactly
    as if it ran alone, and its own batch size: its active policy version's
    (read in the policy step, so an approved change applies from the next
    batch on — a new operation id, since the limit is part of it) within the
    deployment's ceiling ``CLEANUP_BATCH_SIZE``, or ``limit`` when a caller
    (a test, a benchmark) fixes it. The transaction
    takes partitions in the given order while their candidates fit in one
    transaction's rows (``limit``, else ``CLEANUP_BATCH_SIZE``; the first
    always goes, so a large partition runs alone). Partitions left out are
    untouched and stay leased for the next transaction. Raises ``LeaseLost``
    only when the lease is lost on every job; otherwise lost ones are
    reported and skipped.
    """
    now = now or clock.now()
    budget = limit or settings.CLEANUP_BATCH_SIZE
    steps = {job.id: PartitionStep(job.id) for job in jobs}
    renew = lease_renewal(now)
    with transaction.atomic(), connection.cursor() as cur:
        # Steps a (fence) and b-c (scope locks, policy) in one statement.
        fenced, policies = _fence_scopes_and_policies(cur, jobs=jobs, lease=lease, now=now)
        keyed = {job.id for job in jobs if job.id in fenced and _text_key(job.record_kind)}
        if keyed:
            _read_cursor_keys(cur, fenced, sorted(keyed))
        cursor_keys: dict[int, str] = {}
        for job in jobs:
            steps[job.id].lost = job.id not in fenced
        live = [job for job in jobs if job.id in fenced]
        updates: list[JobAdvance] = []

        def advance(job_id: int, **change: Any) -> None:
            cursor, deleted, held = fenced[job_id]
            new_cursor = change.pop("new_cursor", cursor)
            if job_id in keyed:
                # The text cursor is written by its own statement; the bigint stays 0.
                cursor_keys[job_id], new_cursor = str(new_cursor), 0
            updates.append(after_batch(job_id=job_id, totals=(deleted, held), new_cursor=int(new_cursor), **change))

        checkpoint("batch.after_fence")
        # The first statement's reading of the policies is only a guess: it
        # may have waited for a scope lock with an older snapshot. The
        # decision is the second statement's reading (lock, then read).
        scoped = [job for job in live if job.id in policies]
        guessed = [_plan(job, fenced[job.id][0], policies[job.id], limit, budget) for job in scoped]
        guessed_ops = {item.operation for item in guessed if item is not None}
        current, replayed = _policies_and_replayed(cur, scoped, sorted(guessed_ops))
        checkpoint("batch.after_policy")
        work: list[_Work] = []
        for job in live:
            if job.id not in policies:
                advance(job.id, finish=True, fixed_outcome=JobOutcome.SCOPE_MISSING)
                continue
            item = _plan(job, fenced[job.id][0], current[job.id], limit, budget)
            if item is None:
                advance(job.id, finish=True, fixed_outcome=JobOutcome.POLICY_WITHDRAWN)
                continue
            work.append(item)
        unseen = [item.operation for item in work if item.operation not in guessed_ops]
        if unseen:
            # A version approved while the fence waited: its operations were not looked up yet.
            replayed |= _replayed_operations(cur, unseen)
        replayed_keyed = [item.operation for item in work if item.job.id in keyed and item.operation in replayed]
        if replayed_keyed:
            replayed |= _replayed_last_keys(cur, replayed_keyed)
        fresh = []
        for item in work:
            if item.operation in replayed:
                # Already applied (by this job before a lost ack, or by the job a
                # redrive replaced): skip it, never apply it twice.
                advance(item.job.id, new_cursor=max(item.after_id, replayed[item.operation]), finish=False)
            else:
                fresh.append(item)
        checkpoint("batch.before_delete")
        chosen, taken = [], 0
        deleted_by_job: dict[int, int] = {}
        documents: dict[int, list[tuple[str, Key]]] = {}
        rest = fresh
        if fresh and sql.is_postgres() and len(fresh) <= GROUP_STATEMENT_FROM:
            # The first partition always goes: its candidates and its DELETE
            # in one statement (alone, a large partition's next batch, that is
            # the whole transaction's data work).
            first, rest = fresh[0], fresh[1:]
            deleted_by_job, documents = _count_and_delete_alone(cur, first)
            chosen, taken = [first], first.candidates
            if taken >= budget:
                rest = []
        _count_candidates(cur, rest, budget=budget - taken)
        to_delete = []
        for item in rest:
            if not item.counted or (item.candidates and chosen and taken + item.candidates > budget):
                continue  # next transaction: this one is full
            taken += item.candidates
            chosen.append(item)
            if item.candidates:
                to_delete.append(item)
        more_deleted, more_documents = _delete(cur, to_delete)
        deleted_by_job |= more_deleted
        documents |= more_documents
        ledger = []
        for item in chosen:
            job = item.job
            if not item.candidates:
                # Nothing left past the cutoff: done, outcome from the totals.
                advance(job.id, finish=True, batch_size=item.limit)
                continue
            deleted = deleted_by_job.get(job.id, 0)
            steps[job.id].deleted = deleted
            steps[job.id].full = item.candidates >= item.limit
            text_key = job.id in keyed
            ledger.append(
                {
                    "operation_id": item.operation,
                    "job_id": job.id,
                    "portfolio_id": job.portfolio_id,
                    "property_id": job.property_id,
                    "record_kind": job.record_kind,
                    "policy_version_id": item.version_id,
                    "cutoff": db_datetime(item.cutoff),
                    "after_id": 0 if text_key else item.after_id,
                    "last_id": 0 if text_key else item.last_id,
                    "after_key": str(item.after_id) if text_key else "",
                    "last_key": str(item.last_id) if text_key else "",
                    "batch_limit": item.limit,
                    "candidates": item.in_range,
                    "rows_deleted": deleted,
                    "rows_held": item.held,
                    "applied_at": db_datetime(now),
                }
            )
            # A short batch was the last one: finish now instead of paying for
            # an empty batch. Rows that become eligible later (inserted with
            # old timestamps after this point) are the next sweep's work.
            advance(
                job.id,
                new_cursor=item.last_id if text_key else int(item.last_id or 0),
                finish=item.candidates < item.limit,
                batches=1,
                deleted=deleted,
                held=item.held,
                batch_size=item.limit,
            )
        if cursor_keys:
            rows = [{"job_id": job_id, "cursor_key": key} for job_id, key in sorted(cursor_keys.items())]
            params = sql.rows_params("g", statements.KEY_CURSOR_COLUMNS, rows)
            sql.execute(statements.jobs_cursor_keys_set(len(rows)), params, cur=cur)
        if updates:
            params = {
                **sql.rows_params("g", statements.ADVANCE_COLUMNS, updates),
                "now": db_datetime(now),
                "renew": renew,
            }
            statement = statements.group_jobs_advance(len(updates))
            keys = any(row["after_key"] or row["last_key"] for row in ledger)
            columns = statements.ledger_columns(keys=keys)
            if ledger and sql.is_postgres():
                # Every job with a ledger row is among the updates.
                statement = statements.ledger_insert_and_jobs_advance(rows=len(ledger), jobs=len(updates), keys=keys)
                params |= sql.rows_params("l", columns, ledger)
            elif ledger:
                ledger_params = sql.rows_params("g", columns, ledger)
                sql.execute(statements.ledger_insert_many(len(ledger), keys=keys), ledger_params, cur=cur)
            for job_id, state, outcome in sql.execute(statement, params, cur=cur).fetchall():
                steps[job_id].applied = True
                if state == JobState.DONE:
                    steps[job_id].outcome = outcome
        if documents:
            by_id = {item.job.id: item for item in chosen}
            purge_outbox_write_many(
                [(by_id[job_id].job, by_id[job_id].operation, ids) for job_id, ids in documents.items()], now=now
            )
        # A sweep whose last job finished here is finished in this same
        # transaction (under its row lock), so no crash leaves it running.
        for sweep_id in sorted({job.sweep_id for job in jobs if steps[job.id].outcome}):
            sweep_mark_drained_if_finished(sweep_id=sweep_id, now=now)
        checkpoint("batch.before_commit")
    return steps


def _plan(
    job: JobRef, after_id: Key, policy: tuple[int | None, int, bool, int], limit: int | None, budget: int
) -> _Work | None:
    """A partition's next batch under ``policy`` (active version id, days,
    enabled, batch size); None when no enabled version is active (withdrawn).
    The cutoff is the earlier (stricter) of the admitted and the current
    version's; the batch size the policy's, within the deployment's ceiling
    (one transaction's rows)."""
    version_id, days, enabled, size = policy
    if version_id is None or not enabled:
        return None
    current_cutoff = job.slot - timedelta(days=days)
    cutoff, used_version = (
        (current_cutoff, version_id) if current_cutoff < job.cutoff else (job.cutoff, job.policy_version_id)
    )
    item = _Work(job, after_id, cutoff, used_version, limit=min(limit or size, budget, MAX_BATCH_SIZE))
    item.operation = operation_id(
        record_kind=job.record_kind,
        property_id=operation_partition(property_id=job.property_id, portfolio_id=job.portfolio_id),
        slot=job.slot,
        cutoff=cutoff,
        after_id=after_id,
        limit=item.limit,
    )
    return item


def _scope_rows(jobs: list[JobRef]) -> list[dict[str, Any]]:
    return [
        {
            "job_id": job.id,
            "property_id": job.property_id,
            "portfolio_id": job.portfolio_id,
            "record_kind": job.record_kind,
        }
        for job in jobs
    ]


Fenced = dict[int, tuple[Key, int, int]]
Policies = dict[int, tuple[int | None, int, bool, int]]


def _fence_scopes_and_policies(
    cur: Any, *, jobs: list[JobRef], lease: JobLease, now: datetime
) -> tuple[Fenced, Policies]:
    """The fence, the scope locks and the policy read
    (``statements.group_fence_scopes_and_policies``): (cursor, rows deleted, rows
    held) per job still ours, and per such job whose scope exists (active
    version id or None, retention days, enabled, batch size); ``LeaseLost``
    if no job is still ours."""
    params = {
        **sql.any_params("ids", [job.id for job in jobs]),
        **sql.rows_params("g", statements.SCOPE_COLUMNS, _scope_rows(jobs)),
        "state": JobState.LEASED,
        "token": token_param(lease.token),
        "now": db_datetime(now),
        "approved": PolicyVersion.Status.APPROVED,
    }
    statement = statements.group_fence_scopes_and_policies(
        len(jobs), portfolio_partitions=any(job.property_id is None for job in jobs)
    )
    rows = sql.execute(statement, params, cur=cur).fetchall()
    if not rows:
        raise LeaseLost(jobs[0].id)
    fenced: Fenced = {}
    policies: Policies = {}
    for job_id, cursor, deleted, held, scoped, vid, days, enabled, size in rows:
        fenced[int(job_id)] = (int(cursor), int(deleted), int(held))
        if scoped:
            policies[int(job_id)] = (None if vid is None else int(vid), int(days or 0), bool(enabled), int(size or 1))
    return fenced, policies


def _policies_and_replayed(cur: Any, jobs: list[JobRef], operations: list[str]) -> tuple[Policies, dict[str, Key]]:
    """The second statement (``statements.policies_and_ledger_lookup``): each job's
    active version as it is once the scope locks are held, and the last id of
    each of ``operations`` already on the ledger."""
    if not jobs:
        return {}, {}
    params = {
        **sql.rows_params("p", statements.POLICY_COLUMNS, _scope_rows(jobs)),
        **sql.any_params("ops", operations or [""]),
        "approved": PolicyVersion.Status.APPROVED,
    }
    statement = statements.policies_and_ledger_lookup(jobs=len(jobs), operations=max(1, len(operations)))
    policies: Policies = {}
    replayed: dict[str, Key] = {}
    for job_id, vid, days, enabled, size, operation, last_id in sql.execute(statement, params, cur=cur).fetchall():
        if operation is not None:
            replayed[operation] = int(last_id)
        else:
            policies[int(job_id)] = (None if vid is None else int(vid), int(days or 0), bool(enabled), int(size or 1))
    return policies, replayed


def _replayed_operations(cur: Any, operations: list[str]) -> dict[str, Key]:
    rows = sql.execute(statements.ledger_lookup(len(operations)), sql.any_params("ops", operations), cur=cur).fetchall()
    return {op: int(last_id) for op, last_id in rows}


def _text_key(kind: str) -> bool:
    """The kind's cursor is carried as text (a non-integer key); a kind no
    longer configured is not (its jobs end ``scope_missing`` or fail as before)."""
    spec = REGISTRY.get(kind)
    return spec is not None and not spec.integer_key


def _read_cursor_keys(cur: Any, fenced: Fenced, job_ids: list[int]) -> None:
    """Replace the (unused, 0) bigint cursor of non-integer kinds' jobs by
    their text cursor; the fence holds their rows."""
    statement = statements.jobs_cursor_keys(len(job_ids))
    for job_id, key in sql.execute(statement, sql.any_params("ids", job_ids), cur=cur).fetchall():
        _, deleted, held = fenced[int(job_id)]
        fenced[int(job_id)] = (str(key), deleted, held)


def _replayed_last_keys(cur: Any, operations: list[str]) -> dict[str, Key]:
    """The text last ids of replayed ledger rows of non-integer kinds."""
    rows = sql.execute(
        statements.ledger_last_keys(len(operations)), sql.any_params("ops", operations), cur=cur
    ).fetchall()
    return {op: str(last_key) for op, last_key in rows}


def _count_candidates(cur: Any, work: list[_Work], *, budget: int) -> None:
    """Fill in candidates (up to its own limit per partition) and the last
    candidate id of as many partitions, in order, as one transaction's rows
    (``budget``) cover; the others stay uncounted (``counted`` False) for the
    next transaction."""
    by_kind: dict[str, list[_Work]] = {}
    for item in work:
        by_kind.setdefault(item.job.record_kind, []).append(item)
    for kind, items in by_kind.items():
        spec = get_spec(kind)
        if sql.is_postgres() and len(items) > GROUP_STATEMENT_FROM:
            rows = [
                {
                    "ord": ord_,
                    "job_id": item.job.id,
                    "property_id": item.job.property_id,
                    "portfolio_id": item.job.portfolio_id,
                    "after_id": item.after_id,
                    "cutoff": db_datetime(item.cutoff),
                    "lim": item.limit,
                }
                for ord_, item in enumerate(items)
            ]
            statement = statements.group_candidates(spec, jobs=len(items))
            params = {**sql.rows_params("g", statements.candidate_columns(spec), rows), "budget": budget + 1}
            found = sql.execute(statement, params, cur=cur).fetchall()
            returned = sum(int(rows) for _, _, rows, *_ in found)
            reached = max((int(ord_) for ord_, *_ in found), default=-1)
            cut = reached if returned > budget else None
            for ord_, _job_id, _rows, n, last, ids in found:
                if ord_ != cut:
                    item = items[ord_]
                    item.candidates, item.last_id, item.ids, item.counted = int(n), last, ids or [], True
        else:
            # A few partitions (a large one runs alone), or SQLite (the demo,
            # no LATERAL): one query per partition, until a batch of rows is
            # found. For one partition its values are known when PostgreSQL
            # plans it, so it walks the keyset index instead of sorting every
            # expired row of the property (as the lateral's generic plan does).
            statement = statements.partition_candidates(spec)
            seen = 0
            for item in items:
                if seen >= budget:
                    break
                params = {
                    "property_id": item.job.property_id,
                    "after_id": item.after_id,
                    "cutoff": db_datetime(item.cutoff),
                    "lim": item.limit,
                }
                if not spec.has_property:
                    params["portfolio_id"] = item.job.portfolio_id
                n, last, ids = sql.execute(statement, params, cur=cur).fetchone()
                item.candidates, item.last_id, item.ids, item.counted = int(n), last, ids, True
                seen += int(n)


def _count_and_delete_alone(cur: Any, item: _Work) -> tuple[dict[int, int], dict[int, list[tuple[str, Key]]]]:
    """``_count_candidates`` and ``_delete`` for one partition in one statement
    (PostgreSQL): fills in its candidates and last id; returns what
    ``_delete`` returns."""
    kind = item.job.record_kind
    spec = get_spec(kind)
    predicate, predicate_params = sql.named(
        *eligible_sql_for(kind, cutoff_sql="CAST(%(cutoff)s AS timestamptz)", alias=spec.table), prefix="eligible"
    )
    attachment = attachment_column(kind)
    statement = statements.partition_count_and_delete(spec, predicate=predicate)
    params = {
        "property_id": item.job.property_id,
        "portfolio_id": item.job.portfolio_id,
        "after_id": item.after_id,
        "cutoff": db_datetime(item.cutoff),
        "lim": item.limit,
        "kind": kind,
        **predicate_params,
    }
    deleted = 0
    named: list[tuple[str, Key]] = []
    for candidates, last_id, record_id, document_id in sql.execute(statement, params, cur=cur).fetchall():
        if candidates is not None:
            item.candidates, item.last_id, item.counted = int(candidates), last_id, True
            # One statement, one snapshot: the range is exactly the candidates
            # (the first row's third column is the held count).
            item.in_range, item.held = int(candidates), int(record_id)
            continue
        deleted += 1
        if attachment and document_id:
            named.append((document_id, spec.key_value(record_id)))
    return ({item.job.id: deleted} if deleted else {}), ({item.job.id: named} if named else {})


def _delete(cur: Any, work: list[_Work]) -> tuple[dict[int, int], dict[int, list[tuple[str, Key]]]]:
    """One DELETE per record kind; (rows deleted per job, (document id, record id) per job)."""
    deleted: dict[int, int] = {}
    documents: dict[int, list[tuple[str, Key]]] = {}
    by_kind: dict[str, list[_Work]] = {}
    for item in work:
        by_kind.setdefault(item.job.record_kind, []).append(item)
    for kind, items in by_kind.items():
        spec = get_spec(kind)
        # A group holds one job per partition of a kind: its property, or its portfolio without one.
        by_property = {(item.job.property_id if spec.has_property else item.job.portfolio_id): item for item in items}
        predicate, predicate_params = sql.named(
            *eligible_sql_for(kind, cutoff_sql="g.cutoff", alias=spec.table), prefix="eligible"
        )
        attachment = attachment_column(kind)
        ranges = [
            {
                "property_id": item.job.property_id,
                "portfolio_id": item.job.portfolio_id,
                "after_id": item.after_id,
                "last_id": item.last_id,
                "cutoff": db_datetime(item.cutoff),
            }
            for item in items
        ]
        params = {**sql.rows_params("g", statements.delete_columns(spec), ranges), **predicate_params, "kind": kind}
        if sql.is_postgres():
            # The DELETE takes the counted candidates: they are the ledger's.
            params["ids"] = [i for item in items for i in item.ids or ()]
            for item in items:
                item.in_range = item.candidates
        else:
            # SQLite: the counts just before the DELETE (one writer at a time).
            counts = statements.group_range_counts(spec, jobs=len(items))
            for property_id, n, n_held in sql.execute(counts, params, cur=cur).fetchall():
                by_property[int(property_id)].in_range = int(n)
                by_property[int(property_id)].held = int(n_held or 0)
        statement = statements.group_delete(spec, predicate=predicate, jobs=len(items))
        for property_id, document_id, record_id, n_held in sql.execute(statement, params, cur=cur).fetchall():
            item = by_property[int(property_id)]
            if n_held is not None:
                item.held = int(n_held)
                continue
            job_id = item.job.id
            deleted[job_id] = deleted.get(job_id, 0) + 1
            if attachment and document_id:
                documents.setdefault(job_id, []).append((document_id, spec.key_value(record_id)))
    return deleted, documents


def attachment_column(kind: str) -> str | None:
    """The document id column of a record kind, or None when it has no attachments."""
    return get_spec(kind).attachment_column


def purge_outbox_write_many(
    batches: list[tuple[JobRef, str, list[tuple[str, Key]]]], *, now: datetime
) -> list[CleanupJob]:
    """The outbox rows of applied batches: per batch a ``PurgeRequest`` and its
    ``purge`` job, and per deleted record with a document a ``DeletedAttachment``
    (which record named which document: what the purge's hold check asks
    about), in three statements whatever the number of batches.

    Called inside the batch's transaction. Each document is kept as its
    reference in the kind's store (``stores.document_ref``: the HTTP id, or
    ``<alias>:<key>`` with the key exactly as the record holds it). Ids and
    keys the store cannot take (``stores.key_checker``) are never stored:
    counted, and their records named with the problem (see ``PurgeRequest``).
    """
    requests = []
    refs: list[dict[str, str]] = []  # per batch: the record's document -> its reference (purgeable ones)
    for job, operation, named in batches:
        store = get_spec(job.record_kind).attachment_storage or stores.DOCSTORE
        problem_of = stores.key_checker(store)
        refs_of: dict[str, str] = {}
        unpurgeable = []
        for document_id, record_id in named:
            problem = problem_of(document_id)
            if problem is None:
                refs_of[document_id] = stores.document_ref(store, document_id)
            else:
                unpurgeable.append({"record_id": record_id, "problem": problem})
        refs.append(refs_of)
        scope = scope_of(job)
        requests.append(
            PurgeRequest(
                key=operation,
                delete_job_id=job.id,
                portfolio_id=scope["portfolio_id"],
                property_id=scope["property_id"],
                record_kind=scope["record_kind"],
                store=store,
                document_ids=list(dict.fromkeys(refs_of[d] for d, _ in named if d in refs_of)),
                invalid_ids=len(unpurgeable),
                unpurgeable=unpurgeable,
                created_at=now,
            )
        )
    PurgeRequest.objects.bulk_create(requests)
    if not all(request.pk for request in requests):
        # Backends that cannot return ids from a bulk insert (not PostgreSQL or SQLite).
        keys = {request.key: request for request in requests}
        for pk, key in PurgeRequest.objects.filter(key__in=keys).values_list("pk", "key"):
            keys[key].pk = pk
    # This batch's part in each named document's one decision (``sql.dispositions_take``).
    named_documents = sorted({ref for refs_of in refs for ref in refs_of.values()})
    if named_documents:
        params = {
            **sql.rows_params("x", sql.DISPOSITION_COLUMNS, [{"document_id": d} for d in named_documents]),
            "pending": DispositionState.PENDING,
            "purged": DispositionState.PURGED,
        }
        sql.execute(sql.dispositions_take(len(named_documents)), params)
    DeletedAttachment.objects.bulk_create(
        [
            DeletedAttachment(
                document_id=refs_of[document_id],
                portfolio_id=job.portfolio_id,
                property_id=job.property_id,
                record_kind=job.record_kind,
                # A non-integer key is named by its text (``record_key``).
                record_id=record_id if isinstance(record_id, int) else None,
                record_key="" if isinstance(record_id, int) else record_id,
                purge_request_id=request.pk,
                deleted_at=now,
            )
            for (job, _, named), request, refs_of in zip(batches, requests, refs, strict=True)
            for document_id, record_id in named
            if document_id in refs_of
        ]
    )
    return CleanupJob.objects.bulk_create(
        [
            CleanupJob(
                sweep_id=job.sweep_id,
                key=f"purge:{operation}",
                job_kind=JobKind.PURGE,
                purge_request_id=request.pk,
                cutoff=job.cutoff,
                available_at=now,
                **scope_of(job),
            )
            for (job, operation, _), request in zip(batches, requests, strict=True)
        ]
    )
