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

from cleanup_ops.models import CleanupJob, LedgerEntry, RateBucket
from properties.models import Portfolio, Property
from retention.models import PolicyVersion, RetentionPolicy

JOB = CleanupJob._meta.db_table
LEDGER = LedgerEntry._meta.db_table
BUCKET = RateBucket._meta.db_table
PROPERTY = Property._meta.db_table
PORTFOLIO = Portfolio._meta.db_table
POLICY = RetentionPolicy._meta.db_table
VERSION = PolicyVersion._meta.db_table

# pg_advisory_xact_lock(namespace, portfolio) around a lease's cap check.
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
    """Serialises the cap check and the claim of one portfolio (PostgreSQL only)."""
    return "SELECT pg_advisory_xact_lock(%s, %s)"


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


# --- The batch transaction ------------------------------------------------------


def scope_lock_and_policy() -> str:
    """Portfolio and property rows ``FOR SHARE`` (the legal-hold race) and the
    active policy version of the job's kind, in one round trip."""
    return (
        f"SELECT p.id, v.id, v.retention_days, v.enabled"
        f" FROM {PROPERTY} p"
        f" JOIN {PORTFOLIO} po ON po.id = p.portfolio_id"
        f" LEFT JOIN {POLICY} rp ON rp.portfolio_id = po.id AND rp.record_kind = %s"
        f" LEFT JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = %s"
        f" WHERE p.id = %s AND po.id = %s{for_share_of('p', 'po')}"
    )


def batch_replay_and_candidates(*, table: str, timestamp_column: str) -> str:
    """(ledger row's last id for this operation or NULL, candidates, last candidate id)."""
    return (
        f"SELECT (SELECT last_id FROM {LEDGER} WHERE operation_id = %s), COUNT(*), MAX(c.id) FROM ("
        f"SELECT r.id FROM {table} r WHERE r.property_id = %s AND r.id > %s AND r.{timestamp_column} < %s"
        f" ORDER BY r.property_id, r.id LIMIT %s) c"
    )


def batch_delete(*, table: str, predicate: str, returning: str | None) -> str:
    """Delete the eligible rows of the candidate range; the hold check is in ``predicate``."""
    sql = f"DELETE FROM {table} WHERE {table}.property_id = %s AND {table}.id > %s AND {table}.id <= %s AND {predicate}"
    return sql + (f" RETURNING {returning}" if returning else "")


def ledger_insert() -> str:
    return (
        f"INSERT INTO {LEDGER} (operation_id, job_id, portfolio_id, property_id, record_kind,"
        f" policy_version_id, cutoff, after_id, last_id, batch_limit, candidates, rows_deleted, applied_at)"
        f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    )


def job_advance() -> str:
    """Move the cursor past a batch, count it and renew the lease."""
    return (
        f"UPDATE {JOB} SET cursor = %s, batches = batches + 1, rows_deleted = rows_deleted + %s,"
        f" rows_held = rows_held + %s, lease_expires_at = %s WHERE id = %s RETURNING rows_deleted, rows_held"
    )


def job_skip_replayed() -> str:
    """A replayed batch: move the cursor to the ledger row's last id, renew the lease."""
    return f"UPDATE {JOB} SET cursor = %s, lease_expires_at = %s WHERE id = %s"


def purge_advance() -> str:
    """One document done: cursor + 1, counted as a request, lease renewed."""
    return f"UPDATE {JOB} SET cursor = %s, batches = batches + 1, lease_expires_at = %s WHERE id = %s"


# --- Admission ------------------------------------------------------------------


def properties_with_expired_rows(*, table: str, timestamp_column: str) -> str:
    """Properties of one portfolio with at least one row of a kind past a cutoff."""
    return (
        f"SELECT p.id FROM {PROPERTY} p WHERE p.portfolio_id = %s AND EXISTS ("
        f"SELECT 1 FROM {table} r WHERE r.property_id = p.id AND r.{timestamp_column} < %s)"
        " ORDER BY p.id"
    )


# --- Rate limits ----------------------------------------------------------------


def bucket_take() -> str:
    """Refill for the time elapsed and take one token, only if one is there."""
    least, greatest = least_greatest()
    refill = f"{least}(%s, tokens + {greatest}(0, %s - updated_at) * %s)"
    # 1e-9: a whole token accrued in float steps must not miss by rounding.
    return f"UPDATE {BUCKET} SET tokens = {refill} - 1, updated_at = %s WHERE name = %s AND {refill} >= 0.999999999"


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
