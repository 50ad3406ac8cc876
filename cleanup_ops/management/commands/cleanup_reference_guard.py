"""Install (or print) the reference guard on the record tables (``cleanup_ops.downstream.guard``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import connection
from psycopg import sql as pg

from cleanup_ops.downstream.guard import (
    function_sql,
    guarded_kinds,
    guards_install,
    spellings_backfill_sql,
    trigger_sql,
)


class Command(BaseCommand):
    help = (
        "Guard the record tables with attachments: a record that starts naming a document waits for a purge "
        "deciding about it. Managed tables are guarded at every migrate; --install also guards unmanaged ones."
    )

    def add_arguments(self, parser: Any) -> None:
        action = parser.add_mutually_exclusive_group(required=True)
        action.add_argument("--install", action="store_true", help="create the function and every trigger")
        action.add_argument("--print-sql", action="store_true", help="print the SQL for a table's owner to run")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["print_sql"]:
            # The one place a statement becomes text: printed for a table's
            # owner to run, quoted as this database's connection quotes.
            connection.ensure_connection()

            def text(statement: pg.Composable) -> str:
                return statement.as_string(connection.connection).strip() + ";"

            self.stdout.write(text(function_sql()))
            for spec in guarded_kinds(include_unmanaged=True):
                for statement in trigger_sql(spec):
                    self.stdout.write(text(statement))
                backfill = spellings_backfill_sql(spec)
                if backfill is not None:
                    self.stdout.write(text(backfill))
            return
        # Rows written before the guard: their spellings recorded too (issue 37).
        kinds = guards_install(include_unmanaged=True, backfill=True)
        self.stdout.write(f"reference guard installed on {len(kinds)} record kinds: {', '.join(kinds) or 'none'}")
