"""Tenant activity, monthly partitioned (``PARTITION BY RANGE (occurred_at)``).

Why: a table partition whose months lie wholly past every portfolio's cutoff
and out of every hold's reach is dropped whole instead of deleted row by row
(``cleanup_ops.table_partitions``; the kind opts in with
``"drop_table_partitions": True``).

What the rebuild keeps, so that neither Django nor the application notices:

* the columns, exactly (``CREATE TABLE … (LIKE … INCLUDING DEFAULTS INCLUDING
  IDENTITY)``), and the id's numbering: the new identity's sequence continues
  from the old one's state (``setval``), so ids keep rising from where they
  were and none is handed out twice;
* every foreign key (to the portfolio, to the property, the composite key of
  ``0003``) and every index (``activity_due_idx``, ``activity_keyset_idx``,
  the portfolio's) under its own name, recreated from the old table's own
  definitions (``pg_get_constraintdef``, ``pg_get_indexdef``) on the parent,
  where they are partitioned: PostgreSQL creates them on every table
  partition and on any attached later;
* the rows (copied).

The primary key becomes ``(id, occurred_at)`` (PostgreSQL's rule: it must
include the partition key); Django's model keeps ``id`` as its key, which is
still unique because the sequence is. One table partition per calendar month
(UTC) from 2015-01 to 36 months after the migration runs, and a DEFAULT one
(never dropped), so an insert of any time lands somewhere. Nothing has a
foreign key *to* tenant activity (checked: the migration stops if something
does). Django's state does not change (``makemigrations --check``). The reverse rebuilds a plain table the same
way.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import migrations

TABLE = "properties_tenantactivity"
OLD = f"{TABLE}_rebuild"
FIRST_MONTH = (2015, 1)
MONTHS_AHEAD = 36


def month_starts(now: datetime) -> list[tuple[int, int]]:
    """(year, month) from ``FIRST_MONTH`` to ``MONTHS_AHEAD`` months after ``now``'s month, inclusive, plus one."""
    year, month = FIRST_MONTH
    last = now.year * 12 + now.month - 1 + MONTHS_AHEAD + 1
    out = []
    while year * 12 + month - 1 <= last:
        out.append((year, month))
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return out


def table_partition_name(year: int, month: int) -> str:
    return f"{TABLE}_{year:04d}_{month:02d}"


def _rows(cursor, sql: str, params: list | None = None) -> list:  # type: ignore[no-untyped-def, type-arg]
    cursor.execute(sql, params or [])
    return cursor.fetchall()


def rebuild(schema_editor, *, partitioned: bool) -> None:  # type: ignore[no-untyped-def]
    """Rebuild ``TABLE`` as a partitioned (or a plain) table with the same
    columns, keys, indexes, rows and id numbering."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        ((kind,),) = _rows(cursor, "SELECT relkind FROM pg_class WHERE oid = %s::regclass", [TABLE])
        if (kind == "p") == partitioned:
            return  # already in shape (a database made by hand, or migrated twice)
        referencing = _rows(
            cursor,
            "SELECT conname, conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' AND confrelid = %s::regclass",
            [TABLE],
        )
        if referencing:
            raise RuntimeError(
                f"Cannot rebuild {TABLE}: foreign keys point at it ({referencing}); "
                "a partitioned table's key includes occurred_at, which they do not name"
            )
        foreign_keys = _rows(
            cursor,
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE contype = 'f' AND conrelid = %s::regclass AND conparentid = 0 ORDER BY conname",
            [TABLE],
        )
        indexes = _rows(
            cursor,
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass AND NOT i.indisprimary ORDER BY c.relname",
            [TABLE],
        )
        ((sequence,),) = _rows(cursor, "SELECT pg_get_serial_sequence(%s, 'id')", [TABLE])
        ((last_value, is_called),) = _rows(cursor, f"SELECT last_value, is_called FROM {sequence}")  # noqa: S608 - the catalog's name
        ((pkey,),) = _rows(
            cursor, "SELECT conname FROM pg_constraint WHERE contype = 'p' AND conrelid = %s::regclass", [TABLE]
        )
    statements = [
        f"ALTER TABLE {TABLE} RENAME TO {OLD}",
        f"ALTER TABLE {OLD} RENAME CONSTRAINT {pkey} TO {OLD}_pkey",
        f"ALTER SEQUENCE {sequence} RENAME TO {OLD}_id_seq",
        *(f"ALTER INDEX {name} RENAME TO {name}_rebuild" for name, _ in indexes),
    ]
    if partitioned:
        statements += [
            f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING IDENTITY) PARTITION BY RANGE (occurred_at)",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {pkey} PRIMARY KEY (id, occurred_at)",
        ]
        months = month_starts(datetime.now(UTC))
        for (year, month), (end_year, end_month) in zip(months, months[1:], strict=False):
            statements.append(
                f"CREATE TABLE {table_partition_name(year, month)} PARTITION OF {TABLE} FOR VALUES"
                f" FROM ('{year:04d}-{month:02d}-01 00:00+00') TO ('{end_year:04d}-{end_month:02d}-01 00:00+00')"
            )
        statements.append(f"CREATE TABLE {TABLE}_default PARTITION OF {TABLE} DEFAULT")
    else:
        statements += [
            f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING IDENTITY)",
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {pkey} PRIMARY KEY (id)",
        ]
    statements += [
        f"INSERT INTO {TABLE} SELECT * FROM {OLD}",  # noqa: S608 - fixed names
        f"DROP TABLE {OLD}",
        # The new identity continues the old numbering.
        f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), {int(last_value)}, {bool(is_called)})",
        *(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} {definition}" for name, definition in foreign_keys),
        *(_on_parent(definition) for _, definition in indexes),
    ]
    for statement in statements:
        schema_editor.execute(statement)


def _on_parent(index_definition: str) -> str:
    """An index's definition (``pg_get_indexdef``, read before the rename) for the new table."""
    head, _, tail = index_definition.partition(" ON ")
    _, _, rest = tail.partition(" USING ")
    return f"{head} ON {TABLE} USING {rest}"


def forwards(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    rebuild(schema_editor, partitioned=True)


def backwards(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    rebuild(schema_editor, partitioned=False)


class Migration(migrations.Migration):
    dependencies = [("properties", "0005_lease_ended_at")]

    operations = [migrations.RunPython(forwards, backwards)]
