"""The reference guard: a record that starts naming a document takes part in its one decision.

Why: a purge decides about a document under its ``DocumentDisposition`` row
lock (``downstream.decision``), and every batch that deletes a record naming it
takes that row too. But the application writes its record tables itself: a
record that *starts* naming the document — inserted, or its document field
edited — while the purge decides or calls the store would not be seen, and
the file could go while a committed record names it.

What: a trigger on each record table with an attachment field
(``BEFORE INSERT OR UPDATE OF <field>``) that, when a row starts naming a
document id, takes that document's disposition row (creating it if the
document has none yet, so a purge that starts meanwhile waits for the
record's transaction): it waits for a purge deciding about the document (at
most the purge's bounded call), and a document already ``purged`` gets a
fresh decision (``pending``: the id was named again, reused for a new file
or not). So a record's reference either
committed before the purge's decision (which then sees it and keeps the
file) or after the decision ended (the file was already gone when it was
named; the next deletion of the record decides again, and the store answers
"absent").

Installed by ``guards_install`` after every ``migrate`` for the configured
kinds whose models are managed (the tables this project creates); a table the
product does not own (an unmanaged model) gets it only when its owner runs
``manage.py cleanup_reference_guard --install`` (or the SQL it prints). The
trigger reads the row as JSON, so one function serves every table and column;
a kind whose files are in a Django storage passes its alias as the trigger's
second argument, and the trigger takes the disposition of ``<alias>:<key>``.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from cleanup_ops.models import STORAGE_KEY_MAX_BYTES, DispositionState, DocumentDisposition
from retention.registry import REGISTRY, RecordKindSpec

FUNCTION = "cleanup_ops_document_named"


def function_sql() -> str:
    table = DocumentDisposition._meta.db_table
    return f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
    named text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    IF named IS NULL OR named = '' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND named IS NOT DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0]) THEN
        RETURN NEW;
    END IF;
    IF octet_length(named) > {STORAGE_KEY_MAX_BYTES} THEN
        -- Longer than any store takes: never purged (the batch names the
        -- record as unpurgeable), so there is no decision to take part in.
        RETURN NEW;
    END IF;
    IF TG_NARGS > 1 THEN
        -- A kind whose files are in a Django storage: the document's
        -- reference is <alias>:<key> (downstream.stores.document_ref).
        named := TG_ARGV[1] || ':' || named;
    END IF;
    -- The document's decision row, created if it has none yet (a purge that
    -- starts now waits for this transaction), then locked: this waits for a
    -- purge deciding about the document (it holds the row FOR UPDATE), and
    -- the next statement, with a fresh snapshot, gives a document purged
    -- meanwhile or before a fresh decision.
    INSERT INTO {table} (document_id, state) VALUES (named, '{DispositionState.PENDING}')
        ON CONFLICT (document_id) DO NOTHING;
    PERFORM 1 FROM {table} WHERE document_id = named FOR UPDATE;
    UPDATE {table} SET state = '{DispositionState.PENDING}', decided_by_id = NULL, decided_at = NULL
        WHERE document_id = named AND state = '{DispositionState.PURGED}';
    RETURN NEW;
END
$guard$"""


def trigger_name(spec: RecordKindSpec) -> str:
    return f"cleanup_ops_guard_{spec.kind}"[:63]


def trigger_sql(spec: RecordKindSpec) -> list[str]:
    """The statements that (re)create the guard on one kind's table."""
    name, table, column = trigger_name(spec), spec.table, spec.attachment_column
    # The alias is checked to be [A-Za-z0-9_-] (retention.checks): safe as a literal.
    arguments = f"'{column}', '{spec.attachment_storage}'" if spec.attachment_storage else f"'{column}'"
    return [
        f"DROP TRIGGER IF EXISTS {name} ON {table}",
        f"CREATE TRIGGER {name} BEFORE INSERT OR UPDATE OF {column} ON {table}"
        f" FOR EACH ROW EXECUTE FUNCTION {FUNCTION}({arguments})",
    ]


def guarded_kinds(*, include_unmanaged: bool = False) -> list[RecordKindSpec]:
    return [
        spec for spec in REGISTRY.values() if spec.attachment_column and (include_unmanaged or spec.model._meta.managed)
    ]


def guards_install(*, include_unmanaged: bool = False, using: Any = None) -> list[str]:
    """Create the function and the triggers; returns the kinds guarded."""
    kinds = guarded_kinds(include_unmanaged=include_unmanaged)
    with connection.cursor() as cur:
        cur.execute(function_sql())
        for spec in kinds:
            for statement in trigger_sql(spec):
                cur.execute(statement)
    return [spec.kind for spec in kinds]


def guards_on_migrate(sender: Any, **kwargs: Any) -> None:
    """``post_migrate``: guard the managed record tables once the product's tables exist."""
    if getattr(sender, "name", "") != "cleanup_ops":
        return
    guards_install()
