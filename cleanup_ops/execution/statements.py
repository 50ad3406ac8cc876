"""The batch transaction's statements, next to their only caller (``execution.batches``).

The fence with the scope locks and the policy read, the replay lookups, the
candidates, the DELETE, the ledger insert and the jobs' advance: the
statements a reader of one batch follows in order, apart from those the
batch reaches through other modules (a sweep's finish in ``cleanup_ops.sweeps``,
the rate limits' in ``cleanup_ops.ratelimit``, the outbox's disposition take
in ``execution.outbox``), each next to its own protocol, and the text cursors
only a non-integer key needs (``execution.key_cursors``). The composition
helpers these use are ``cleanup_ops.sql``'s.

Every builder is a ``sql.statement``: a ``psycopg.sql`` template (each
table and column name an identifier, ``sql.composed``) filled once per
shape — its arguments — and cached, so a batch composes nothing; the
fragments it takes (the hold rule, a kind's partition and keyset) are
``Composable`` too, from ``retention.eligibility`` and ``retention.registry``.
Every statement takes named parameters; the list of partitions is a table
``g`` (``sql.rows_cte``).
"""

from __future__ import annotations

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal, Placeholder

from cleanup_ops.lifecycle import JobEvent, state_after
from cleanup_ops.sql import (
    PORTFOLIO_KEY,
    PROPERTY_KEY,
    Columns,
    any_of,
    composed,
    ident,
    lease_cleared,
    rows_cte,
    statement,
)
from retention.eligibility import HOLDS, eligible_predicate, hold_names_no_record, hold_record_key, hold_scope
from retention.registry import RecordKindSpec

SCOPE_COLUMNS: Columns = (
    ("job_id", "bigint"),
    ("property_id", PROPERTY_KEY),
    ("portfolio_id", PORTFOLIO_KEY),
    ("record_kind", "varchar"),
)


Hop = tuple[str, str, str]  # a one-hop path's (unit table, unit pk, unit's property column)


@statement
def group_fence_scopes_and_policies(
    *, portfolio_partitions: bool = False, paths: tuple[tuple[Hop, tuple[str, ...]], ...] = ()
) -> Composed:
    """Steps a-c of the batch for a group, in one statement. The fence ``f``:
    those of the group's jobs whose lease is still ours — cursor and the
    totals so far (the finishing outcome is decided from them) — rows locked
    in id order (two groups never wait on each other in a cycle). The scope
    ``s``: property and portfolio rows ``FOR SHARE`` (the hold race) in
    property id order, and each job's active policy version. ``s`` is locked
    after a sort over a join that reads ``f`` whole, so every job row is
    locked before any property or portfolio row. Per job still ours: id,
    cursor, rows deleted, rows held, whether its scope exists, and the
    version (id, days, enabled, batch size; NULLs when none). Parameters: ``g`` (``SCOPE_COLUMNS``),
    ``ids`` (``any_params``), ``state``, ``token``, ``now``, ``approved``.

    ``portfolio_partitions``: the group has jobs of a kind without a
    property (``property_id`` NULL). Their scope is the portfolio row alone,
    locked ``FOR SHARE`` by a second scope CTE (in portfolio id order, after
    the property jobs' rows); a group without such jobs gets the text above
    unchanged.

    ``paths``: the group has jobs of kinds reached through a unit
    (``RecordKindSpec.path_hop``), each hop with its kinds. The units now in
    those jobs' properties are locked ``FOR SHARE`` too (``u0``, ``u1`` …,
    after ``s``: each reads it), so a unit cannot move into another property
    between the statement that reads where a record is and the commit — the
    move waits for the batch, and a hold placed on the unit's new property
    meanwhile covers nothing the batch deletes. A unit moved *into* a
    property is not locked and need not be: a later statement's snapshot
    either sees it there (then the property's own lock covers its holds) or
    does not (then its records are not deleted). Each ``u`` is read by a
    one-time filter of the result (a CTE no one reads is never run)."""
    scopes: Composable = SQL("s")
    portfolio_scope: Composable = SQL("")
    if portfolio_partitions:
        scopes = SQL("(SELECT * FROM s UNION ALL SELECT * FROM t) s")
        portfolio_scope = composed(
            """,
            t AS MATERIALIZED (
                SELECT g.job_id, v.id AS version_id, v.retention_days, v.enabled, v.batch_size
                FROM g JOIN f ON f.id = g.job_id
                JOIN {portfolio} po ON po.{portfolio_pk} = g.portfolio_id AND g.property_id IS NULL
                LEFT JOIN {policy} rp ON rp.portfolio_id = po.{portfolio_pk} AND rp.record_kind = g.record_kind
                LEFT JOIN {version} v ON v.policy_id = rp.id AND v.status = %(approved)s
                ORDER BY po.{portfolio_pk} FOR SHARE OF po
            )
            """,
        )
    path_locks: list[Composable] = []
    path_reads: list[Composable] = []
    for n, ((unit, unit_pk, unit_property), kinds) in enumerate(paths):
        name = ident(f"u{n}")
        path_locks.append(
            composed(
                """,
                {name} AS MATERIALIZED (
                    SELECT u.{unit_pk} FROM s JOIN g ON g.job_id = s.job_id
                    JOIN {unit} u ON u.{unit_property} = g.property_id WHERE g.record_kind IN ({kinds})
                    ORDER BY u.{unit_pk} FOR SHARE OF u
                )
                """,
                name=name,
                unit=ident(unit),
                unit_pk=ident(unit_pk),
                unit_property=ident(unit_property),
                kinds=SQL(", ").join(Literal(kind) for kind in kinds),
            )
        )
        path_reads.append(composed(" AND (SELECT COUNT(*) FROM {name}) >= 0", name=name))
    return composed(
        """
        WITH {g},
        f AS MATERIALIZED (
            SELECT id, cursor, rows_deleted, rows_held FROM {job}
            WHERE id {ids} AND state = %(state)s AND lease_token = %(token)s AND lease_expires_at > %(now)s
            ORDER BY id FOR UPDATE
        ),
        s AS MATERIALIZED (
            SELECT g.job_id, v.id AS version_id, v.retention_days, v.enabled, v.batch_size
            FROM g JOIN f ON f.id = g.job_id
            JOIN {property} p ON p.{property_pk} = g.property_id
            JOIN {portfolio} po ON po.{portfolio_pk} = p.{property_portfolio} AND po.{portfolio_pk} = g.portfolio_id
            LEFT JOIN {policy} rp ON rp.portfolio_id = po.{portfolio_pk} AND rp.record_kind = g.record_kind
            LEFT JOIN {version} v ON v.policy_id = rp.id AND v.status = %(approved)s
            ORDER BY p.{property_pk} FOR SHARE OF p, po
        ){portfolio_scope}{path_locks}
        SELECT f.id, f.cursor, f.rows_deleted, f.rows_held, s.job_id IS NOT NULL, s.version_id,
            s.retention_days, s.enabled, s.batch_size
        FROM f LEFT JOIN {scopes} ON s.job_id = f.id
        WHERE true{path_reads} ORDER BY f.id
        """,
        g=rows_cte("g", SCOPE_COLUMNS),
        ids=any_of("ids", "bigint"),
        portfolio_scope=portfolio_scope,
        scopes=scopes,
        path_locks=SQL("").join(path_locks),
        path_reads=SQL("").join(path_reads),
    )


@statement
def ledger_lookup() -> Composed:
    """Parameters: ``ops`` (``any_params``)."""
    return composed(
        "SELECT operation_id, last_id FROM {ledger} WHERE operation_id {ops}",
        ops=any_of("ops", "varchar"),
    )


POLICY_COLUMNS: Columns = (("job_id", "bigint"), ("portfolio_id", PORTFOLIO_KEY), ("record_kind", "varchar"))


@statement
def policies_and_ledger_lookup() -> Composed:
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
    return composed(
        """
        WITH {p}
        SELECT p.job_id, v.id, v.retention_days, v.enabled, v.batch_size, CAST(NULL AS varchar), CAST(NULL AS bigint)
        FROM p
        LEFT JOIN {policy} rp ON rp.portfolio_id = p.portfolio_id AND rp.record_kind = p.record_kind
        LEFT JOIN {version} v ON v.policy_id = rp.id AND v.status = %(approved)s
        UNION ALL
        SELECT NULL, NULL, NULL, NULL, NULL, operation_id, last_id FROM {ledger} WHERE operation_id {ops}
        """,
        p=rows_cte("p", POLICY_COLUMNS),
        ops=any_of("ops", "varchar"),
    )


def _kind_names(spec: RecordKindSpec) -> dict[str, Identifier]:
    """The record kind's table and columns as identifiers, for a template's
    ``{table}``, ``{pk}``, ``{ts}``, ``{portfolio_col}``."""
    return {
        "table": ident(spec.table),
        "pk": ident(spec.pk_column),
        "ts": ident(spec.timestamp_column),
        "portfolio_col": ident(spec.portfolio_column),
    }


def _next_candidates(spec: RecordKindSpec) -> Composed:
    """The ids and retention timestamps of one partition's next candidates
    after its cursor (the keyset walk). Parameters: ``property_id``,
    ``after_id``, ``cutoff``, ``lim``."""
    return composed(
        """
        SELECT r.{pk} AS id, r.{ts} AS ts FROM {table} r
        WHERE {partition} AND {after} AND r.{ts} < {cutoff}
        ORDER BY {order} LIMIT %(lim)s
        """,
        **_kind_names(spec),
        partition=spec.in_partition(
            "r", property_sql=Placeholder("property_id"), portfolio_sql=Placeholder("portfolio_id")
        ),
        after=spec.after("r", Placeholder("after_id")),
        cutoff=spec.cutoff_sql(Placeholder("cutoff")),
        order=spec.keyset_order("r"),
    )


@statement
def partition_candidates(spec: RecordKindSpec) -> Composed:
    """One partition's next candidates after its cursor: (count, last id, the
    ids, their lowest and highest timestamp, for ``group_delete``).
    Parameters: ``_next_candidates``'s."""
    return composed(
        "SELECT COUNT(*), {last}, ARRAY_AGG(c.id), MIN(c.ts), MAX(c.ts) FROM ({candidates}) c",
        last=spec.max_key(SQL("c.id")),
        candidates=_next_candidates(spec),
    )


def _and_in_span(
    spec: RecordKindSpec, alias: Composable, low: Composable, high: Composable, *, pruning: bool
) -> Composable:
    """Pruning: `` AND`` row ``alias``'s timestamp lies in [``low``, ``high``],
    the candidates' span; nothing without ``pruning``. On a table PARTITION
    BY RANGE on the timestamp (``candidates.pruning``) the candidates' id is
    not the partition key: matched by id alone, they are looked for in every
    table partition before the cutoff, each batch; within their span
    PostgreSQL reads only those they lie in. Only narrows (scope, predicate
    and holds are tested as before): a row the application moved outside the
    span meanwhile is left for the next sweep, like one inserted into the
    range. Not on other tables: it prunes nothing there, and skews the
    estimates where its values are unknown when planned."""
    if not pruning:
        return SQL("")
    return composed(
        " AND {alias}.{ts} BETWEEN {low} AND {high}", alias=alias, ts=ident(spec.timestamp_column), low=low, high=high
    )


@statement
def partition_count_and_delete(spec: RecordKindSpec, *, pruning: bool = False) -> Composed:
    """One partition's next candidates and the DELETE of those the
    eligibility predicate (``eligibility.eligible_predicate``: cutoff
    ``%(cutoff)s``, kind ``%(kind)s``) admits, in one statement. The DELETE
    re-tests the scope (property and
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
    own values: the keyset walk. ``pruning``: the DELETE keeps to the span of
    ``c``'s timestamps (``_and_in_span``), read by initplans, so the table
    partitions outside it are pruned as the DELETE starts. Parameters:
    ``_next_candidates``'s, ``portfolio_id``, ``kind``."""
    names = _kind_names(spec)
    portfolio, property = Placeholder("portfolio_id"), Placeholder("property_id")
    scope = hold_scope(spec, portfolio=portfolio, property=property, kind=Placeholder("kind"))
    held = _held_count(spec, scope=scope, rows=SQL("c"), key=SQL("c.id"))
    # The record's scope as it is now (the property through its path).
    # Not an index condition (see group_delete): fewer paths to plan.
    rescope: Composable = composed("({table}.{portfolio_col} = %(portfolio_id)s) IS TRUE", **names)
    if spec.has_property:
        in_property = spec.in_partition(spec.table, property_sql=property, portfolio_sql=portfolio)
        rescope = composed("{in_property} AND {rescope}", in_property=in_property, rescope=rescope)
    # A non-integer key: the ids and the held count share a text column.
    record, held_cell = (
        (SQL("d.id"), held)
        if spec.integer_key
        else (SQL("CAST(d.id AS text)"), composed("CAST(({held}) AS text)", held=held))
    )
    predicate = eligible_predicate(
        spec.kind, cutoff_sql=SQL("CAST(%(cutoff)s AS timestamptz)"), alias=spec.table, kind_sql=Placeholder("kind")
    )
    return composed(
        """
        WITH c AS ({candidates}),
        d AS (
            DELETE FROM {table} USING c
            WHERE {table}.{pk} = c.id{within} AND {rescope} AND {predicate}
            RETURNING {table}.{pk} AS id, CAST({document} AS text) AS document_id
        )
        SELECT (SELECT COUNT(*) FROM c), (SELECT {last} FROM c), {held_cell}, CAST(NULL AS text)
        UNION ALL
        SELECT NULL, NULL, {record}, d.document_id FROM d
        """,
        **names,
        candidates=_next_candidates(spec),
        within=_and_in_span(
            spec, names["table"], SQL("(SELECT MIN(c.ts) FROM c)"), SQL("(SELECT MAX(c.ts) FROM c)"), pruning=pruning
        ),
        rescope=rescope,
        predicate=predicate,
        document=ident(spec.table, spec.attachment_column) if spec.attachment_column else SQL("NULL"),
        last=spec.max_key(SQL("c.id")),
        held_cell=held_cell,
        record=record,
    )


CANDIDATE_COLUMNS: Columns = (
    ("ord", "integer"),
    ("job_id", "bigint"),
    ("property_id", PROPERTY_KEY),
    ("after_id", "bigint"),
    ("cutoff", "timestamptz"),
    ("lim", "integer"),
)


@statement
def group_candidates(spec: RecordKindSpec) -> Composed:
    """Candidates of several partitions of one kind, in one statement, reading
    no more than one batch of rows in all.

    Per partition (in the listed order ``ord``): the next candidate ids after
    its cursor (an index range scan, ``LIMIT`` per partition), and over all of
    them a global ``LIMIT``: a lateral join is a nested loop over the list in
    its order, so the scan stops once one batch (plus one row) is found
    instead of counting a full batch for every partition leased. Returns
    (ord, job id, rows returned, candidates, last candidate id, the candidate
    ids and their lowest and highest timestamp — what ``group_delete``
    deletes from); when the
    global limit was reached the partition with the highest ``ord`` may be
    cut short and is not counted this time. Parameters: ``g``
    (``CANDIDATE_COLUMNS``, each row with its partition's own limit, its
    batch size), ``budget`` (the global limit)."""
    return composed(
        """
        WITH {g}
        SELECT x.ord, x.job_id, COUNT(*), COUNT(x.id), {last},
            ARRAY_AGG(x.id) FILTER (WHERE x.id IS NOT NULL), MIN(x.ts), MAX(x.ts)
        FROM (
            SELECT g.ord, g.job_id, c.id, c.ts FROM g LEFT JOIN LATERAL (
                SELECT r.{pk} AS id, r.{ts} AS ts FROM {table} r
                WHERE {partition} AND {after} AND r.{ts} < {cutoff}
                ORDER BY {order} LIMIT g.lim
            ) c ON true
            LIMIT %(budget)s
        ) x GROUP BY x.ord, x.job_id
        """,
        **_kind_names(spec),
        g=rows_cte("g", candidate_columns(spec)),
        last=spec.max_key(SQL("x.id")),
        partition=spec.in_partition("r", property_sql=SQL("g.property_id"), portfolio_sql=SQL("g.portfolio_id")),
        after=spec.after("r", SQL("g.after_id")),
        cutoff=spec.cutoff_sql(SQL("g.cutoff")),
        order=spec.keyset_order("r"),
    )


def candidate_columns(spec: RecordKindSpec) -> Columns:
    """``CANDIDATE_COLUMNS`` for ``spec``: the same for an integer key and a
    property; a text cursor for other keys, and the portfolio for a kind
    partitioned by it."""
    if spec.integer_key and spec.has_property:
        return CANDIDATE_COLUMNS
    after = ("after_id", spec.key_sql_type())
    columns = [after if name == "after_id" else (name, kind) for name, kind in CANDIDATE_COLUMNS]
    return (*columns, ("portfolio_id", PORTFOLIO_KEY))


def delete_columns(spec: RecordKindSpec) -> Columns:
    """``DELETE_COLUMNS`` for ``spec`` (the cursor range as text for a non-integer key)."""
    if spec.integer_key:
        return DELETE_COLUMNS
    key = spec.key_sql_type()
    return tuple((name, key if name in ("after_id", "last_id") else kind) for name, kind in DELETE_COLUMNS)


DELETE_COLUMNS: Columns = (
    ("property_id", PROPERTY_KEY),
    ("portfolio_id", PORTFOLIO_KEY),
    ("after_id", "bigint"),
    ("last_id", "bigint"),
    ("cutoff", "timestamptz"),
)


def _in_range(spec: RecordKindSpec, alias: str) -> Composed:
    return composed(
        "{partition} AND {after} AND {at_most}",
        partition=spec.in_partition(alias, property_sql=SQL("g.property_id"), portfolio_sql=SQL("g.portfolio_id")),
        after=spec.after(alias, SQL("g.after_id")),
        at_most=spec.at_most(alias, SQL("g.last_id")),
    )


def _partition_of_g(spec: RecordKindSpec) -> Identifier:
    """The column of ``g`` that names a partition: its property, or its portfolio without one."""
    return ident("property_id" if spec.has_property else "portfolio_id")


def _past_cutoff(spec: RecordKindSpec) -> Composed:
    """Rows of ``spec``'s table (alias ``r``) past the cutoff of partition ``g``."""
    return composed("r.{ts} < {cutoff}", **_kind_names(spec), cutoff=spec.cutoff_sql(SQL("g.cutoff")))


def _held_count(
    spec: RecordKindSpec, *, scope: Composable, rows: Composable, key: Composable, where: Composable | None = None
) -> Composed:
    """Of ``rows`` (a FROM item, its key ``key``) matching ``where``, those an
    active hold of ``scope`` (``eligibility.hold_scope``) covers, counted from
    the holds: a hold over the whole scope holds every such row; otherwise the
    record holds of that scope whose record matches (a handful, however many
    rows). ``CASE`` evaluates only the branch it takes, so without a scope-wide
    hold the rows are not read again. The held count of every batch shape."""
    return composed(
        """
        CASE WHEN EXISTS (SELECT 1 FROM {holds} h WHERE {scope} AND {scope_wide})
            THEN (SELECT COUNT(*) FROM {rows} WHERE {where})
            ELSE (
                SELECT COUNT(DISTINCT {key}) FROM {holds} h JOIN {rows} ON {key} = {hold_key}
                WHERE {scope} AND {where}
            )
        END
        """,
        holds=HOLDS,
        scope=scope,
        scope_wide=hold_names_no_record(spec),
        hold_key=hold_record_key(spec),
        rows=rows,
        key=key,
        where=SQL("true") if where is None else where,
    )


def _held_in(spec: RecordKindSpec, rows: Composable) -> Composed:
    """Of the rows of ``spec``'s table (alias ``r``) matching ``rows``, those an
    active hold of partition ``g``'s scope covers (``_held_count``)."""
    names = _kind_names(spec)
    return _held_count(
        spec,
        scope=hold_scope(
            spec, portfolio=SQL("g.portfolio_id"), property=SQL("g.property_id"), kind=Placeholder("kind")
        ),
        rows=composed("{table} r", **names),
        key=composed("r.{pk}", **names),
        where=rows,
    )


@statement
def group_delete(spec: RecordKindSpec, *, pruning: bool = False) -> Composed:
    """Delete the eligible rows of every partition's candidates; returns one
    row per deleted record: (property id — a group holds one job per
    property and kind —, document id, record id, NULL) for kinds with
    attachments (NULLs otherwise), then one row per
    partition with held rows (property id, NULL, NULL, held).

    The DELETE takes the candidate ids the count found
    (``ids``, every partition's), so the range is read once and deleted rows
    can never exceed the candidates, even when the application inserted or
    moved an old row into the range since (it is the next sweep's).
    ``pruning``: it and the held count keep to the candidates' span
    (``_and_in_span``), ``ts_lo`` to ``ts_hi``, bound as literals: only the
    table partitions in it are planned. Held is counted in this statement's
    snapshot, from the holds (``_held_in``): rows a hold covers, not a
    difference. The eligibility predicate (``eligibility.eligible_predicate``)
    is over ``table`` with the cutoff ``g.cutoff`` and the kind ``%(kind)s``:
    the hold check is inside this statement, and so is the
    scope (property and portfolio), re-tested on a row the application
    changed while the DELETE waited for it. Parameters: ``g``
    (``DELETE_COLUMNS``), ``kind``, ``ids`` (``ts_lo`` and ``ts_hi`` too
    with ``pruning``)."""
    table = spec.table
    names = _kind_names(spec)
    # A non-integer key is returned as text (the cursor's form).
    key_type = SQL("bigint" if spec.integer_key else "text")
    record = composed("{table}.{pk}" if spec.integer_key else "CAST({table}.{pk} AS text)", **names)
    attachment = spec.attachment_column
    extra = (
        composed("CAST({document} AS text), {record}", document=ident(table, attachment), record=record)
        if attachment
        else composed("CAST(NULL AS text), CAST(NULL AS {key_type})", key_type=key_type)
    )
    predicate = eligible_predicate(spec.kind, cutoff_sql=SQL("g.cutoff"), alias=table, kind_sql=Placeholder("kind"))
    # ``(… = …) IS TRUE``: the same test, but not one the planner can answer
    # from the portfolio's index — it would AND a bitmap of the portfolio's
    # every row (half the table for a large customer) with the range's.
    in_range = composed(
        "{range} AND ({table}.{portfolio_col} = g.portfolio_id) IS TRUE AND {predicate}",
        **names,
        range=_in_range(spec, table),
        predicate=predicate,
    )
    # Which partition a deleted row was of: its property column, else
    # (a path, no property) the partition's row of ``g`` it matched.
    partition = (
        ident(table, spec.property_column)
        if spec.property_shape == "direct"
        else composed("g.{column}", column=_partition_of_g(spec))
    )
    ids = composed("CAST(%(ids)s AS {pk_type}[])", pk_type=SQL(spec.pk_sql_type))
    rows = composed(
        "r.{pk} = ANY({ids}){span} AND {range} AND {past}",
        **names,
        ids=ids,
        span=_and_in_span(spec, SQL("r"), Placeholder("ts_lo"), Placeholder("ts_hi"), pruning=pruning),
        range=_in_range(spec, "r"),
        past=_past_cutoff(spec),
    )
    return composed(
        """
        WITH {g},
        d AS (
            DELETE FROM {table} USING g
            WHERE {table}.{pk} = ANY({ids}){span} AND {in_range}
            RETURNING {partition}, {extra}
        ),
        k AS (SELECT g.{of_g}, {held} AS held FROM g)
        SELECT d.*, CAST(NULL AS bigint) FROM d
        UNION ALL
        SELECT k.{of_g}, CAST(NULL AS text), CAST(NULL AS {key_type}), CAST(k.held AS bigint) FROM k WHERE k.held > 0
        """,
        **names,
        g=rows_cte("g", delete_columns(spec)),
        in_range=in_range,
        extra=extra,
        ids=ids,
        span=_and_in_span(spec, names["table"], Placeholder("ts_lo"), Placeholder("ts_hi"), pruning=pruning),
        partition=partition,
        of_g=_partition_of_g(spec),
        held=_held_in(spec, rows),
        key_type=key_type,
    )


LEDGER_COLUMNS: Columns = (
    ("operation_id", "varchar"),
    ("job_id", "bigint"),
    ("portfolio_id", PORTFOLIO_KEY),
    ("property_id", PROPERTY_KEY),
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


def _ledger_names(keys: bool) -> Composed:
    return SQL(", ").join(ident(column) for column, _ in ledger_columns(keys=keys))


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


@statement
def ledger_insert_and_jobs_advance(*, keys: bool = False) -> Composed:
    """One ledger row per applied batch (``l``, ``ledger_columns``) and the
    jobs' advance (``g``) in one statement (a data-modifying CTE), one round
    trip fewer per batch transaction. Each row inserted is linked to its
    portfolio's hash chain by the database as it is written
    (``cleanup_ops.ledger_chain``: the trigger locks the chain's head row);
    the rows go in portfolio order, so two groups lock their chains' heads
    in one order and never wait on each other in a cycle. Parameters: ``l``, then
    ``group_jobs_advance``'s."""
    return _jobs_advance(
        composed(
            "{l}, written AS (INSERT INTO {ledger} ({columns}) SELECT {columns} FROM l"
            " ORDER BY l.portfolio_id, l.job_id), {g}",
            l=rows_cte("l", ledger_columns(keys=keys)),
            columns=_ledger_names(keys),
            g=rows_cte("g", ADVANCE_COLUMNS),
        )
    )


@statement
def group_jobs_advance() -> Composed:
    """Every job of the transaction in one statement: cursor, counts, batch
    size (0 keeps it), and the state and outcome ``lifecycle.after_batch``
    decided. The lease columns follow that state: the state an *advance*
    leads to (``lifecycle.TRANSITIONS``: leased → leased) keeps the lease,
    renewed; any other is a *finish* (leased → done), which clears it and
    sets the finishing time. Parameters: ``g`` (``ADVANCE_COLUMNS``),
    ``now``, ``renew`` (the new lease expiry)."""
    return _jobs_advance(rows_cte("g", ADVANCE_COLUMNS))


def _jobs_advance(ctes: Composable) -> Composed:
    """``group_jobs_advance``'s UPDATE after the ``WITH`` of ``ctes`` (which define ``g``)."""
    advanced = composed("g.state = {leased}", leased=Literal(state_after(JobEvent.ADVANCE)))
    return composed(
        """
        WITH {ctes}
        UPDATE {job} SET cursor = g.new_cursor, batches = batches + g.add_batches,
            batch_size = CASE WHEN g.batch_size > 0 THEN g.batch_size ELSE {job}.batch_size END,
            rows_deleted = rows_deleted + g.add_deleted, rows_held = rows_held + g.add_held,
            state = g.state, outcome = g.outcome,
            finished_at = CASE WHEN {advanced} THEN finished_at ELSE %(now)s END, {lease}
        FROM g WHERE {job}.id = g.job_id
        RETURNING {job}.id, {job}.state, {job}.outcome
        """,
        ctes=ctes,
        advanced=advanced,
        lease=lease_cleared(unless=advanced, renewed=Placeholder("renew")),
    )
