"""How the pipeline's raw SQL is composed, and the names it fills in: the
composition helpers, the pipeline's and the host's table names. No statement.

Why raw SQL at all: on the per-batch path every statement counts (an ORM query
that builds model instances costs several plain round trips), and a few
statements need what the ORM does not say (``FOR SHARE OF``, ``RETURNING`` on
a DELETE with a correlated hold check, advisory locks, percentiles). Everything
else (the admin, the API) uses the ORM.

Each statement is a function named after what it does, returning a
``psycopg.sql`` template with its fields filled (``composed``): table and
column names from the models' ``_meta``, never from input, as quoted
identifiers; enum values as ``psycopg.sql.Literal`` of the enums; everything
else a parameter the caller passes (``%s``, or ``%(name)s`` where a
statement names them). A statement stays ``Composable`` until the cursor runs
it: no text is formatted, split or spliced. The product runs on PostgreSQL
only (15 to 18): each statement has one text.

Here: the helpers every statement is built and run with (``composed``,
``ident``, ``rows_cte`` and ``rows_params``, ``any_of`` and ``any_params``,
``array_text`` (an array parameter's value),
``values_list``, ``lease_cleared``, ``statement``, ``execute``) and the names
a template may use (``NAMES``): the pipeline's tables, the host's customer and
site tables, their keys and the keys' type (``PORTFOLIO_KEY``,
``PROPERTY_KEY``). No statement lives here (tests/test_sql_home.py): each is
next to what it is about, in the module that runs it. The batch
transaction's are in ``cleanup_ops.execution.statements`` (and
``execution.key_cursors``), the lease's in ``cleanup_ops.execution.leases``,
the batch's disposition take in ``cleanup_ops.execution.outbox``, the
purge's in ``cleanup_ops.downstream.decision``, ``downstream.fencing`` and
``downstream.purge``, admission's in ``cleanup_ops.admission``, a sweep's in
``cleanup_ops.sweeps``, the rate limits' in ``cleanup_ops.ratelimit``, the
readiness check's in ``cleanup_ops.health``, the console's figures in
``cleanup_ops.console_selectors.overview``; the hold rule's fragments in
``retention.eligibility`` and a record kind's in ``retention.registry``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from django.db import connection
from psycopg import sql as pg
from psycopg.abc import AdaptContext

from cleanup_ops.lifecycle import LEASE_CLEARED
from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry, Sweep
from retention.domain import (
    portfolio_key_sql_type,
    portfolio_model,
    property_key_sql_type,
    property_model,
    property_portfolio_column,
)
from retention.models import PolicyVersion, RetentionPolicy

JOB = CleanupJob._meta.db_table
SWEEP = Sweep._meta.db_table
LEDGER = LedgerEntry._meta.db_table
LETTER = DeadLetter._meta.db_table
# The host's customer and site tables (retention.domain): their keys, and the
# site's column naming its customer (RETENTION_PROPERTY_PORTFOLIO_FIELD).
PROPERTY = property_model()._meta.db_table
PORTFOLIO = portfolio_model()._meta.db_table
PROPERTY_PK = property_model()._meta.pk.column
PORTFOLIO_PK = portfolio_model()._meta.pk.column
PROPERTY_PORTFOLIO = property_portfolio_column()
# Their keys' type in every cast of a portfolio or property id: ``bigint``
# (any integer key), ``uuid`` or ``text`` (``retention.domain.key_sql_type``).
PORTFOLIO_KEY = portfolio_key_sql_type()
PROPERTY_KEY = property_key_sql_type()
POLICY = RetentionPolicy._meta.db_table
VERSION = PolicyVersion._meta.db_table

P = ParamSpec("P")


def execute(sql: str | pg.Composable, params: Sequence[Any] | Mapping[str, Any] = (), *, cur: Any = None) -> Any:
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


# --- Composition -----------------------------------------------------------------
# Names go into a statement through ``psycopg.sql``: a template with ``{name}``
# fields, each table or column name an ``Identifier`` (quoted), each fragment
# (a record kind's predicate, a CTE) the ``Composed`` its builder returns, so
# a statement is never text that another edits.


# The tables and columns above, as identifiers every template may name
# (``{job}``, ``{property_pk}`` …).
NAMES: dict[str, pg.Identifier] = {
    "job": pg.Identifier(JOB),
    "sweep": pg.Identifier(SWEEP),
    "ledger": pg.Identifier(LEDGER),
    "letter": pg.Identifier(LETTER),
    "property": pg.Identifier(PROPERTY),
    "portfolio": pg.Identifier(PORTFOLIO),
    "property_pk": pg.Identifier(PROPERTY_PK),
    "portfolio_pk": pg.Identifier(PORTFOLIO_PK),
    "property_portfolio": pg.Identifier(PROPERTY_PORTFOLIO),
    "policy": pg.Identifier(POLICY),
    "version": pg.Identifier(VERSION),
}


def ident(*names: str) -> pg.Identifier:
    """A table or column name (several: ``table.column``), quoted in the text."""
    return pg.Identifier(*names)


def composed(template: str, **parts: pg.Composable) -> pg.Composed:
    """``template`` with its ``{field}``s filled, kept composed until it
    executes (a cursor takes a ``Composed``): the pipeline's tables
    (``NAMES``) and ``parts``, each a ``Composable`` — an identifier
    (``ident``) quoted, a fragment (``pg.SQL``, another statement's
    ``Composed``) as it is, a value a ``pg.Literal`` or ``pg.Placeholder``.
    ``%s`` and ``%(name)s`` placeholders in the template pass through untouched."""
    return pg.SQL(template).format(**{**NAMES, **parts})


def lease_cleared(*, unless: pg.Composable | None = None, renewed: pg.Composable | None = None) -> pg.Composed:
    """The SET list that clears a job's lease (``lifecycle.LEASE_CLEARED``,
    rendered: the one definition in Python and SQL alike). ``unless``: a
    condition under which each column keeps its value instead (a batch that
    advances keeps its lease), ``lease_expires_at`` then set to ``renewed``."""
    sets = []
    for column, value in LEASE_CLEARED.items():
        cleared: pg.Composable = pg.Literal(value)
        if unless is not None:
            kept = renewed if column == "lease_expires_at" and renewed is not None else pg.Identifier(column)
            cleared = pg.SQL("CASE WHEN {unless} THEN {kept} ELSE {cleared} END").format(
                unless=unless, kept=kept, cleared=cleared
            )
        sets.append(pg.SQL("{column} = {value}").format(column=pg.Identifier(column), value=cleared))
    return pg.SQL(", ").join(sets)


Built = TypeVar("Built", bound=pg.Composable)


class Rendered(pg.Composed):
    """A shared statement (``statement``) that renders its text once per client
    encoding. psycopg renders a ``Composed`` again at every execution, walking
    its tree (every identifier quoted, every fragment encoded): about 0.8 ms of
    the worker's CPU for the statements of one batch (0.5 ms the ledger insert
    alone), on a machine where the client's CPU is taken from the server's
    (issue 40). The text of a statement depends on the encoding alone: its
    parts are fixed SQL, names from the models, literals of the enums and
    placeholders, never a value (and PostgreSQL's string quoting has not
    varied by session since ``standard_conforming_strings`` went on in 9.1).
    Still a ``Composed``: composed into another, or walked, like any."""

    def __init__(self, built: pg.Composable):
        super().__init__([built])
        self._texts: dict[str, bytes] = {}

    def as_bytes(self, context: AdaptContext | None = None) -> bytes:
        conn = context.connection if context is not None else None
        encoding = conn.info.encoding if conn is not None else "utf-8"
        text = self._texts.get(encoding)
        if text is None:
            text = self._texts[encoding] = super().as_bytes(context)
        return text


def statement(build: Callable[P, Built]) -> Callable[P, Built]:
    """A statement builder composed once per shape: cached on its (hashable)
    arguments, so a batch pays a dictionary lookup, not a composition, per
    statement, and its text is rendered once (``Rendered``). The ``Composed``
    it returns is shared: callers run it or compose it into another, never
    change it."""

    @functools.wraps(build)
    def once(*args: P.args, **kwargs: P.kwargs) -> Built:
        return Rendered(build(*args, **kwargs))  # type: ignore[return-value]  # a Composed, as every builder's

    return functools.cache(once)  # type: ignore[return-value]  # the same call signature, cached


# One transaction over one or several partitions. Every statement takes named
# parameters; the list of partitions is a table ``g`` (``rows_cte``): one
# array parameter per column through ``unnest``, so the text is the same
# whatever the number of partitions (psycopg parses it once and caches it)
# and a group of 100 partitions quotes six arrays, not 600 values. The types
# are spelled out (an untyped array parameter has none).

Columns = Sequence[tuple[str, str]]  # (name, PostgreSQL type)


def typed(sql_type: str) -> pg.Composed:
    """A positional parameter cast to ``sql_type``."""
    return pg.SQL("CAST(%s AS {type})").format(type=pg.SQL(sql_type))


def values_list(rows: int, types: Sequence[str]) -> pg.Composed:
    """``rows`` rows of positional parameters, each cast to its column's type
    (``typed``): the list after ``VALUES``."""
    row = pg.SQL("({cells})").format(cells=pg.SQL(", ").join(typed(t) for t in types))
    return pg.SQL(", ").join([row] * rows)


def rows_cte(name: str, columns: Columns) -> pg.Composed:
    """``name(col, …) AS (…)``, the body of a ``WITH`` over the rows
    ``rows_params`` gives (one text whatever their number)."""
    arrays = (
        pg.SQL("CAST({param} AS {type}[])").format(param=pg.Placeholder(f"{name}_{column}"), type=pg.SQL(sql_type))
        for column, sql_type in columns
    )
    return pg.SQL("{name}({names}) AS (SELECT * FROM unnest({arrays}))").format(
        name=pg.Identifier(name),
        names=pg.SQL(", ").join(pg.Identifier(column) for column, _ in columns),
        arrays=pg.SQL(", ").join(arrays),
    )


def array_text(values: Iterable[Any]) -> str | list[Any]:
    """The value of an array parameter that a statement casts
    (``CAST(%(name)s AS <type>[])``: ``rows_cte``, ``any_of``), as the
    array's text, ``{1,"a b",NULL}``, which the cast reads as it reads any
    array. psycopg builds that text itself from a list, but element by
    element in Python (a dumper looked up per element, each string searched
    for characters to quote): about 13 µs a value against 3 µs here, and a
    group's ledger write alone passes 16 columns of up to a few hundred
    values, on a worker whose CPU is taken from its server's (issue 40).

    Integers go as digits; strings always quoted, with the two characters an
    array element must escape (``\\`` and ``"``) escaped; aware datetimes in
    ISO 8601 with their offset; UUIDs as their text; booleans ``t``/``f``;
    ``None`` as ``NULL``. A column holding anything else (a naive datetime,
    whose meaning depends on the session's time zone; a decimal) goes as the
    list, for psycopg to dump as before. A string parameter is sent untyped,
    so the statement's cast decides the type, on a prepared statement as on
    Django's client-side cursor."""
    parts: list[str] = []
    listed = values if isinstance(values, list) else list(values)
    for value in listed:
        kind = type(value)
        if value is None:
            parts.append("NULL")
        elif kind is int:
            parts.append(str(value))
        elif isinstance(value, str):
            parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif kind is bool:
            parts.append("t" if value else "f")
        elif isinstance(value, int):  # an IntEnum, say
            parts.append(str(int(value)))
        elif isinstance(value, datetime) and value.tzinfo is not None:
            parts.append(value.isoformat())
        elif isinstance(value, uuid.UUID):
            parts.append(str(value))
        else:
            return listed
    return "{" + ",".join(parts) + "}"


def rows_params(name: str, columns: Columns, rows: Sequence[Any]) -> dict[str, Any]:
    """The parameters of ``rows_cte(name, columns)`` for ``rows``: each row an
    object with an attribute (or each a mapping with a key) per column, each
    column's values as one array's text (``array_text``)."""

    # Whether the rows are mappings is asked once, not per cell: an
    # ``isinstance`` against an abstract class costs about a microsecond, and
    # a group's ledger write has thousands of cells.
    if rows and isinstance(rows[0], Mapping):
        return {f"{name}_{column}": array_text([row[column] for row in rows]) for column, _ in columns}
    return {f"{name}_{column}": array_text([getattr(row, column) for row in rows]) for column, _ in columns}


def any_of(name: str, sql_type: str) -> pg.Composed:
    """``= ANY(array)``, one text whatever the number of values; ``any_params`` gives the parameter."""
    return pg.SQL("= ANY(CAST({param} AS {type}[]))").format(param=pg.Placeholder(name), type=pg.SQL(sql_type))


def any_params(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The parameter of ``any_of(name, …)``: the values as one array's text (``array_text``)."""
    return {name: array_text(values)}
