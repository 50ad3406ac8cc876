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

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Coalesce

from retention.models import LegalHold
from retention.registry import RecordKindSpec, get_spec


def db_datetime(value: datetime) -> object:
    """A datetime as the backend stores it, for use as a raw SQL parameter."""
    return connection.ops.adapt_datetimefield_value(value)


def hold_property_sql(spec: RecordKindSpec, alias: str) -> str:
    """A hold's property test for row ``alias``: any property's hold when the
    hold names none, else the row's property (through the path); a kind
    without a property is reached by no property's hold."""
    if not spec.has_property:
        return "h.property_id IS NULL"
    return f"(h.property_id IS NULL OR h.property_id = {spec.property_of(alias)})"


def hold_record_sql(spec: RecordKindSpec, row_pk: str) -> str:
    """A hold's record test for the key ``row_pk``: a record hold names it by
    ``record_id`` (integer keys) or ``record_key`` (its text)."""
    if spec.integer_key:
        return f"(h.record_id IS NULL OR h.record_id = {row_pk})"
    return f"(h.record_key = '' OR h.record_key = CAST({row_pk} AS text))"


def hold_covers_sql(kind: str, *, alias: str = "r") -> tuple[str, list[object]]:
    """``EXISTS (…)``: an active hold covers row ``alias`` of ``kind``."""
    spec = get_spec(kind)
    holds = LegalHold._meta.db_table
    sql = (
        f"EXISTS (SELECT 1 FROM {holds} h WHERE h.released_at IS NULL"
        f" AND h.portfolio_id = {alias}.{spec.portfolio_column}"
        f" AND {hold_property_sql(spec, alias)}"
        f" AND (h.record_kind = '' OR h.record_kind = %s)"
        f" AND {hold_record_sql(spec, f'{alias}.{spec.pk_column}')})"
    )
    return sql, [kind]


def holds_covering(
    *, portfolio: Any, property: Any, kind: Any, record: Any, record_key: Any = None
) -> QuerySet[LegalHold]:
    """Active holds covering one record, given as expressions (``OuterRef``
    of a row that describes the record — a deleted one, say): the same scope
    rules as ``hold_covers_sql`` (portfolio; property, kind and record when
    the hold names them). A NULL record id (not known) matches every
    record-level hold of the scope: keep a file too many, never one too few.
    A record of a non-integer key is named by ``record_key`` (its text; ""
    when the record's key is an integer): a hold naming a key matches that
    key, or any record when ``record_key`` is not given. A NULL property (a
    kind without one) is reached only by holds naming no property."""
    by_key = Q(record_key__gt="") if record_key is None else Q(record_key__gt="", record_key=record_key)
    return (
        LegalHold.objects.active()
        .filter(portfolio_id=portfolio)
        .filter(Q(property_id__isnull=True) | Q(property_id=property))
        .filter(Q(record_kind="") | Q(record_kind=kind))
        .filter(
            Q(record_id__isnull=True, record_key="")
            | Q(record_id__isnull=False, record_id=Coalesce(record, F("record_id")))
            | by_key
        )
    )


def eligible_sql(kind: str, *, cutoff: datetime, alias: str = "r") -> tuple[str, list[object]]:
    """The WHERE fragment selecting rows of ``kind`` that may be deleted now."""
    predicate, params = eligible_sql_for(kind, cutoff_sql="%s", alias=alias)
    return predicate, [db_datetime(cutoff), *params]


def eligible_sql_for(kind: str, *, cutoff_sql: str, alias: str = "r") -> tuple[str, list[object]]:
    """The same predicate with the cutoff as an SQL expression (a column of a
    joined list of partitions, each with its own cutoff); its params follow
    any the expression itself takes."""
    spec = get_spec(kind)
    hold_sql, hold_params = hold_covers_sql(kind, alias=alias)
    return f"{alias}.{spec.timestamp_column} < {spec.cutoff_sql(cutoff_sql)} AND NOT {hold_sql}", hold_params


def count_expired_and_held(
    kind: str, *, cutoff: datetime, portfolio_id: int | None = None, property_id: int | None = None
) -> tuple[int, int]:
    """(rows past the cutoff, of which held) in a portfolio or a property."""
    spec = get_spec(kind)
    hold_sql, hold_params = hold_covers_sql(kind)
    where = [f"r.{spec.timestamp_column} < {spec.cutoff_sql('%s')}"]
    if spec.property_shape == "path":
        # A row whose path is NULL is in no partition: not "expired" here,
        # counted apart (``count_unreachable``).
        where.append(f"{spec.property_of('r')} IS NOT NULL")
    params: list[Any] = [*hold_params, db_datetime(cutoff)]
    if portfolio_id is not None:
        where.append(f"r.{spec.portfolio_column} = %s")
        params.append(portfolio_id)
    if property_id is not None:
        where.append(spec.in_partition("r", property_sql="%s", portfolio_sql="%s"))
        params.append(property_id if spec.has_property else portfolio_id)
    sql = (
        f"SELECT COUNT(*), COALESCE(SUM(CASE WHEN {hold_sql} THEN 1 ELSE 0 END), 0)"
        f" FROM {spec.table} r WHERE {' AND '.join(where)}"
    )
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
    sql = f"SELECT COUNT(*) FROM {spec.table} r WHERE {spec.property_of('r')} IS NULL"
    params: list[Any] = []
    if cutoff is not None:
        sql += f" AND r.{spec.timestamp_column} < {spec.cutoff_sql('%s')}"
        params.append(db_datetime(cutoff))
    if portfolio_id is not None:
        sql += f" AND r.{spec.portfolio_column} = %s"
        params.append(portfolio_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])
