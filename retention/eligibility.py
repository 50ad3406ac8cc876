"""The eligibility predicate: the one definition of "may be deleted now".

A row of a record kind is eligible when its retention timestamp is before the
cutoff and no *active* legal hold covers it. The hold test is a correlated
``NOT EXISTS`` so it can sit inside the ``DELETE`` statement itself: the check
and the delete then read the same snapshot, inside the write transaction,
instead of trusting an earlier scan (docs/architecture.md, "Invariants", 5).

Both preview counts (admin, dry-run, admission) and the execution path build
their SQL from these functions.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.db import connection
from psycopg import sql as pg

from retention.models import LegalHold
from retention.registry import RecordKindSpec, get_spec


def db_datetime(value: datetime) -> object:
    """A datetime as the backend stores it, for use as a raw SQL parameter."""
    return connection.ops.adapt_datetimefield_value(value)


# --- Which holds reach a record: the one definition ---------------------------------
# Every path that decides whether a hold keeps something builds its test from
# ``hold_scope`` (and a live row's record test from ``hold_record``): the
# eligibility predicate inside each DELETE (``hold_covers``), the batches'
# held counts (``execution.statements``), the purge's decision over deleted
# records (``deleted_record_held_sql``), the table-partition drop's check and the
# console's figures. The scope's values are SQL expressions (``Composable``s:
# a column, a parameter, a row of ``g``), so the same rule reads them from the
# row itself, a statement's parameters or a list of partitions, and every
# fragment here is composed into its statement, never pasted as text.

HOLDS = pg.Identifier(LegalHold._meta.db_table)

# ``property`` for a decision over every property of the portfolios at once (the
# drop, which removes a month of all of them): a hold of any property reaches it.
ANY_PROPERTY = pg.SQL("h.property_id")


def hold_scope(
    spec: RecordKindSpec | None, *, portfolio: pg.Composable, property: pg.Composable, kind: pg.Composable
) -> pg.Composed:
    """The active holds (alias ``h``) whose scope reaches records of ``kind``
    in ``portfolio``'s ``property`` — each an SQL expression: a hold naming no
    property reaches every property, a hold naming no kind every kind. The
    record a hold may name is tested apart (``hold_record``, ``hold_names_no_record``).

    ``spec``: the kind, when the records are of one; a kind without a property
    is reached by no property's hold. ``None``: records of several kinds (the
    purge's deleted records), whose ``property`` is NULL for a kind without one:
    the same rule, by SQL's NULL. ``portfolio`` may be ``ANY(…)``, and
    ``property`` ``ANY_PROPERTY``."""
    if spec is not None and not spec.has_property:
        property = pg.SQL("NULL")
    return pg.SQL(
        """
        h.released_at IS NULL AND h.portfolio_id = {portfolio}
            AND (h.property_id IS NULL OR h.property_id = {property})
            AND (h.record_kind = '' OR h.record_kind = {kind})
        """
    ).format(portfolio=portfolio, property=property, kind=kind)


def hold_names_no_record(spec: RecordKindSpec) -> pg.SQL:
    """A hold (alias ``h``) over its whole scope: it names no record."""
    return pg.SQL("h.record_id IS NULL" if spec.integer_key else "h.record_key = ''")


def hold_record_key(spec: RecordKindSpec) -> pg.Composable:
    """The record a record hold (alias ``h``) names, as the key's type."""
    return pg.SQL("h.record_id") if spec.integer_key else spec.key_param(pg.SQL("h.record_key"))


def hold_record(spec: RecordKindSpec, row_pk: pg.Composable) -> pg.Composed:
    """A hold's record test for the key ``row_pk``: the hold names no record,
    or this one — by ``record_id`` (integer keys) or ``record_key`` (its text:
    the row's key is cast, never the hold's, so no hold's text can fail a cast)."""
    if spec.integer_key:
        return pg.SQL("(h.record_id IS NULL OR h.record_id = {pk})").format(pk=row_pk)
    return pg.SQL("(h.record_key = '' OR h.record_key = CAST({pk} AS text))").format(pk=row_pk)


def hold_covers(spec: RecordKindSpec, *, alias: str, kind: pg.Composable) -> pg.Composed:
    """``EXISTS (…)``: an active hold covers row ``alias`` of ``spec``'s kind,
    the kind given as ``kind`` (a parameter)."""
    scope = hold_scope(
        spec,
        portfolio=pg.Identifier(alias, spec.portfolio_column),
        property=spec.property_of(alias),
        kind=kind,
    )
    record = hold_record(spec, pg.Identifier(alias, spec.pk_column))
    return pg.SQL("EXISTS (SELECT 1 FROM {h} h WHERE {scope} AND {record})").format(h=HOLDS, scope=scope, record=record)


def hold_covers_sql(kind: str, *, alias: str = "r") -> tuple[pg.Composed, list[object]]:
    """``hold_covers`` with the kind a positional parameter: (SQL, its parameters)."""
    return hold_covers(get_spec(kind), alias=alias, kind=pg.Placeholder()), [kind]


def deleted_record_held_sql(alias: str) -> pg.Composed:
    """``EXISTS (…)``: an active hold covers the deleted record that row
    ``alias`` describes (a ``DeletedAttachment``: its portfolio, property — NULL
    for a kind without one —, kind, and record id or key). A NULL record id (not
    known) matches every record-level hold of the scope: keep a file too many,
    never one too few. A record of a non-integer key is named by its
    ``record_key`` ("" when the key is an integer)."""
    column = functools.partial(pg.Identifier, alias)
    scope = hold_scope(
        None, portfolio=column("portfolio_id"), property=column("property_id"), kind=column("record_kind")
    )
    return pg.SQL(
        """
        EXISTS (
            SELECT 1 FROM {holds} h
            WHERE {scope} AND ((h.record_id IS NULL AND h.record_key = '')
                OR h.record_id = COALESCE({record_id}, h.record_id)
                OR (h.record_key > '' AND h.record_key = {record_key}))
        )
        """
    ).format(holds=HOLDS, scope=scope, record_id=column("record_id"), record_key=column("record_key"))


def eligible_sql(kind: str, *, cutoff: datetime, alias: str = "r") -> tuple[pg.Composed, list[object]]:
    """The WHERE fragment selecting rows of ``kind`` that may be deleted now."""
    predicate, params = eligible_sql_for(kind, cutoff_sql=pg.Placeholder(), alias=alias)
    return predicate, [db_datetime(cutoff), *params]


def eligible_sql_for(kind: str, *, cutoff_sql: pg.Composable, alias: str = "r") -> tuple[pg.Composed, list[object]]:
    """The same predicate with the cutoff as an SQL expression (a column of a
    joined list of partitions, each with its own cutoff); its params follow
    any the expression itself takes."""
    return eligible_predicate(kind, cutoff_sql=cutoff_sql, alias=alias, kind_sql=pg.Placeholder()), [kind]


def eligible_predicate(kind: str, *, cutoff_sql: pg.Composable, alias: str, kind_sql: pg.Composable) -> pg.Composed:
    """The predicate with every value an SQL expression: the cutoff and the
    kind (``kind_sql``, a named parameter in a statement that names them)."""
    spec = get_spec(kind)
    return pg.SQL("{ts} < {cutoff} AND NOT {held}").format(
        ts=pg.Identifier(alias, spec.timestamp_column),
        cutoff=spec.cutoff_sql(cutoff_sql),
        held=hold_covers(spec, alias=alias, kind=kind_sql),
    )


def count_expired_and_held(
    kind: str, *, cutoff: datetime, portfolio_id: int | None = None, property_id: int | None = None
) -> tuple[int, int]:
    """(rows past the cutoff, of which held) in a portfolio or a property."""
    spec = get_spec(kind)
    hold_sql, hold_params = hold_covers_sql(kind)
    where: list[pg.Composable] = [
        pg.SQL("r.{ts} < {cutoff}").format(
            ts=pg.Identifier(spec.timestamp_column), cutoff=spec.cutoff_sql(pg.Placeholder())
        )
    ]
    if spec.property_shape == "path":
        # A row whose path is NULL is in no partition: not "expired" here,
        # counted apart (``count_unreachable``).
        where.append(pg.SQL("{property} IS NOT NULL").format(property=spec.property_of("r")))
    params: list[Any] = [*hold_params, db_datetime(cutoff)]
    if portfolio_id is not None:
        where.append(pg.SQL("r.{portfolio} = %s").format(portfolio=pg.Identifier(spec.portfolio_column)))
        params.append(portfolio_id)
    if property_id is not None:
        where.append(spec.in_partition("r", property_sql=pg.Placeholder(), portfolio_sql=pg.Placeholder()))
        params.append(property_id if spec.has_property else portfolio_id)
    sql = pg.SQL(
        """
        SELECT COUNT(*), COALESCE(SUM(CASE WHEN {held} THEN 1 ELSE 0 END), 0)
        FROM {table} r WHERE {where}
        """
    ).format(held=hold_sql, table=pg.Identifier(spec.table), where=pg.SQL(" AND ").join(where))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        expired, held = cursor.fetchone()
    return int(expired), int(held)


def count_unreachable(kind: str, *, portfolio_id: int | None = None, cutoff: datetime | None = None) -> int:
    """Rows of a one-hop-path kind that belong to no property (the path is
    NULL: no unit, or a unit without a property) — past ``cutoff`` when one
    is given. They are in no partition, so no job ever deletes them: the
    check retention.W009 and the dry run report them rather than keep
    them in silence. 0 for other shapes."""
    spec = get_spec(kind)
    if spec.property_shape != "path":
        return 0
    where: list[pg.Composable] = [pg.SQL("{property} IS NULL").format(property=spec.property_of("r"))]
    params: list[Any] = []
    if cutoff is not None:
        where.append(
            pg.SQL("r.{ts} < {cutoff}").format(
                ts=pg.Identifier(spec.timestamp_column), cutoff=spec.cutoff_sql(pg.Placeholder())
            )
        )
        params.append(db_datetime(cutoff))
    if portfolio_id is not None:
        where.append(pg.SQL("r.{portfolio} = %s").format(portfolio=pg.Identifier(spec.portfolio_column)))
        params.append(portfolio_id)
    sql = pg.SQL("SELECT COUNT(*) FROM {table} r WHERE {where}").format(
        table=pg.Identifier(spec.table), where=pg.SQL(" AND ").join(where)
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])
