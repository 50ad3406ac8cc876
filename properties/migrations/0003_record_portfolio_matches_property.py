"""Each record's copied ``portfolio_id`` must be its property's portfolio.

The record tables copy ``portfolio_id`` so the legal-hold check and tenant
scoping need no join; a wrong copy would let a hold on one portfolio miss a
record, or show one customer's record to another. A composite
foreign key ``(property_id, portfolio_id) → properties_property (id,
portfolio_id)`` makes a mismatch impossible: an insert, or an update of either
column, that disagrees with the property is rejected, and so is moving a
property that still has records to another portfolio.

Before adding the keys, existing rows are checked; if any disagree the
migration stops and names each table with its count of offending rows (fix
them, then migrate again).
"""

from __future__ import annotations

from django.db import migrations, models

RECORD_TABLES = ("properties_lease", "properties_maintenancerecord", "properties_tenantactivity")


def fk_name(table: str) -> str:
    return f"{table}_property_portfolio_fk"


def mismatched_rows(connection) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Per record table, how many rows name a portfolio other than their property's."""
    counts = {}
    with connection.cursor() as cursor:
        for table in RECORD_TABLES:
            cursor.execute(
                f"SELECT COUNT(*) FROM {table} r JOIN properties_property p ON p.id = r.property_id"  # noqa: S608 - fixed names
                " WHERE r.portfolio_id <> p.portfolio_id"
            )
            (n,) = cursor.fetchone()
            if n:
                counts[table] = n
    return counts


def check_existing_rows(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    counts = mismatched_rows(schema_editor.connection)
    if counts:
        listing = ", ".join(f"{table}: {n} row(s)" for table, n in counts.items())
        raise RuntimeError(
            "Cannot add the record→property portfolio keys: some records carry a portfolio_id other than "
            f"their property's ({listing}). Find them with: SELECT r.id FROM <table> r JOIN properties_property p "
            "ON p.id = r.property_id WHERE r.portfolio_id <> p.portfolio_id; correct them, then migrate again."
        )


def add_composite_keys(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    for table in RECORD_TABLES:
        # Not deferrable: a mismatch fails at the statement that writes it,
        # where the error points at the culprit, not at some later COMMIT.
        schema_editor.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {fk_name(table)} FOREIGN KEY (property_id, portfolio_id)"
            " REFERENCES properties_property (id, portfolio_id) ON UPDATE NO ACTION ON DELETE NO ACTION"
        )


def drop_composite_keys(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    for table in RECORD_TABLES:
        schema_editor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {fk_name(table)}")


class Migration(migrations.Migration):
    dependencies = [("properties", "0002_attachments")]

    operations = [
        migrations.RunPython(check_existing_rows, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="property",
            constraint=models.UniqueConstraint(fields=("id", "portfolio"), name="property_id_portfolio_unique"),
        ),
        migrations.RunPython(add_composite_keys, drop_composite_keys),
    ]
