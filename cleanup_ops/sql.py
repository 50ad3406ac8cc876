"""The pipeline's raw SQL and its vendor switches, in one place.

Why raw SQL at all: on the per-batch path every statement counts (an ORM query
that builds model instances costs several plain round trips), and a few
statements need what the ORM does not say (``FOR SHARE OF``, ``RETURNING`` on
a DELETE with a correlated hold check, advisory locks, percentiles). Everything
else (admission's bulk insert, the admin, the API) uses the ORM.

Each statement is a function named after what it does, returning the SQL text
with ``%s`` placeholders; the callers pass the parameters. Table and column
names come from the models' ``_meta``, never from input. The PostgreSQL/SQLite
differences live in the small ``vendor`` helpers below and nowhere else: SQLite
is the embedded demo database, it serialises writers, so its row locks are
simply left out.

The ledger insert stays a named statement: through the ORM it would build a
model instance per batch for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection

from cleanup_ops.models import (
    OPEN_STATES,
    CleanupJob,
    DeletedAttachment,
    JobKind,
    JobOutcome,
    JobState,
    LedgerEntry,
    RateBucket,
)
from properties.models import Portfolio, Property
from retention.models import PolicyVersion, RetentionPolicy

JOB = CleanupJob._meta.db_table
LEDGER = LedgerEntry._meta.db_table
BUCKET = RateBucket._meta.db_table
PROPERTY = Property._meta.db_table
PORTFOLIO = Portfolio._meta.db_table
POLICY = RetentionPolicy._meta.db_table
VERSION = PolicyVersion._meta.db_table

# pg_advisory_xact_lock(namespace, stripe) around a lease's cap check.
LEASE_LOCK_NAMESPACE = 7401


# --- Vendor switches ------------------------------------------------------------


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def for_update() -> str:
    return " FOR UPDATE" if is_postgres() else ""


def for_share_of(*aliases: str) -> str:
    return f" FOR SHARE OF {', '.join(aliases)}" if is_postgres() else ""


def least_greatest() -> tuple[str, str]:
    return ("LEAST", "GREATEST") if is_postgres() else ("MIN", "MAX")


def execute(sql: str, params: Sequence[Any] = (), *, cur: Any = None) -> Any:
    """Run one statement on ``cur`` (or a fresh cursor); returns the cursor
    used when one was passed, else the fetched rows."""
    if cur is not None:
        cur.execute(sql, list(params))
        return cur
    with connection.cursor() as fresh:
        fresh.execute(sql, list(params))
        return fresh.fetchall() if fresh.description else []


# --- Leases and fencing ---------------------------------------------------------


def lease_cap_lock() -> str:
    """Serialises the cap check and the claim of one portfolio's stripe (PostgreSQL only)."""
    return "SELECT pg_advisory_xact_lock(%s, %s)"


def max_locks_per_transaction() -> str:
    return "SELECT current_setting('max_locks_per_transaction')::integer"


def job_lock_fenced() -> str:
    """The job's cursor, row-locked, only while our lease token is valid: a
    worker whose lease expired gets no row and commits nothing."""
    return (
        f"SELECT cursor FROM {JOB} WHERE id = %s AND state = %s AND lease_token = %s"
        f" AND lease_expires_at > %s{for_update()}"
    )


def job_finish() -> str:
    return (
        f"UPDATE {JOB} SET state = %s, outcome = %s, finished_at = %s, lease_token = NULL,"
        f" lease_owner = '', lease_expires_at = NULL WHERE id = %s"
    )


# --- Purge ----------------------------------------------------------------------


def document_scopes_lock() -> str:
    """The property and portfolio rows of every deleted record that named a
    document, ``FOR SHARE`` in property id order: the lock a batch takes on
    its scope, taken by a purge over every scope the document was named in
    (placing a hold takes one of these rows ``FOR UPDATE``). Parameter: the
    document id."""
    refs = DeletedAttachment._meta.db_table
    return (
        f"SELECT p.id FROM {PROPERTY} p JOIN {PORTFOLIO} po ON po.id = p.portfolio_id"
        f" WHERE p.id IN (SELECT a.property_id FROM {refs} a WHERE a.document_id = %s)"
        f" ORDER BY p.id{for_share_of('p', 'po')}"
    )


def transaction_idle_timeout() -> str:
    """PostgreSQL: end this transaction's session if it sits idle longer than
    the parameter (milliseconds) — the backstop for a lock held across a
    bounded HTTP call."""
    return "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"


def purge_advance() -> str:
    """One document done: cursor + 1, counted as a request, lease renewed."""
    return f"UPDATE {JOB} SET cursor = %s, batches = batches + 1, lease_expires_at = %s WHERE id = %s"


# --- Admission ------------------------------------------------------------------


def _slot_minus_retention() -> str:
    """A partition's cutoff: the slot (a parameter) minus the version's retention days."""
    if is_postgres():
        return "(CAST(%s AS timestamptz) - v.retention_days * INTERVAL '1 day')"
    return "datetime(%s, '-' || v.retention_days || ' days')"


def _partitions_due(*, table: str, timestamp_column: str) -> tuple[str, str]:
    """(CTE, WHERE) of the partitions of one kind due at a slot: every
    property of a portfolio whose active, enabled version of the kind's policy
    has a cutoff some row of the property is older than. Held rows count: such
    a partition still gets a job, which ends ``held`` and so shows in the
    sweep's report. Parameters: slot, kind."""
    cte = (
        f"WITH due AS (SELECT p.portfolio_id, p.id AS property_id, v.id AS version_id,"
        f" {_slot_minus_retention()} AS cutoff"
        f" FROM {PROPERTY} p JOIN {POLICY} rp ON rp.portfolio_id = p.portfolio_id AND rp.record_kind = %s"
        f" JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = 'approved' AND v.enabled)"
    )
    where = f"EXISTS (SELECT 1 FROM {table} r WHERE r.property_id = d.property_id AND r.{timestamp_column} < d.cutoff)"
    return cte, where


def _open_elsewhere() -> str:
    """An open delete job of the same partition in another sweep (parameters: kind, sweep id)."""
    states = ", ".join(f"'{state}'" for state in OPEN_STATES)
    return (
        f"EXISTS (SELECT 1 FROM {JOB} o WHERE o.portfolio_id = d.portfolio_id AND o.property_id = d.property_id"
        f" AND o.record_kind = %s AND o.state IN ({states}) AND o.kind = '{JobKind.DELETE}' AND o.sweep_id <> %s)"
    )


def partitions_due(*, table: str, timestamp_column: str) -> str:
    """(portfolio id, property id, version id, cutoff) of one kind; parameters: slot, kind."""
    cte, where = _partitions_due(table=table, timestamp_column=timestamp_column)
    return f"{cte} SELECT d.portfolio_id, d.property_id, d.version_id, d.cutoff FROM due d WHERE {where}" + (
        " ORDER BY d.portfolio_id, d.property_id"
    )


def admit_partitions(*, table: str, timestamp_column: str) -> str:
    """One job per due partition of one kind with no open delete job elsewhere,
    in one set-based INSERT … SELECT; a key that exists (a crashed admission
    being completed) is skipped. Parameters: slot, kind, key prefix, kind,
    available at, created at, kind, sweep id (for the open-elsewhere test),
    sweep id."""
    cte, where = _partitions_due(table=table, timestamp_column=timestamp_column)
    text = typed("varchar")
    key = f"{text} || ':' || d.portfolio_id || ':' || d.property_id || ':' || {text}"
    return (
        f"{cte} INSERT INTO {JOB} (sweep_id, key, kind, portfolio_id, property_id, record_kind, policy_version_id,"
        f" cutoff, state, outcome, available_at, lease_owner, leases, attempt, last_error_category,"
        f" last_error_class, cursor, batches, rows_deleted, rows_held, created_at)"
        f" SELECT {typed('bigint')}, {key}, '{JobKind.DELETE}', d.portfolio_id, d.property_id, {text},"
        f" d.version_id, d.cutoff,"
        f" '{JobState.PENDING}', '', {typed('timestamptz')}, '', 0, 0, '', '', 0, 0, 0, 0, {typed('timestamptz')}"
        f" FROM due d WHERE {where} AND NOT {_open_elsewhere()} ORDER BY d.portfolio_id, d.property_id"
        # No conflict target: an existing key (a crashed admission being
        # completed) and an open job of the partition admitted concurrently
        # by another sweep (the partial unique index) are both skipped.
        f" ON CONFLICT DO NOTHING"
    )


def count_carried_over(*, table: str, timestamp_column: str) -> str:
    """Due partitions of one kind skipped because a delete job of theirs is
    still open in another sweep. Parameters: slot, kind, kind, sweep id."""
    cte, where = _partitions_due(table=table, timestamp_column=timestamp_column)
    return f"{cte} SELECT COUNT(*) FROM due d WHERE {where} AND {_open_elsewhere()}"


# --- Rate limits ----------------------------------------------------------------


def bucket_take() -> str:
    """Refill for the time elapsed and take one token, only if one is there."""
    least, greatest = least_greatest()
    refill = f"{least}(%s, tokens + {greatest}(0, %s - updated_at) * %s)"
    # 1e-9: a whole token accrued in float steps must not miss by rounding.
    return f"UPDATE {BUCKET} SET tokens = {refill} - 1, updated_at = %s WHERE name = %s AND {refill} >= 0.999999999"


def bucket_give_back() -> str:
    """Return one token taken for a transaction that did not use it (capped at the burst)."""
    least, _ = least_greatest()
    return f"UPDATE {BUCKET} SET tokens = {least}(%s, tokens + 1) WHERE name = %s"


def bucket_read() -> str:
    return f"SELECT tokens, updated_at FROM {BUCKET} WHERE name = %s"


# --- Console figures ------------------------------------------------------------


def portfolio_fairness_pg() -> str:
    """Per portfolio of a sweep: admission-to-first-lease wait p50/p95, live
    leases, rows deleted, jobs (PostgreSQL: percentile_cont)."""
    return (
        "SELECT portfolio_id,"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM first_leased_at - created_at)),"
        " percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM first_leased_at - created_at)),"
        " COUNT(*) FILTER (WHERE state = 'leased' AND lease_expires_at > %s),"
        " COALESCE(SUM(rows_deleted), 0), COUNT(*)"
        f" FROM {JOB} WHERE sweep_id = %s GROUP BY portfolio_id ORDER BY portfolio_id"
    )


def retention_debt(*, table: str, timestamp_column: str, hold_sql: str, cutoffs: int) -> str:
    """Per portfolio: overdue, held, overdue beyond the grace, oldest overdue
    timestamp, for ``cutoffs`` (portfolio, cutoff, late) rows of parameters."""
    ts = timestamp_column
    if is_postgres():
        # Per property, an index range scan on (property, timestamp): the cost
        # follows the overdue rows, not the table. OFFSET 0 keeps the hold
        # test computed once per row instead of once per aggregate.
        row_sql = "(CAST(%s AS bigint), CAST(%s AS timestamptz), CAST(%s AS timestamptz))"
        source = (
            f" FROM c JOIN {PROPERTY} p ON p.portfolio_id = c.portfolio_id CROSS JOIN LATERAL"
            f" (SELECT r.{ts} AS ts, {hold_sql} AS held FROM {table} r"
            f" WHERE r.property_id = p.id AND r.{ts} < c.cutoff OFFSET 0) x"
        )
    else:
        row_sql = "(%s, %s, %s)"
        source = (
            f" FROM c JOIN {PROPERTY} p ON p.portfolio_id = c.portfolio_id"
            f" JOIN (SELECT r.property_id, r.{ts} AS ts, {hold_sql} AS held FROM {table} r) x"
            f" ON x.property_id = p.id AND x.ts < c.cutoff"
        )
    return (
        f"WITH c(portfolio_id, cutoff, late) AS (VALUES {', '.join([row_sql] * cutoffs)})"
        " SELECT c.portfolio_id, MIN(c.cutoff),"
        " SUM(CASE WHEN x.held THEN 0 ELSE 1 END), SUM(CASE WHEN x.held THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN NOT x.held AND x.ts < c.late THEN 1 ELSE 0 END), MIN(CASE WHEN x.held THEN NULL ELSE x.ts END)"
        f"{source} GROUP BY c.portfolio_id"
    )


# --- The multi-partition batch --------------------------------------------------
# One transaction over several small partitions: each statement carries a
# list of partitions as a ``WITH g(...) AS (VALUES ...)`` list. PostgreSQL
# needs the parameters' types spelled out there; SQLite must not get them
# (its CAST to an unknown type name would turn a timestamp into a number).


def typed(sql_type: str) -> str:
    return f"CAST(%s AS {sql_type})" if is_postgres() else "%s"


def values_list(rows: int, types: Sequence[str]) -> str:
    row = "(" + ", ".join(typed(t) for t in types) + ")"
    return ", ".join([row] * rows)


def placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


def group_lock_fenced(jobs: int) -> str:
    """The cursors of those of the group's jobs whose lease is still ours,
    rows locked in id order (two groups never wait on each other in a cycle)."""
    return (
        f"SELECT id, cursor FROM {JOB} WHERE id IN ({placeholders(jobs)}) AND state = %s AND lease_token = %s"
        f" AND lease_expires_at > %s ORDER BY id{for_update()}"
    )


def group_scope_lock_and_policy(jobs: int) -> str:
    """Per job: the active version of its portfolio's policy for its kind
    (id, retention days, enabled, batch size; NULLs when none); property and portfolio rows ``FOR SHARE`` in property
    id order. A job whose scope is gone returns no row."""
    rows = values_list(jobs, ["bigint", "bigint", "bigint", "varchar"])
    return (
        f"WITH g(job_id, property_id, portfolio_id, record_kind) AS (VALUES {rows})"
        f" SELECT g.job_id, v.id, v.retention_days, v.enabled, v.batch_size FROM g"
        f" JOIN {PROPERTY} p ON p.id = g.property_id"
        f" JOIN {PORTFOLIO} po ON po.id = p.portfolio_id AND po.id = g.portfolio_id"
        f" LEFT JOIN {POLICY} rp ON rp.portfolio_id = po.id AND rp.record_kind = g.record_kind"
        f" LEFT JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = %s"
        f" ORDER BY p.id{for_share_of('p', 'po')}"
    )


def ledger_lookup(operations: int) -> str:
    return f"SELECT operation_id, last_id FROM {LEDGER} WHERE operation_id IN ({placeholders(operations)})"


def partition_candidates(*, table: str, timestamp_column: str) -> str:
    """One partition's next candidates after its cursor: (count, last id)."""
    return (
        f"SELECT COUNT(*), MAX(c.id) FROM (SELECT r.id FROM {table} r WHERE r.property_id = %s AND r.id > %s"
        f" AND r.{timestamp_column} < %s ORDER BY r.property_id, r.id LIMIT %s) c"
    )


def group_candidates(*, table: str, timestamp_column: str, jobs: int) -> str:
    """Candidates of several partitions of one kind, in one statement, reading
    no more than one batch of rows in all.

    Per partition (in the listed order ``ord``): the next candidate ids after
    its cursor (an index range scan, ``LIMIT`` per partition), and over all of
    them a global ``LIMIT``: a lateral join is a nested loop over the list in
    its order, so the scan stops once one batch (plus one row) is found
    instead of counting a full batch for every partition leased. Returns
    (ord, job id, rows returned, candidates, last candidate id); when the
    global limit was reached the partition with the highest ``ord`` may be
    cut short and is not counted this time. Parameters: the list (each row
    with its partition's own limit, its batch size), the global limit."""
    rows = values_list(jobs, ["integer", "bigint", "bigint", "bigint", "timestamptz", "integer"])
    return (
        f"WITH g(ord, job_id, property_id, after_id, cutoff, lim) AS (VALUES {rows})"
        f" SELECT x.ord, x.job_id, COUNT(*), COUNT(x.id), MAX(x.id) FROM ("
        f"SELECT g.ord, g.job_id, c.id FROM g LEFT JOIN LATERAL ("
        f"SELECT r.id FROM {table} r WHERE r.property_id = g.property_id AND r.id > g.after_id"
        f" AND r.{timestamp_column} < g.cutoff ORDER BY r.property_id, r.id LIMIT g.lim) c ON true LIMIT %s) x"
        f" GROUP BY x.ord, x.job_id"
    )


def group_delete(*, table: str, predicate: str, jobs: int, returning: str | None) -> str:
    """Delete the eligible rows of every partition's candidate range; returns
    one row per deleted record: its property id (a group holds one job per
    property and kind) and, for kinds with attachments, the document id and
    the record's id (the outbox keeps which record named which document).
    ``predicate`` is the eligibility predicate over ``table`` with the
    cutoff ``g.cutoff``: the hold check is inside this statement."""
    rows = values_list(jobs, ["bigint", "bigint", "bigint", "timestamptz"])
    cte = f"WITH g(property_id, after_id, last_id, cutoff) AS (VALUES {rows})"
    extra = f", {table}.{returning}, {table}.id" if returning else ""
    in_range = (
        f"{table}.property_id = g.property_id AND {table}.id > g.after_id AND {table}.id <= g.last_id AND {predicate}"
    )
    if is_postgres():
        return f"{cte} DELETE FROM {table} USING g WHERE {in_range} RETURNING {table}.property_id{extra}"
    # SQLite has no DELETE … USING.
    return (
        f"{cte} DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM g WHERE {in_range})"
        f" RETURNING {table}.property_id{extra}"
    )


def ledger_insert_many(rows: int) -> str:
    one = "(" + placeholders(13) + ")"
    return (
        f"INSERT INTO {LEDGER} (operation_id, job_id, portfolio_id, property_id, record_kind,"
        f" policy_version_id, cutoff, after_id, last_id, batch_limit, candidates, rows_deleted, applied_at)"
        f" VALUES {', '.join([one] * rows)}"
    )


def group_jobs_advance(jobs: int) -> str:
    """Every job of the transaction in one statement: cursor, counts, lease
    renewal, and — for those that finished — state ``done`` with their
    outcome: a fixed one (``scope_missing``, ``policy_withdrawn``) or, from
    the totals, ``deleted`` / ``held`` / ``nothing_eligible``."""
    rows = values_list(jobs, ["bigint", "bigint", "bigint", "bigint", "bigint", "bigint", "varchar", "integer"])
    finishing = "g.finish = 1"
    return (
        f"WITH g(job_id, new_cursor, d_batches, d_deleted, d_held, finish, fixed_outcome, size) AS (VALUES {rows})"
        f" UPDATE {JOB} SET cursor = g.new_cursor, batches = batches + g.d_batches,"
        f" batch_size = CASE WHEN g.size > 0 THEN g.size ELSE batch_size END,"
        f" rows_deleted = rows_deleted + g.d_deleted, rows_held = rows_held + g.d_held,"
        f" state = CASE WHEN {finishing} THEN '{JobState.DONE}' ELSE state END,"
        f" outcome = CASE WHEN {finishing} THEN CASE WHEN g.fixed_outcome <> '' THEN g.fixed_outcome"
        f" WHEN rows_deleted + g.d_deleted > 0 THEN '{JobOutcome.DELETED}'"
        f" WHEN rows_held + g.d_held > 0 THEN '{JobOutcome.HELD}'"
        f" ELSE '{JobOutcome.NOTHING_ELIGIBLE}' END ELSE outcome END,"
        f" finished_at = CASE WHEN {finishing} THEN {typed('timestamptz')} ELSE finished_at END,"
        f" lease_token = CASE WHEN {finishing} THEN NULL ELSE lease_token END,"
        f" lease_owner = CASE WHEN {finishing} THEN '' ELSE lease_owner END,"
        f" lease_expires_at = CASE WHEN {finishing} THEN NULL ELSE {typed('timestamptz')} END"
        f" FROM g WHERE {JOB}.id = g.job_id RETURNING {JOB}.id, {JOB}.state, {JOB}.outcome"
    )


def lease_caps_lock(stripes: int) -> str:
    """The cap locks of several stripes, taken in stripe order
    (PostgreSQL only; parameters: the namespace, then the stripe numbers)."""
    rows = values_list(stripes, ["integer"])
    return f"SELECT pg_advisory_xact_lock(CAST(%s AS integer), v.p) FROM (VALUES {rows}) AS v(p) ORDER BY v.p"
