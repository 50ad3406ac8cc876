"""The pipeline's raw SQL, by name, and its vendor switch.

Why raw SQL at all: on the per-batch path every statement counts (an ORM query
that builds model instances costs several plain round trips), and a few
statements need what the ORM does not say (``FOR SHARE OF``, ``RETURNING`` on
a DELETE with a correlated hold check, advisory locks, percentiles). Everything
else (admission's bulk insert, the admin, the API) uses the ORM.

Each statement is a function named after what it does, returning the SQL text
with ``%s`` placeholders; the callers pass the parameters. Table and column
names come from the models' ``_meta``, never from input. The PostgreSQL/SQLite
differences *in a statement's text* live in the small ``vendor`` helpers
below: SQLite is the embedded demo database, it serialises writers, so its row
locks are simply left out. Where the two databases take a different *path*
(another statement, or none), the caller branches on ``is_postgres()``
itself; today ``execution/batches.py``, ``execution/leases.py``,
``downstream/purge.py``, ``selectors.py`` and ``health.py`` do.

The ledger insert stays a named statement: through the ORM it would build a
model instance per batch for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection

from cleanup_ops.models import (
    OPEN_STATES,
    CleanupJob,
    DeadLetter,
    DeadLetterStatus,
    DeletedAttachment,
    DocumentDisposition,
    JobKind,
    JobState,
    LedgerEntry,
    RateBucket,
    Sweep,
    SweepStatus,
)
from retention.domain import portfolio_model, property_model, property_portfolio_column
from retention.models import LegalHold, PolicyVersion, RetentionPolicy
from retention.registry import RecordKindSpec

JOB = CleanupJob._meta.db_table
SWEEP = Sweep._meta.db_table
LEDGER = LedgerEntry._meta.db_table
LETTER = DeadLetter._meta.db_table
BUCKET = RateBucket._meta.db_table
# The host's customer and site tables (retention.domain): their keys, and the
# site's column naming its customer (RETENTION_PROPERTY_PORTFOLIO_FIELD).
PROPERTY = property_model()._meta.db_table
PORTFOLIO = portfolio_model()._meta.db_table
PROPERTY_PK = property_model()._meta.pk.column
PORTFOLIO_PK = portfolio_model()._meta.pk.column
PROPERTY_PORTFOLIO = property_portfolio_column()
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


def execute(sql: str, params: Sequence[Any] | Mapping[str, Any] = (), *, cur: Any = None) -> Any:
    """Run one statement on ``cur`` (or a fresh cursor) with positional
    (``%s``) or named (``%(name)s``) parameters; returns the cursor used when
    one was passed, else the fetched rows."""
    bound = dict(params) if isinstance(params, Mapping) else list(params)
    if cur is not None:
        cur.execute(sql, bound)
        return cur
    with connection.cursor() as fresh:
        fresh.execute(sql, bound)
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


# --- Sweeps ---------------------------------------------------------------------


def sweep_lock_running() -> str:
    """Lock a running sweep's row (no row: not running). Parameters: ``sweep``."""
    return f"SELECT id FROM {SWEEP} WHERE id = %(sweep)s AND status = '{SweepStatus.RUNNING}'{for_update()}"


def sweep_finish_if_drained() -> str:
    """Finish the sweep if none of its jobs is open: drained, or drained with
    dead letters when one of its jobs is dead and not redriven (a redriven
    job's work is its redrive's: once that is done, the sweep is drained).
    Run after ``sweep_lock_running`` in the same transaction (a statement of
    its own, so its snapshot is taken once the lock is held). Parameters:
    ``sweep``, ``now``."""
    open_states = ", ".join(f"'{state}'" for state in OPEN_STATES)
    return (
        f"UPDATE {SWEEP} SET finished_at = %(now)s, status = CASE WHEN EXISTS (SELECT 1 FROM {JOB} j"
        f" WHERE j.sweep_id = %(sweep)s AND j.state = '{JobState.DEAD}' AND NOT EXISTS (SELECT 1 FROM {LETTER} d"
        f" WHERE d.job_id = j.id AND d.status = '{DeadLetterStatus.REDRIVEN}'))"
        f" THEN '{SweepStatus.DRAINED_WITH_DEAD_LETTERS}' ELSE '{SweepStatus.DRAINED}' END"
        f" WHERE id = %(sweep)s AND NOT EXISTS (SELECT 1 FROM {JOB} j WHERE j.sweep_id = %(sweep)s"
        f" AND j.state IN ({open_states}))"
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
        f"SELECT p.{PROPERTY_PK} FROM {PROPERTY} p JOIN {PORTFOLIO} po ON po.{PORTFOLIO_PK} = p.{PROPERTY_PORTFOLIO}"
        f" WHERE p.{PROPERTY_PK} IN (SELECT a.property_id FROM {refs} a WHERE a.document_id = %s)"
        f" ORDER BY p.{PROPERTY_PK}{for_share_of('p', 'po')}"
    )


def document_portfolios_lock() -> str:
    """The portfolio rows of every deleted record of a kind without a
    property that named a document (``property_id`` NULL), ``FOR SHARE`` in
    id order: such a batch's scope lock, taken by the purge after
    ``document_scopes_lock``. Parameter: the document id."""
    refs = DeletedAttachment._meta.db_table
    return (
        f"SELECT po.{PORTFOLIO_PK} FROM {PORTFOLIO} po WHERE po.{PORTFOLIO_PK} IN (SELECT a.portfolio_id FROM {refs} a"
        f" WHERE a.document_id = %s AND a.property_id IS NULL) ORDER BY po.{PORTFOLIO_PK}{for_share_of('po')}"
    )


def document_portfolios_lock_many() -> str:
    """``document_portfolios_lock`` for a batch of documents (PostgreSQL).
    Parameter: the document ids (an array)."""
    refs = DeletedAttachment._meta.db_table
    return (
        f"SELECT po.{PORTFOLIO_PK} FROM {PORTFOLIO} po WHERE po.{PORTFOLIO_PK} IN (SELECT a.portfolio_id FROM {refs} a"
        f" WHERE a.document_id = ANY(%s) AND a.property_id IS NULL) ORDER BY po.{PORTFOLIO_PK}{for_share_of('po')}"
    )


def document_scopes_lock_many() -> str:
    """``document_scopes_lock`` for a batch of documents (PostgreSQL): the
    scope rows of every deleted record that named any of them. Parameter:
    the document ids (an array)."""
    refs = DeletedAttachment._meta.db_table
    return (
        f"SELECT p.{PROPERTY_PK} FROM {PROPERTY} p JOIN {PORTFOLIO} po ON po.{PORTFOLIO_PK} = p.{PROPERTY_PORTFOLIO}"
        f" WHERE p.{PROPERTY_PK} IN (SELECT a.property_id FROM {refs} a WHERE a.document_id = ANY(%s))"
        f" ORDER BY p.{PROPERTY_PK}{for_share_of('p', 'po')}"
    )


DISPOSITION_COLUMNS: Columns = (("document_id", "varchar"),)


def dispositions_take(documents: int) -> str:
    """A batch's part in each document's one decision: the ``DocumentDisposition``
    row of every document its deleted records named, created or locked (an
    ``ON CONFLICT DO UPDATE`` locks the row whether or not its condition lets
    it update), in document id order, held until the batch commits. A purge
    decides about a document only under that row's ``FOR UPDATE``, so the
    deleted records it reads (``DeletedAttachment``, written in the same
    batch) cannot grow while it decides: a batch naming the document either
    committed before the purge took the row, or waits for the purge's
    decision to end. A document already ``purged`` whose id a deleted record
    names again was reused for a new file: it gets a fresh decision
    (``pending``). Parameters: ``x`` (``DISPOSITION_COLUMNS``), ``pending``,
    ``purged``."""
    table = DocumentDisposition._meta.db_table
    return (
        f"WITH {rows_cte('x', DISPOSITION_COLUMNS, documents)}"
        f" INSERT INTO {table} (document_id, state) SELECT x.document_id, %(pending)s FROM x"
        # WHERE true: SQLite would otherwise read ON CONFLICT as a join's ON.
        f" WHERE true ORDER BY x.document_id"
        f" ON CONFLICT (document_id) DO UPDATE SET state = %(pending)s, decided_by_id = NULL, decided_at = NULL"
        f" WHERE {table}.state = %(purged)s"
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


def _partitions_due(spec: RecordKindSpec) -> tuple[str, str]:
    """(CTE, WHERE) of the partitions of one kind due at a slot: every
    property of a portfolio whose active, enabled version of the kind's policy
    has a cutoff some row of the property is older than. Held rows count: such
    a partition still gets a job, which ends ``held`` and so shows in the
    sweep's report. Parameters: slot, kind."""
    if not spec.has_property:
        # A kind without a property: the partition is the portfolio.
        cte = (
            f"WITH due AS (SELECT po.{PORTFOLIO_PK} AS portfolio_id, {typed_null('bigint')} AS property_id,"
            f" v.id AS version_id, {_slot_minus_retention()} AS cutoff"
            f" FROM {PORTFOLIO} po JOIN {POLICY} rp ON rp.portfolio_id = po.{PORTFOLIO_PK} AND rp.record_kind = %s"
            f" JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = 'approved' AND v.enabled)"
        )
    else:
        cte = (
            f"WITH due AS (SELECT p.{PROPERTY_PORTFOLIO} AS portfolio_id, p.{PROPERTY_PK} AS property_id,"
            f" v.id AS version_id, {_slot_minus_retention()} AS cutoff"
            f" FROM {PROPERTY} p JOIN {POLICY} rp ON rp.portfolio_id = p.{PROPERTY_PORTFOLIO} AND rp.record_kind = %s"
            f" JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = 'approved' AND v.enabled)"
        )
    partition = spec.in_partition("r", property_sql="d.property_id", portfolio_sql="d.portfolio_id")
    where = (
        f"EXISTS (SELECT 1 FROM {spec.table} r WHERE {partition}"
        f" AND r.{spec.timestamp_column} < {spec.cutoff_sql('d.cutoff')})"
    )
    return cte, where


def typed_null(sql_type: str) -> str:
    return f"CAST(NULL AS {sql_type})" if is_postgres() else "NULL"


def _open_elsewhere(spec: RecordKindSpec) -> str:
    """An open delete job of the same partition in another sweep (parameters: kind, sweep id)."""
    states = ", ".join(f"'{state}'" for state in OPEN_STATES)
    same_property = "o.property_id = d.property_id" if spec.has_property else "o.property_id IS NULL"
    return (
        f"EXISTS (SELECT 1 FROM {JOB} o WHERE o.portfolio_id = d.portfolio_id AND {same_property}"
        f" AND o.record_kind = %s AND o.state IN ({states}) AND o.job_kind = '{JobKind.DELETE}' AND o.sweep_id <> %s)"
    )


def partitions_due(spec: RecordKindSpec) -> str:
    """(portfolio id, property id, version id, cutoff) of one kind; parameters: slot, kind."""
    cte, where = _partitions_due(spec)
    return f"{cte} SELECT d.portfolio_id, d.property_id, d.version_id, d.cutoff FROM due d WHERE {where}" + (
        " ORDER BY d.portfolio_id, d.property_id"
    )


def admit_partitions(spec: RecordKindSpec) -> str:
    """One job per due partition of one kind with no open delete job elsewhere,
    in one set-based INSERT … SELECT; a key that exists (a crashed admission
    being completed) is skipped. Ten parameters, in this order: slot, kind
    (the policy's), sweep id, key prefix (the sweep's key), kind (the key's
    last part), kind (the job's ``record_kind``), available at, created at,
    then kind and sweep id (for the open-elsewhere test)."""
    cte, where = _partitions_due(spec)
    text = typed("varchar")
    # Without a property the key's property part is "-": <sweep>:<portfolio>:-:<kind>.
    prop = "d.property_id" if spec.has_property else "'-'"
    key = f"{text} || ':' || d.portfolio_id || ':' || {prop} || ':' || {text}"
    return (
        f"{cte} INSERT INTO {JOB} (sweep_id, key, job_kind, portfolio_id, property_id, record_kind, policy_version_id,"
        f" cutoff, state, outcome, available_at, lease_owner, leases, attempt, last_error_category,"
        f" last_error_class, cursor, batches, rows_deleted, rows_held, created_at)"
        f" SELECT {typed('bigint')}, {key}, '{JobKind.DELETE}', d.portfolio_id, d.property_id, {text},"
        f" d.version_id, d.cutoff,"
        f" '{JobState.PENDING}', '', {typed('timestamptz')}, '', 0, 0, '', '', 0, 0, 0, 0, {typed('timestamptz')}"
        f" FROM due d WHERE {where} AND NOT {_open_elsewhere(spec)} ORDER BY d.portfolio_id, d.property_id"
        # No conflict target: an existing key (a crashed admission being
        # completed) and an open job of the partition admitted concurrently
        # by another sweep (the partial unique index) are both skipped.
        f" ON CONFLICT DO NOTHING"
    )


def count_carried_over(spec: RecordKindSpec) -> str:
    """Due partitions of one kind skipped because a delete job of theirs is
    still open in another sweep. Parameters: slot, kind, kind, sweep id."""
    cte, where = _partitions_due(spec)
    return f"{cte} SELECT COUNT(*) FROM due d WHERE {where} AND {_open_elsewhere(spec)}"


# --- Rate limits ----------------------------------------------------------------


def bucket_reserve() -> str:
    """Reserve one token from each bucket for the earliest instant they are there (PostgreSQL).

    Parameters (named): ``names``, ``rates``, ``bursts``, ``shared`` (arrays,
    in lock order: the portfolios' buckets, then the shared ones), ``n`` (how
    many), ``now`` and ``max_wait`` (epoch seconds, seconds). The rows are
    locked in the order given (``FOR UPDATE`` under ``ORDER BY``), so two
    workers never wait on each other in a cycle. A bucket's *ready* instant:
    from the later of now and its state's instant (``updated_at``, in the
    future when reserved), the time its missing part of a token takes to
    refill (to within 1e-9: a whole token accrued in float steps must not miss
    by rounding). The instant ``at``: the latest ready of the shared buckets and the
    earliest of the portfolios'. When every row is there and ``at`` is within
    ``max_wait``, each bucket ready by ``at`` moves to its state at ``at`` less
    one token. One row per bucket found: name, its ready instant, ``at``, and
    how many buckets were taken from (0: none, nothing changed).
    ``ratelimit.bucket_ready`` is the same arithmetic in Python.
    """
    return (
        "WITH want AS (SELECT * FROM unnest(%(names)s::text[], %(rates)s::float8[], %(bursts)s::float8[],"
        " %(shared)s::bool[]) WITH ORDINALITY AS w(name, rate, burst, shared, ord)),"
        f" held AS (SELECT b.name, b.tokens, b.updated_at, w.rate, w.burst, w.shared, w.ord FROM {BUCKET} b"
        " JOIN want w ON w.name = b.name ORDER BY w.ord FOR UPDATE OF b),"
        " ready AS (SELECT h.*, GREATEST(%(now)s::float8, h.updated_at) + GREATEST(0, 0.999999999 - LEAST(h.burst,"
        " h.tokens + GREATEST(0, %(now)s::float8 - h.updated_at) * h.rate)) / h.rate AS ready FROM held h),"
        " plan AS (SELECT GREATEST(%(now)s::float8, COALESCE(MAX(ready) FILTER (WHERE shared), %(now)s::float8),"
        " COALESCE(MIN(ready) FILTER (WHERE NOT shared), %(now)s::float8)) AS at, COUNT(*) = %(n)s AS complete"
        " FROM ready),"
        f" taken AS (UPDATE {BUCKET} b SET tokens = LEAST(r.burst, r.tokens + (p.at - r.updated_at) * r.rate) - 1,"
        " updated_at = p.at FROM ready r, plan p WHERE b.name = r.name AND r.ready <= p.at AND p.complete"
        " AND p.at - %(now)s::float8 <= %(max_wait)s::float8 RETURNING b.name)"
        " SELECT r.name, r.ready, p.at, (SELECT COUNT(*) FROM taken) FROM ready r, plan p ORDER BY r.ord"
    )


def bucket_give_back_many() -> str:
    """One token back into each named bucket, capped at its burst, the rows
    locked in the order given (a reservation's order). Parameters (named):
    ``names``, ``bursts`` (PostgreSQL)."""
    return (
        f"WITH back AS (SELECT b.name, w.burst, w.ord FROM {BUCKET} b JOIN unnest(%(names)s::text[],"
        " %(bursts)s::float8[]) WITH ORDINALITY AS w(name, burst, ord) ON w.name = b.name"
        f" ORDER BY w.ord FOR UPDATE OF b) UPDATE {BUCKET} b SET tokens = LEAST(back.burst, b.tokens + 1)"
        " FROM back WHERE b.name = back.name"
    )


def bucket_give_back() -> str:
    """Return one token taken for a transaction that did not use it (capped at the burst)."""
    least, _ = least_greatest()
    return f"UPDATE {BUCKET} SET tokens = {least}(%s, tokens + 1) WHERE name = %s"


def bucket_touch(n: int) -> str:
    """A write that changes nothing (SQLite: takes the write lock before the read)."""
    return f"UPDATE {BUCKET} SET name = name WHERE name IN ({', '.join(['%s'] * n)})"


def bucket_state(n: int) -> str:
    return f"SELECT name, tokens, updated_at FROM {BUCKET} WHERE name IN ({', '.join(['%s'] * n)})"


def bucket_set() -> str:
    return f"UPDATE {BUCKET} SET tokens = %s, updated_at = %s WHERE name = %s"


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


def retention_debt(spec: RecordKindSpec, *, hold_sql: str, cutoffs: int) -> str:
    """Per portfolio: overdue, held, overdue beyond the grace, oldest overdue
    timestamp, for ``cutoffs`` (portfolio, cutoff, late) rows of parameters."""
    ts, table = spec.timestamp_column, spec.table
    if spec.property_shape != "direct":
        # A path or no property: the rows of the portfolio (through the path,
        # those of its properties), read by one join on either database.
        row_sql = (
            "(CAST(%s AS bigint), CAST(%s AS timestamptz), CAST(%s AS timestamptz))"
            if is_postgres()
            else "(%s, %s, %s)"
        )
        if spec.has_property:
            source = (
                f" FROM c JOIN {PROPERTY} p ON p.{PROPERTY_PORTFOLIO} = c.portfolio_id"
                f" JOIN (SELECT {spec.property_of('r')} AS property_id, r.{ts} AS ts, {hold_sql} AS held"
                f" FROM {table} r) x"
                f" ON x.property_id = p.{PROPERTY_PK} AND x.ts < {spec.cutoff_sql('c.cutoff')}"
            )
        else:
            source = (
                f" FROM c JOIN (SELECT r.{spec.portfolio_column} AS portfolio_id, r.{ts} AS ts, {hold_sql} AS held"
                f" FROM {table} r) x ON x.portfolio_id = c.portfolio_id AND x.ts < {spec.cutoff_sql('c.cutoff')}"
            )
    elif is_postgres():
        prop = spec.property_column
        # Per property, an index range scan on (property, timestamp): the cost
        # follows the overdue rows, not the table. OFFSET 0 keeps the hold
        # test computed once per row instead of once per aggregate.
        row_sql = "(CAST(%s AS bigint), CAST(%s AS timestamptz), CAST(%s AS timestamptz))"
        source = (
            f" FROM c JOIN {PROPERTY} p ON p.{PROPERTY_PORTFOLIO} = c.portfolio_id CROSS JOIN LATERAL"
            f" (SELECT r.{ts} AS ts, {hold_sql} AS held FROM {table} r"
            f" WHERE r.{prop} = p.{PROPERTY_PK} AND r.{ts} < {spec.cutoff_sql('c.cutoff')} OFFSET 0) x"
        )
    else:
        prop = spec.property_column
        row_sql = "(%s, %s, %s)"
        source = (
            f" FROM c JOIN {PROPERTY} p ON p.{PROPERTY_PORTFOLIO} = c.portfolio_id"
            f" JOIN (SELECT r.{prop} AS property_id, r.{ts} AS ts, {hold_sql} AS held FROM {table} r) x"
            f" ON x.property_id = p.{PROPERTY_PK} AND x.ts < {spec.cutoff_sql('c.cutoff')}"
        )
    return (
        f"WITH c(portfolio_id, cutoff, late) AS (VALUES {', '.join([row_sql] * cutoffs)})"
        " SELECT c.portfolio_id, MIN(c.cutoff),"
        " SUM(CASE WHEN x.held THEN 0 ELSE 1 END), SUM(CASE WHEN x.held THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN NOT x.held AND x.ts < c.late THEN 1 ELSE 0 END), MIN(CASE WHEN x.held THEN NULL ELSE x.ts END)"
        f"{source} GROUP BY c.portfolio_id"
    )


# --- The multi-partition batch --------------------------------------------------
# One transaction over one or several partitions. Every statement takes named
# parameters; the list of partitions is a table ``g`` (``rows_cte``): on
# PostgreSQL one array parameter per column through ``unnest``, so the text is
# the same whatever the number of partitions (psycopg parses it once and
# caches it) and a group of 100 partitions quotes six arrays, not 600 values;
# on SQLite (the demo) a ``VALUES`` list with one named parameter per cell.
# PostgreSQL needs the types spelled out; SQLite must not get them (its CAST
# to an unknown type name would turn a timestamp into a number).

Columns = Sequence[tuple[str, str]]  # (name, PostgreSQL type)


def typed(sql_type: str) -> str:
    return f"CAST(%s AS {sql_type})" if is_postgres() else "%s"


def values_list(rows: int, types: Sequence[str]) -> str:
    row = "(" + ", ".join(typed(t) for t in types) + ")"
    return ", ".join([row] * rows)


def rows_cte(name: str, columns: Columns, rows: int) -> str:
    """``name(col, …) AS (…)``, the body of a ``WITH`` over ``rows`` rows;
    ``rows_params`` gives its parameters."""
    names = ", ".join(column for column, _ in columns)
    if is_postgres():
        arrays = ", ".join(f"CAST(%({name}_{column})s AS {sql_type}[])" for column, sql_type in columns)
        return f"{name}({names}) AS (SELECT * FROM unnest({arrays}))"
    cells = ("(" + ", ".join(f"%({name}_{column}_{i})s" for column, _ in columns) + ")" for i in range(rows))
    return f"{name}({names}) AS (VALUES {', '.join(cells)})"


def rows_params(name: str, columns: Columns, rows: Sequence[Any]) -> dict[str, Any]:
    """The parameters of ``rows_cte(name, columns, len(rows))``: each row an
    object with an attribute (or a mapping with a key) per column."""

    def cell(row: Any, column: str) -> Any:
        return row[column] if isinstance(row, Mapping) else getattr(row, column)

    if is_postgres():
        return {f"{name}_{column}": [cell(row, column) for row in rows] for column, _ in columns}
    return {f"{name}_{column}_{i}": cell(row, column) for i, row in enumerate(rows) for column, _ in columns}


def any_of(name: str, sql_type: str, values: int) -> str:
    """``= ANY(array)`` on PostgreSQL, ``IN (…)`` on SQLite; ``any_params`` gives the parameters."""
    if is_postgres():
        return f"= ANY(CAST(%({name})s AS {sql_type}[]))"
    return "IN (" + ", ".join(f"%({name}_{i})s" for i in range(values)) + ")"


def any_params(name: str, values: Sequence[Any]) -> dict[str, Any]:
    if is_postgres():
        return {name: list(values)}
    return {f"{name}_{i}": value for i, value in enumerate(values)}


def named(statement: str, params: Sequence[Any], *, prefix: str) -> tuple[str, dict[str, Any]]:
    """A fragment written with ``%s`` placeholders (the eligibility predicate)
    turned into named ones, ``%(prefix_0)s`` …, for a statement that names its
    parameters."""
    parts = statement.split("%s")
    if len(parts) - 1 != len(params):
        raise ValueError(f"{prefix}: {len(parts) - 1} placeholders for {len(params)} parameters")
    text = parts[0] + "".join(f"%({prefix}_{i})s{part}" for i, part in enumerate(parts[1:]))
    return text, {f"{prefix}_{i}": value for i, value in enumerate(params)}


FENCE_COLUMNS = "id, cursor, rows_deleted, rows_held"

SCOPE_COLUMNS: Columns = (
    ("job_id", "bigint"),
    ("property_id", "bigint"),
    ("portfolio_id", "bigint"),
    ("record_kind", "varchar"),
)


def group_fence_scopes_and_policies(jobs: int, *, portfolio_partitions: bool = False) -> str:
    """Steps a-c of the batch for a group, in one statement. The fence ``f``:
    those of the group's jobs whose lease is still ours — cursor and the
    totals so far (the finishing outcome is decided from them) — rows locked
    in id order (two groups never wait on each other in a cycle). The scope
    ``s``: property and portfolio rows ``FOR SHARE`` (the hold race) in
    property id order, and each job's active policy version. ``s`` is locked
    after a sort over a join that reads ``f`` whole, so every job row is
    locked before any property or portfolio row. Per job still ours: id,
    cursor, rows deleted, rows held, whether its scope exists, and the
    version (id, days, enabled, batch size; NULLs when none). On SQLite the
    same statement without the locks. Parameters: ``g`` (``SCOPE_COLUMNS``),
    ``ids`` (``any_params``), ``state``, ``token``, ``now``, ``approved``.

    ``portfolio_partitions``: the group has jobs of a kind without a
    property (``property_id`` NULL). Their scope is the portfolio row alone,
    locked ``FOR SHARE`` by a second scope CTE (in portfolio id order, after
    the property jobs' rows); a group without such jobs gets the text above
    unchanged."""
    materialized = "MATERIALIZED " if is_postgres() else ""
    scopes = "s"
    portfolio_scope = ""
    if portfolio_partitions:
        scopes = "(SELECT * FROM s UNION ALL SELECT * FROM t) s"
        portfolio_scope = (
            f", t AS {materialized}(SELECT g.job_id, v.id AS version_id, v.retention_days, v.enabled, v.batch_size"
            f" FROM g JOIN f ON f.id = g.job_id"
            f" JOIN {PORTFOLIO} po ON po.{PORTFOLIO_PK} = g.portfolio_id AND g.property_id IS NULL"
            f" LEFT JOIN {POLICY} rp ON rp.portfolio_id = po.{PORTFOLIO_PK} AND rp.record_kind = g.record_kind"
            f" LEFT JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = %(approved)s"
            f" ORDER BY po.{PORTFOLIO_PK}{for_share_of('po')})"
        )
    return (
        f"WITH {rows_cte('g', SCOPE_COLUMNS, jobs)},"
        f" f AS {materialized}(SELECT {FENCE_COLUMNS} FROM {JOB} WHERE id {any_of('ids', 'bigint', jobs)}"
        f" AND state = %(state)s AND lease_token = %(token)s AND lease_expires_at > %(now)s"
        f" ORDER BY id{for_update()}),"
        f" s AS {materialized}(SELECT g.job_id, v.id AS version_id, v.retention_days, v.enabled, v.batch_size"
        f" FROM g JOIN f ON f.id = g.job_id"
        f" JOIN {PROPERTY} p ON p.{PROPERTY_PK} = g.property_id"
        f" JOIN {PORTFOLIO} po ON po.{PORTFOLIO_PK} = p.{PROPERTY_PORTFOLIO} AND po.{PORTFOLIO_PK} = g.portfolio_id"
        f" LEFT JOIN {POLICY} rp ON rp.portfolio_id = po.{PORTFOLIO_PK} AND rp.record_kind = g.record_kind"
        f" LEFT JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = %(approved)s"
        f" ORDER BY p.{PROPERTY_PK}{for_share_of('p', 'po')}){portfolio_scope}"
        f" SELECT f.id, f.cursor, f.rows_deleted, f.rows_held, s.job_id IS NOT NULL, s.version_id,"
        f" s.retention_days, s.enabled, s.batch_size FROM f LEFT JOIN {scopes} ON s.job_id = f.id ORDER BY f.id"
    )


def ledger_lookup(operations: int) -> str:
    """Parameters: ``ops`` (``any_params``)."""
    return f"SELECT operation_id, last_id FROM {LEDGER} WHERE operation_id {any_of('ops', 'varchar', operations)}"


POLICY_COLUMNS: Columns = (("job_id", "bigint"), ("portfolio_id", "bigint"), ("record_kind", "varchar"))


def policies_and_ledger_lookup(*, jobs: int, operations: int) -> str:
    """Lock, then read: the policy decision of the batch, read by a statement
    that starts once every scope lock is held (``group_fence_scopes_and_policies``
    took them), so under READ COMMITTED it sees every version approved before
    those locks were granted — and approving takes the portfolio row
    ``FOR UPDATE``, so none can commit after them until the batch does. In
    the same round trip, the replay lookup of the operation ids computed from
    the first statement's reading of the policy (the caller looks again in
    the rare case the two readings differ). Rows: (job id, version id, days,
    enabled, batch size, NULL, NULL) per job, then (NULL, …, operation id,
    last id) per ledger row found. Parameters: ``p`` (``POLICY_COLUMNS``),
    ``ops`` (``any_params``), ``approved``."""
    return (
        f"WITH {rows_cte('p', POLICY_COLUMNS, jobs)}"
        f" SELECT p.job_id, v.id, v.retention_days, v.enabled, v.batch_size,"
        f" CAST(NULL AS varchar), CAST(NULL AS bigint) FROM p"
        f" LEFT JOIN {POLICY} rp ON rp.portfolio_id = p.portfolio_id AND rp.record_kind = p.record_kind"
        f" LEFT JOIN {VERSION} v ON v.policy_id = rp.id AND v.status = %(approved)s"
        f" UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, operation_id, last_id FROM {LEDGER}"
        f" WHERE operation_id {any_of('ops', 'varchar', operations)}"
    )


def _next_candidates(spec: RecordKindSpec) -> str:
    """The ids of one partition's next candidates after its cursor (the keyset walk).
    Parameters: ``property_id``, ``after_id``, ``cutoff``, ``lim``."""
    pk = spec.pk_column
    partition = spec.in_partition("r", property_sql="%(property_id)s", portfolio_sql="%(portfolio_id)s")
    return (
        f"SELECT r.{pk} AS id FROM {spec.table} r WHERE {partition} AND {spec.after('r', '%(after_id)s')}"
        f" AND r.{spec.timestamp_column} < {spec.cutoff_sql('%(cutoff)s')}"
        f" ORDER BY {spec.keyset_order('r')} LIMIT %(lim)s"
    )


def partition_candidates(spec: RecordKindSpec) -> str:
    """One partition's next candidates after its cursor: (count, last id, the
    ids — PostgreSQL, for ``group_delete``; NULL on SQLite). Parameters:
    ``_next_candidates``'s."""
    ids = "ARRAY_AGG(c.id)" if is_postgres() else "NULL"
    return f"SELECT COUNT(*), {spec.max_key('c.id')}, {ids} FROM ({_next_candidates(spec)}) c"


def partition_count_and_delete(spec: RecordKindSpec, *, predicate: str) -> str:
    """PostgreSQL: one partition's next candidates and the DELETE of those the
    eligibility ``predicate`` (cutoff ``%(cutoff)s``, its parameters named)
    admits, in one statement. The DELETE re-tests the scope (property and
    portfolio) as well as the predicate: a row the application moved while
    the DELETE waited for its row lock is re-checked by PostgreSQL as it is
    now, and no longer matches. The rows a hold kept are counted from the
    holds, never as candidates minus deleted (a row the application
    extended or deleted meanwhile was kept by nobody): every candidate under
    a hold over the partition's whole scope, else the candidates with a
    record hold (``CASE`` reads only the branch it takes). Returns a row
    (candidates, last candidate id, held, NULL), then per deleted record
    (NULL, NULL, record id, document id or NULL). The candidates are read
    once (a CTE used twice is materialised), planned with the partition's
    own values: the keyset walk. Parameters: ``_next_candidates``'s,
    ``portfolio_id``, ``kind`` and the predicate's."""
    table, pk = spec.table, spec.pk_column
    holds = LegalHold._meta.db_table
    document = f"{table}.{spec.attachment_column}" if spec.attachment_column else "NULL"
    hold_property = (
        "(h.property_id IS NULL OR h.property_id = %(property_id)s)" if spec.has_property else "h.property_id IS NULL"
    )
    scope = (
        "h.released_at IS NULL AND h.portfolio_id = %(portfolio_id)s"
        f" AND {hold_property}"
        " AND (h.record_kind = '' OR h.record_kind = %(kind)s)"
    )
    held = (
        f"CASE WHEN EXISTS (SELECT 1 FROM {holds} h WHERE {scope} AND {_scope_wide(spec)})"
        " THEN (SELECT COUNT(*) FROM c)"
        f" ELSE (SELECT COUNT(DISTINCT c.id) FROM {holds} h JOIN c ON c.id = {_hold_key(spec)} WHERE {scope}) END"
    )
    # The record's scope as it is now (the property through its path).
    # Not an index condition (see group_delete): fewer paths to plan.
    portfolio = f"({table}.{spec.portfolio_column} = %(portfolio_id)s) IS TRUE"
    if spec.has_property:
        in_property = spec.in_partition(table, property_sql="%(property_id)s", portfolio_sql="%(portfolio_id)s")
        rescope = f"{in_property} AND {portfolio}"
    else:
        rescope = portfolio
    # A non-integer key: the ids and the held count share a text column.
    record, held_cell = ("d.id", held) if spec.integer_key else ("CAST(d.id AS text)", f"CAST(({held}) AS text)")
    return (
        f"WITH c AS ({_next_candidates(spec)}),"
        f" d AS (DELETE FROM {table} USING c WHERE {table}.{pk} = c.id"
        f" AND {rescope}"
        f" AND {predicate} RETURNING {table}.{pk} AS id, CAST({document} AS text) AS document_id)"
        f" SELECT (SELECT COUNT(*) FROM c), (SELECT {spec.max_key('c.id')} FROM c),"
        f" {held_cell}, CAST(NULL AS text)"
        f" UNION ALL SELECT NULL, NULL, {record}, d.document_id FROM d"
    )


def _scope_wide(spec: RecordKindSpec) -> str:
    """A hold (alias ``h``) that names no record."""
    return "h.record_id IS NULL" if spec.integer_key else "h.record_key = ''"


def _hold_key(spec: RecordKindSpec) -> str:
    """The record a record hold (alias ``h``) names, as the key's type."""
    return "h.record_id" if spec.integer_key else spec.key_param("h.record_key")


CANDIDATE_COLUMNS: Columns = (
    ("ord", "integer"),
    ("job_id", "bigint"),
    ("property_id", "bigint"),
    ("after_id", "bigint"),
    ("cutoff", "timestamptz"),
    ("lim", "integer"),
)


def group_candidates(spec: RecordKindSpec, *, jobs: int) -> str:
    """Candidates of several partitions of one kind, in one statement, reading
    no more than one batch of rows in all.

    Per partition (in the listed order ``ord``): the next candidate ids after
    its cursor (an index range scan, ``LIMIT`` per partition), and over all of
    them a global ``LIMIT``: a lateral join is a nested loop over the list in
    its order, so the scan stops once one batch (plus one row) is found
    instead of counting a full batch for every partition leased. Returns
    (ord, job id, rows returned, candidates, last candidate id, the candidate
    ids — what ``group_delete`` deletes from); when the
    global limit was reached the partition with the highest ``ord`` may be
    cut short and is not counted this time. Parameters: ``g``
    (``CANDIDATE_COLUMNS``, each row with its partition's own limit, its
    batch size), ``budget`` (the global limit)."""
    pk = spec.pk_column
    partition = spec.in_partition("r", property_sql="g.property_id", portfolio_sql="g.portfolio_id")
    return (
        f"WITH {rows_cte('g', candidate_columns(spec), jobs)}"
        f" SELECT x.ord, x.job_id, COUNT(*), COUNT(x.id), {spec.max_key('x.id')},"
        f" ARRAY_AGG(x.id) FILTER (WHERE x.id IS NOT NULL) FROM ("
        f"SELECT g.ord, g.job_id, c.id FROM g LEFT JOIN LATERAL ("
        f"SELECT r.{pk} AS id FROM {spec.table} r WHERE {partition} AND {spec.after('r', 'g.after_id')}"
        f" AND r.{spec.timestamp_column} < {spec.cutoff_sql('g.cutoff')}"
        f" ORDER BY {spec.keyset_order('r')} LIMIT g.lim) c ON true"
        f" LIMIT %(budget)s) x GROUP BY x.ord, x.job_id"
    )


def candidate_columns(spec: RecordKindSpec) -> Columns:
    """``CANDIDATE_COLUMNS`` for ``spec``: the same for an integer key and a
    property; a text cursor for other keys, and the portfolio for a kind
    partitioned by it."""
    if spec.integer_key and spec.has_property:
        return CANDIDATE_COLUMNS
    after = ("after_id", spec.key_sql_type())
    columns = [after if name == "after_id" else (name, kind) for name, kind in CANDIDATE_COLUMNS]
    return (*columns, ("portfolio_id", "bigint"))


def delete_columns(spec: RecordKindSpec) -> Columns:
    """``DELETE_COLUMNS`` for ``spec`` (the cursor range as text for a non-integer key)."""
    if spec.integer_key:
        return DELETE_COLUMNS
    key = spec.key_sql_type()
    return tuple((name, key if name in ("after_id", "last_id") else kind) for name, kind in DELETE_COLUMNS)


DELETE_COLUMNS: Columns = (
    ("property_id", "bigint"),
    ("portfolio_id", "bigint"),
    ("after_id", "bigint"),
    ("last_id", "bigint"),
    ("cutoff", "timestamptz"),
)


def _in_range(spec: RecordKindSpec, alias: str) -> str:
    partition = spec.in_partition(alias, property_sql="g.property_id", portfolio_sql="g.portfolio_id")
    return f"{partition} AND {spec.after(alias, 'g.after_id')} AND {spec.at_most(alias, 'g.last_id')}"


def _partition_of_g(spec: RecordKindSpec) -> str:
    """What names a partition of ``g`` in the rows returned: its property, or its portfolio without one."""
    return "g.property_id" if spec.has_property else "g.portfolio_id"


def group_range_counts(spec: RecordKindSpec, *, jobs: int) -> str:
    """SQLite: per partition of ``g`` (``DELETE_COLUMNS``), the rows of its
    candidate range past its cutoff, and of those the ones an active hold
    covers, counted just before the DELETE (one writer at a time). Rows:
    (property id, candidates, held). Parameter: ``kind``."""
    in_range = f"{_in_range(spec, 'r')} AND r.{spec.timestamp_column} < {spec.cutoff_sql('g.cutoff')}"
    return (
        f"WITH {rows_cte('g', delete_columns(spec), jobs)} SELECT {_partition_of_g(spec)},"
        f" (SELECT COUNT(*) FROM {spec.table} r WHERE {in_range}) AS n, {_held_in(spec, in_range)} AS held"
        " FROM g"
    )


def _hold_scope(spec: RecordKindSpec) -> str:
    hold_property = (
        "(h.property_id IS NULL OR h.property_id = g.property_id)" if spec.has_property else "h.property_id IS NULL"
    )
    return (
        "h.released_at IS NULL AND h.portfolio_id = g.portfolio_id"
        f" AND {hold_property}"
        " AND (h.record_kind = '' OR h.record_kind = %(kind)s)"
    )


def _held_in(spec: RecordKindSpec, rows: str) -> str:
    """Of the rows of ``spec``'s table (alias ``r``) matching ``rows``, those an
    active hold of partition ``g``'s scope covers, counted from the holds: a
    hold over the whole scope holds every such row; otherwise the record
    holds of that scope whose record matches (a handful, however many
    rows). ``CASE`` evaluates only the branch it takes, so without a
    scope-wide hold the rows are not read again."""
    holds, table, pk = LegalHold._meta.db_table, spec.table, spec.pk_column
    scope = _hold_scope(spec)
    return (
        f"CASE WHEN EXISTS (SELECT 1 FROM {holds} h WHERE {scope} AND {_scope_wide(spec)})"
        f" THEN (SELECT COUNT(*) FROM {table} r WHERE {rows})"
        f" ELSE (SELECT COUNT(DISTINCT r.{pk}) FROM {holds} h JOIN {table} r ON r.{pk} = {_hold_key(spec)}"
        f" WHERE {scope} AND {rows}) END"
    )


def group_delete(spec: RecordKindSpec, *, predicate: str, jobs: int) -> str:
    """Delete the eligible rows of every partition's candidates; returns one
    row per deleted record: (property id — a group holds one job per
    property and kind —, document id, record id, NULL) for kinds with
    attachments (NULLs otherwise), and on PostgreSQL then one row per
    partition with held rows (property id, NULL, NULL, held).

    On PostgreSQL the DELETE takes the candidate ids the count found
    (``ids``, every partition's), so the range is read once and deleted rows
    can never exceed the candidates, even when the application inserted or
    moved an old row into the range since (it is the next sweep's). Held
    is counted in this statement's snapshot, from the holds (``_held_in``):
    rows a hold covers, not a difference. SQLite (one writer at a time, no
    arrays) deletes the candidate range and counts it just before
    (``group_range_counts``). ``predicate`` is the eligibility predicate
    over ``table`` with the cutoff ``g.cutoff``, its parameters named
    (``named``): the hold check is inside this statement, and so is the
    scope (property and portfolio), re-tested on a row the application
    changed while the DELETE waited for it. Parameters: ``g``
    (``DELETE_COLUMNS``), ``kind``, ``ids`` (PostgreSQL) and the
    predicate's."""
    table, pk = spec.table, spec.pk_column
    cte = f"WITH {rows_cte('g', delete_columns(spec), jobs)}"
    returning = spec.attachment_column
    # A non-integer key is returned as text (the cursor's form).
    key_type = "bigint" if spec.integer_key else "text"
    record = f"{table}.{pk}" if spec.integer_key else f"CAST({table}.{pk} AS text)"
    extra = (
        f"CAST({table}.{returning} AS text), {record}" if returning else f"CAST(NULL AS text), CAST(NULL AS {key_type})"
    )
    # ``(… = …) IS TRUE``: the same test, but not one the planner can answer
    # from the portfolio's index — it would AND a bitmap of the portfolio's
    # every row (half the table for a large customer) with the range's.
    portfolio = f"({table}.{spec.portfolio_column} = g.portfolio_id) IS TRUE"
    in_range = f"{_in_range(spec, table)} AND {portfolio} AND {predicate}"
    if is_postgres():
        # Which partition a deleted row was of: its property column, else
        # (a path, no property) the partition's row of ``g`` it matched.
        partition = f"{table}.{spec.property_column}" if spec.property_shape == "direct" else _partition_of_g(spec)
        ids = f"CAST(%(ids)s AS {spec.pk_sql_type}[])"
        past = f"r.{spec.timestamp_column} < {spec.cutoff_sql('g.cutoff')}"
        rows = f"r.{pk} = ANY({ids}) AND {_in_range(spec, 'r')} AND {past}"
        return (
            f"{cte}, d AS (DELETE FROM {table} USING g WHERE {table}.{pk} = ANY({ids}) AND {in_range}"
            f" RETURNING {partition}, {extra}),"
            f" k AS (SELECT {_partition_of_g(spec)}, {_held_in(spec, rows)} AS held FROM g)"
            f" SELECT d.*, CAST(NULL AS bigint) FROM d"
            f" UNION ALL SELECT k.{_partition_of_g(spec)[2:]}, CAST(NULL AS text), CAST(NULL AS {key_type}),"
            " CAST(k.held AS bigint)"
            " FROM k WHERE k.held > 0"
        )
    partition = {
        "direct": f"{table}.{spec.property_column}" if spec.has_property else "",
        "path": spec.property_of(table) if spec.property_shape == "path" else "",
        "none": f"{table}.{spec.portfolio_column}",
    }[spec.property_shape]
    # SQLite has no DELETE … USING and no DELETE inside a WITH.
    return (
        f"{cte} DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM g WHERE {in_range})"
        f" RETURNING {partition}, {extra}, NULL"
    )


LEDGER_COLUMNS: Columns = (
    ("operation_id", "varchar"),
    ("job_id", "bigint"),
    ("portfolio_id", "bigint"),
    ("property_id", "bigint"),
    ("record_kind", "varchar"),
    ("policy_version_id", "bigint"),
    ("cutoff", "timestamptz"),
    ("after_id", "bigint"),
    ("last_id", "bigint"),
    ("batch_limit", "integer"),
    ("candidates", "integer"),
    ("rows_deleted", "integer"),
    ("rows_held", "integer"),
    ("applied_at", "timestamptz"),
)


# A group with a non-integer kind: the ranges as text too (``retention.registry``, "Keys").
LEDGER_KEY_COLUMNS: Columns = (*LEDGER_COLUMNS, ("after_key", "varchar"), ("last_key", "varchar"))


def ledger_columns(*, keys: bool) -> Columns:
    return LEDGER_KEY_COLUMNS if keys else LEDGER_COLUMNS


def ledger_insert_many(rows: int, *, keys: bool = False) -> str:
    """One ledger row per applied batch. Parameters: ``g`` (``ledger_columns``)."""
    columns = ledger_columns(keys=keys)
    names = ", ".join(column for column, _ in columns)
    return f"WITH {rows_cte('g', columns, rows)} INSERT INTO {LEDGER} ({names}) SELECT {names} FROM g"


ADVANCE_COLUMNS: Columns = (
    ("job_id", "bigint"),
    ("new_cursor", "bigint"),
    ("add_batches", "integer"),
    ("add_deleted", "bigint"),
    ("add_held", "bigint"),
    ("batch_size", "integer"),
    ("state", "varchar"),
    ("outcome", "varchar"),
)


def ledger_insert_and_jobs_advance(*, rows: int, jobs: int, keys: bool = False) -> str:
    """PostgreSQL: the ledger rows (``l``) and the jobs' advance (``g``) in
    one statement (a data-modifying CTE), one round trip fewer per batch
    transaction. Parameters: those of ``ledger_insert_many`` under ``l``,
    then ``group_jobs_advance``'s."""
    columns = ledger_columns(keys=keys)
    names = ", ".join(column for column, _ in columns)
    insert = f"{rows_cte('l', columns, rows)}, written AS (INSERT INTO {LEDGER} ({names}) SELECT {names} FROM l)"
    return group_jobs_advance(jobs).replace("WITH ", f"WITH {insert}, ", 1)


def group_jobs_advance(jobs: int) -> str:
    """Every job of the transaction in one statement: cursor, counts, batch
    size (0 keeps it), and the state and outcome ``lifecycle.after_batch``
    decided. A job still leased has its lease renewed; a finished one has it
    cleared and its finishing time set. Parameters: ``g``
    (``ADVANCE_COLUMNS``), ``now``, ``renew`` (the new lease expiry)."""
    leased = f"g.state = '{JobState.LEASED}'"
    return (
        f"WITH {rows_cte('g', ADVANCE_COLUMNS, jobs)}"
        f" UPDATE {JOB} SET cursor = g.new_cursor, batches = batches + g.add_batches,"
        f" batch_size = CASE WHEN g.batch_size > 0 THEN g.batch_size ELSE {JOB}.batch_size END,"
        f" rows_deleted = rows_deleted + g.add_deleted, rows_held = rows_held + g.add_held,"
        f" state = g.state, outcome = g.outcome,"
        f" finished_at = CASE WHEN {leased} THEN finished_at ELSE %(now)s END,"
        f" lease_token = CASE WHEN {leased} THEN lease_token ELSE NULL END,"
        f" lease_owner = CASE WHEN {leased} THEN lease_owner ELSE '' END,"
        f" lease_expires_at = CASE WHEN {leased} THEN %(renew)s ELSE NULL END"
        f" FROM g WHERE {JOB}.id = g.job_id RETURNING {JOB}.id, {JOB}.state, {JOB}.outcome"
    )


# --- Non-integer keys (``retention.registry``, "Keys") ---------------------------
# Run only for groups with such a kind: the integer path's statements are untouched.

KEY_CURSOR_COLUMNS: Columns = (("job_id", "bigint"), ("cursor_key", "varchar"))


def jobs_cursor_keys(jobs: int) -> str:
    """The text cursors of jobs the fence has just locked. Parameters: ``ids`` (``any_params``)."""
    return f"SELECT id, cursor_key FROM {JOB} WHERE id {any_of('ids', 'bigint', jobs)}"


def jobs_cursor_keys_set(jobs: int) -> str:
    """Move the text cursors of jobs still under the fence. Parameters: ``g`` (``KEY_CURSOR_COLUMNS``)."""
    return (
        f"WITH {rows_cte('g', KEY_CURSOR_COLUMNS, jobs)}"
        f" UPDATE {JOB} SET cursor_key = g.cursor_key FROM g WHERE {JOB}.id = g.job_id"
    )


def ledger_last_keys(operations: int) -> str:
    """The text last ids of ledger rows being replayed. Parameters: ``ops`` (``any_params``)."""
    return f"SELECT operation_id, last_key FROM {LEDGER} WHERE operation_id {any_of('ops', 'varchar', operations)}"


def lease_caps_lock(stripes: int) -> str:
    """The cap locks of several stripes, taken in stripe order
    (PostgreSQL only; parameters: the namespace, then the stripe numbers)."""
    rows = values_list(stripes, ["integer"])
    return f"SELECT pg_advisory_xact_lock(CAST(%s AS integer), v.p) FROM (VALUES {rows}) AS v(p) ORDER BY v.p"
