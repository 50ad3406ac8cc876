"""The batch transaction: keyset slices of one or many delete jobs, each applied exactly once.

Protocol of ``run_group_batch`` (one database transaction over the leased
jobs of a group; ``run_batch`` is a group of one; see ``docs/architecture.md``,
"Lock, then read" and "One batch, one transaction"):

a. **Fence and scope, one statement** (``execution.statements.group_fence_scopes_and_policies``):
   the job rows ``FOR UPDATE`` where the lease token is ours and not expired
   (on the database's clock, ``cleanup_ops.clock``) — jobs whose lease is lost
   drop out and are reported, ``LeaseLost`` only when none is left — then the
   portfolio and property rows ``FOR SHARE``. Placing a legal hold or
   approving a version locks one of them ``FOR UPDATE``, so nothing below
   can be changed under the batch by either. A missing scope ends the job as
   ``scope_missing``.
b. **Policy, after the locks** (``execution.statements.policies_and_ledger_lookup``): the
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
   How the candidates are counted depends on how many partitions there are
   (``execution.candidates.Counting``).
e. **Ledger and cursor**: insert the ledger rows, advance the cursors past
   every candidate (held ones too) and renew the lease, in one statement.
f. **Outbox**: for record kinds with attachments the DELETE returns the
   deleted rows' document ids; the same transaction takes each document's
   disposition row (``execution.outbox._dispositions_take``: a purge deciding
   about that document waits for this commit, or this batch for its
   decision) and writes one ``PurgeRequest`` (key = the operation id), one
   ``purge`` job and one ``DeletedAttachment`` per record
   (``execution.outbox``). A held or replayed batch deletes nothing and so
   purges nothing; a rolled-back batch takes its outbox rows with it.

A batch with fewer candidates than the limit (or none) was the last one: the
job is done with its outcome in that same transaction, and so is its sweep
when no job of it is left open (``sweeps.sweep_mark_drained_if_finished``).
Checkpoints (``cleanup_ops.checkpoints``) mark the steps for the
interleaving tests.

The protocol's statements (fence, policy, ledger write, the sweep's) run on
``batch_cursor``: prepared on the worker's session once they have run
``PREPARE_THRESHOLD`` times, then only bound (``CLEANUP_PREPARED_STATEMENTS``).
The data statements (candidates and ``DELETE``) run on Django's cursor, parsed
and planned for their values every time: their best plan depends on the
partition's size and the cutoff, which a generic plan does not know. They are not pipelined: each step's
parameters are the previous one's answers, and every wait must end with a
Sync so that a stalled worker's session is *idle in transaction* and bounded
(docs/architecture.md, "Round trips and plans").

A kind whose key is not an integer (``retention.registry``, "Keys") carries
its cursor as text: after the fence, one statement reads the text cursors of
such jobs (their rows are already locked by it), and before the commit one
writes them (``execution.key_cursors``); their ledger
rows take the range as ``after_key``/``last_key``. A kind without a property
is partitioned by its portfolio: its rows in a group are told apart by the
portfolio, not the property.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from cleanup_ops import clock, sql
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.execution import key_cursors, statements
from cleanup_ops.execution.candidates import Key, PartitionBatch, count_and_delete
from cleanup_ops.execution.leases import JOB_FIELDS, JobLease, JobRef, lease_renewal, token_param
from cleanup_ops.execution.outbox import purge_outbox_write_many
from cleanup_ops.lifecycle import JobAdvance, after_batch
from cleanup_ops.models import (
    CleanupJob,
    JobOutcome,
    JobState,
)
from cleanup_ops.recovery.classification import LeaseLost
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from retention.conf import MAX_BATCH_SIZE
from retention.eligibility import db_datetime
from retention.models import PolicyVersion
from retention.registry import REGISTRY, get_spec

# Executions of one statement text in a session after which psycopg prepares
# it (psycopg's own default). A statement run once (a group's DELETE with its
# span as literals) is never prepared, so the session's prepared statements
# are the few texts every batch repeats, well within psycopg's
# ``prepared_max``.
PREPARE_THRESHOLD = 5


@contextmanager
def batch_cursor() -> Iterator[Any]:
    """The batch transaction's cursor. With ``CLEANUP_PREPARED_STATEMENTS``
    (the default): Django's wrapper (its error mapping and query log) around
    a *server-side binding* psycopg cursor, for the protocol's statements
    (the data statements stay on Django's cursor: the module docstring says
    why) — Django's own bind client-side
    (psycopg splices the values into the text, which can never be
    prepared), and Django turns psycopg's preparing off for every cursor
    (``prepare_threshold`` None, for connection poolers). The batch's
    statements keep one text whatever their values (``sql.rows_cte``:
    arrays, typed casts), so each is prepared after ``PREPARE_THRESHOLD``
    executions in the session, and later batches send only Bind/Execute: no
    parse, analysis or rewrite, and PostgreSQL's plan cache may choose a
    generic plan instead of planning again (docs/architecture.md, "Round
    trips and plans"). Off: Django's cursor, every statement parsed and
    planned each time."""
    if not settings.CLEANUP_PREPARED_STATEMENTS:
        with connection.cursor() as plain:
            yield plain
        return
    connection.ensure_connection()
    raw = connection.connection
    # Only server-side binding cursors prepare: Django's (client-side) keep
    # ignoring the threshold.
    raw.prepare_threshold = PREPARE_THRESHOLD
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    with wrapper(psycopg.Cursor(raw), connection) as cur:
        yield cur


def job_load(job_id: int) -> JobRef:
    return JobRef(*CleanupJob.objects.filter(pk=job_id).values_list(*JOB_FIELDS)[0])


def jobs_load(job_ids: list[int]) -> dict[int, JobRef]:
    """Several jobs in one query."""
    rows = CleanupJob.objects.filter(pk__in=job_ids).values_list(*JOB_FIELDS)
    return {row[0]: JobRef(*row) for row in rows}


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


@dataclass
class PartitionStep:
    """What one batch transaction did for one job of its group."""

    job_id: int
    deleted: int = 0
    outcome: str = ""  # set when the job finished in this transaction
    applied: bool = False  # a ledger row was written or replayed, or the job finished
    lost: bool = False  # our lease on it is gone: nothing was written for it
    full: bool = False  # a full batch of candidates: a large partition, more to come


Fenced = dict[int, tuple[Key, int, int]]
Policies = dict[int, tuple[int | None, int, bool, int]]


@dataclass
class _Advances:
    """Each job's write at the end of the transaction (``lifecycle.after_batch``),
    collected as the steps decide them, from the totals the fence read. A
    non-integer kind's cursor goes to ``cursor_keys`` (its own statement
    writes it); its bigint cursor stays 0."""

    fenced: Fenced
    keyed: set[int]
    updates: list[JobAdvance] = field(default_factory=list)
    cursor_keys: dict[int, str] = field(default_factory=dict)

    def add(self, job_id: int, **change: Any) -> None:
        cursor, deleted, held = self.fenced[job_id]
        new_cursor = change.pop("new_cursor", cursor)
        if job_id in self.keyed:
            self.cursor_keys[job_id], new_cursor = str(new_cursor), 0
        self.updates.append(after_batch(job_id=job_id, totals=(deleted, held), new_cursor=int(new_cursor), **change))


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
    reported and skipped. The steps are the module docstring's a-f.
    """
    now = now or clock.now()
    budget = limit or settings.CLEANUP_BATCH_SIZE
    steps = {job.id: PartitionStep(job.id) for job in jobs}
    renew = lease_renewal(now)
    with transaction.atomic(), batch_cursor() as cur, connection.cursor() as data:
        # a. Fence and scope locks, with a first reading of the policies.
        fenced, guess = _fence_scopes_and_policies(cur, jobs=jobs, lease=lease, now=now)
        keyed = {job.id for job in jobs if job.id in fenced and _text_key(job.record_kind)}
        if keyed:
            _read_cursor_keys(cur, fenced, sorted(keyed))
        for job in jobs:
            steps[job.id].lost = job.id not in fenced
        live = [job for job in jobs if job.id in fenced]
        advances = _Advances(fenced, keyed)
        checkpoint("batch.after_fence")
        # b. Policy, read after the locks; c. replay, looked up with it.
        scoped = [job for job in live if job.id in guess]
        guessed_ops = _operations(scoped, fenced, guess, limit=limit, budget=budget)
        current, replayed = _policies_and_replayed(cur, scoped, sorted(guessed_ops))
        checkpoint("batch.after_policy")
        work = _plan_or_finish(live, fenced, current, advances, limit=limit, budget=budget)
        replayed = _replays_completed(cur, work, replayed, looked_up=guessed_ops, keyed=keyed)
        fresh = _skip_replayed(work, replayed, advances)
        checkpoint("batch.before_delete")
        # d. Delete.
        # Not prepared: a generic plan of the data statement, blind to which
        # partition and cutoff it serves, read 20% more pages at 1M rows.
        chosen, deleted, documents = count_and_delete(data, fresh, budget=budget)
        # e. Ledger and cursors.
        ledger = _ledger_rows_and_advances(chosen, deleted, steps=steps, advances=advances, now=now)
        _write_ledger_and_advances(cur, ledger, advances, steps=steps, now=now, renew=renew)
        # f. Outbox.
        if documents:
            by_id = {job.id: job for job in jobs}
            operations = {item.job.id: item.operation for item in chosen}
            purge_outbox_write_many(
                [(by_id[job_id], operations[job_id], ids) for job_id, ids in documents.items()], now=now
            )
        # A sweep whose last job finished here is finished in this same
        # transaction (under its row lock), so no crash leaves it running.
        for sweep_id in sorted({job.sweep_id for job in jobs if steps[job.id].outcome}):
            sweep_mark_drained_if_finished(sweep_id=sweep_id, now=now, cur=cur)
        checkpoint("batch.before_commit")
    return steps


def _operations(jobs: list[JobRef], fenced: Fenced, policies: Policies, *, limit: int | None, budget: int) -> set[str]:
    """The operation ids the jobs' next batches would have under ``policies``:
    the first statement's reading, only a guess (it may have waited for a
    scope lock with an older snapshot), made to look the replays up in the
    second statement. The decision is the second statement's (lock, then read)."""
    planned = (_plan(job, fenced[job.id][0], policies[job.id], limit, budget) for job in jobs)
    return {item.operation for item in planned if item is not None}


def _plan_or_finish(
    live: list[JobRef], fenced: Fenced, policies: Policies, advances: _Advances, *, limit: int | None, budget: int
) -> list[PartitionBatch]:
    """Each live job's next batch under its current policy; a job whose scope
    is gone, or whose policy was withdrawn, finishes with that outcome."""
    work = []
    for job in live:
        if job.id not in policies:
            advances.add(job.id, finish=True, fixed_outcome=JobOutcome.SCOPE_MISSING)
            continue
        item = _plan(job, fenced[job.id][0], policies[job.id], limit, budget)
        if item is None:
            advances.add(job.id, finish=True, fixed_outcome=JobOutcome.POLICY_WITHDRAWN)
            continue
        work.append(item)
    return work


def _replays_completed(
    cur: Any, work: list[PartitionBatch], replayed: dict[str, Key], *, looked_up: set[str], keyed: set[int]
) -> dict[str, Key]:
    """``replayed`` with what the second statement could not answer: the
    operations of a version approved while the fence waited (not guessed),
    and the text last ids of replayed non-integer kinds' batches. No
    statement when there is none."""
    unseen = [item.operation for item in work if item.operation not in looked_up]
    if unseen:
        replayed = replayed | _replayed_operations(cur, unseen)
    replayed_keyed = [item.operation for item in work if item.job.id in keyed and item.operation in replayed]
    if replayed_keyed:
        replayed = replayed | _replayed_last_keys(cur, replayed_keyed)
    return replayed


def _skip_replayed(work: list[PartitionBatch], replayed: dict[str, Key], advances: _Advances) -> list[PartitionBatch]:
    """The batches not on the ledger yet. One already applied (by this job
    before a lost ack, or by the job a redrive replaced) is never applied
    twice: its job's cursor moves past it."""
    fresh = []
    for item in work:
        if item.operation in replayed:
            advances.add(item.job.id, new_cursor=max(item.after_id, replayed[item.operation]), finish=False)
        else:
            fresh.append(item)
    return fresh


def _ledger_rows_and_advances(
    chosen: list[PartitionBatch],
    deleted_by_job: dict[int, int],
    *,
    steps: dict[int, PartitionStep],
    advances: _Advances,
    now: datetime,
) -> list[dict[str, Any]]:
    """Step e's decisions: per partition taken, its ledger row and its job's
    advance past every candidate (held ones too); one with no candidate left
    past the cutoff is done, its outcome from its totals."""
    ledger = []
    for item in chosen:
        job = item.job
        if not item.candidates:
            advances.add(job.id, finish=True, batch_size=item.limit)
            continue
        deleted = deleted_by_job.get(job.id, 0)
        steps[job.id].deleted = deleted
        steps[job.id].full = item.candidates >= item.limit
        text_key = job.id in advances.keyed
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
        advances.add(
            job.id,
            new_cursor=item.last_id if text_key else int(item.last_id or 0),
            finish=item.candidates < item.limit,
            batches=1,
            deleted=deleted,
            held=item.held,
            batch_size=item.limit,
        )
    return ledger


def _write_ledger_and_advances(
    cur: Any,
    ledger: list[dict[str, Any]],
    advances: _Advances,
    *,
    steps: dict[int, PartitionStep],
    now: datetime,
    renew: object,
) -> None:
    """Step e's writes: the text cursors (their own statement), then the
    ledger rows and every job's advance — one statement (a data-modifying
    CTE). Marks each job written as applied,
    and finished with its outcome."""
    if advances.cursor_keys:
        rows = [{"job_id": job_id, "cursor_key": key} for job_id, key in sorted(advances.cursor_keys.items())]
        params = sql.rows_params("g", key_cursors.KEY_CURSOR_COLUMNS, rows)
        sql.execute(key_cursors.jobs_cursor_keys_set(), params, cur=cur)
    if not advances.updates:
        return
    updates = advances.updates
    params = {**sql.rows_params("g", statements.ADVANCE_COLUMNS, updates), "now": db_datetime(now), "renew": renew}
    statement = statements.group_jobs_advance()
    keys = any(row["after_key"] or row["last_key"] for row in ledger)
    columns = statements.ledger_columns(keys=keys)
    if ledger:
        # Every job with a ledger row is among the updates.
        statement = statements.ledger_insert_and_jobs_advance(keys=keys)
        params |= sql.rows_params("l", columns, ledger)
    for job_id, state, outcome in sql.execute(statement, params, cur=cur).fetchall():
        steps[job_id].applied = True
        if state == JobState.DONE:
            steps[job_id].outcome = outcome


def _plan(
    job: JobRef, after_id: Key, policy: tuple[int | None, int, bool, int], limit: int | None, budget: int
) -> PartitionBatch | None:
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
    item = PartitionBatch(job, after_id, cutoff, used_version, limit=min(limit or size, budget, MAX_BATCH_SIZE))
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


def _paths(jobs: list[JobRef]) -> tuple[tuple[statements.Hop, tuple[str, ...]], ...]:
    """The one-hop paths of the group's kinds, each with its kinds, in a
    stable order (one statement text per set of paths)."""
    kinds: dict[statements.Hop, set[str]] = {}
    for kind in {job.record_kind for job in jobs}:
        hop = get_spec(kind).path_hop
        if hop is not None:
            kinds.setdefault(hop, set()).add(kind)
    return tuple((hop, tuple(sorted(kinds[hop]))) for hop in sorted(kinds))


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
        portfolio_partitions=any(job.property_id is None for job in jobs), paths=_paths(jobs)
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
        **sql.any_params("ops", operations),
        "approved": PolicyVersion.Status.APPROVED,
    }
    statement = statements.policies_and_ledger_lookup()
    policies: Policies = {}
    replayed: dict[str, Key] = {}
    for job_id, vid, days, enabled, size, operation, last_id in sql.execute(statement, params, cur=cur).fetchall():
        if operation is not None:
            replayed[operation] = int(last_id)
        else:
            policies[int(job_id)] = (None if vid is None else int(vid), int(days or 0), bool(enabled), int(size or 1))
    return policies, replayed


def _replayed_operations(cur: Any, operations: list[str]) -> dict[str, Key]:
    rows = sql.execute(statements.ledger_lookup(), sql.any_params("ops", operations), cur=cur).fetchall()
    return {op: int(last_id) for op, last_id in rows}


def _text_key(kind: str) -> bool:
    """The kind's cursor is carried as text (a non-integer key); a kind no
    longer configured is not (its jobs end ``scope_missing`` or fail as before)."""
    spec = REGISTRY.get(kind)
    return spec is not None and not spec.integer_key


def _read_cursor_keys(cur: Any, fenced: Fenced, job_ids: list[int]) -> None:
    """Replace the (unused, 0) bigint cursor of non-integer kinds' jobs by
    their text cursor; the fence holds their rows."""
    statement = key_cursors.jobs_cursor_keys()
    for job_id, key in sql.execute(statement, sql.any_params("ids", job_ids), cur=cur).fetchall():
        _, deleted, held = fenced[int(job_id)]
        fenced[int(job_id)] = (str(key), deleted, held)


def _replayed_last_keys(cur: Any, operations: list[str]) -> dict[str, Key]:
    """The text last ids of replayed ledger rows of non-integer kinds."""
    rows = sql.execute(key_cursors.ledger_last_keys(), sql.any_params("ops", operations), cur=cur).fetchall()
    return {op: str(last_key) for op, last_key in rows}
