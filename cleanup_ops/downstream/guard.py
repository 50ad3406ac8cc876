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
a kind whose files are in a Django storage passes its alias, and its storage's
name rule and location (``AttachmentStore.name_rule``), as the trigger's
further arguments: the trigger takes the disposition of ``<alias>:<canonical
key>`` — the name the storage will act on, computed by
``cleanup_ops_storage_name`` (migration ``0020``, the SQL twin of
``AttachmentStore.canonical``) — so a record spelling ``contracts//a.pdf``
waits for the purge of ``contracts/a.pdf``, and it records such a spelling in
``DocumentSpelling``, which the purge's living-reference check asks the
record tables for too (issue 37). Rows written before the guard have no
spelling recorded: ``manage.py cleanup_reference_guard --install`` (and a
migrate that installs or changes a trigger) backfills them, and
cleanup_ops.W010 counts the rows still missing.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connection, transaction
from psycopg import sql as pg

from cleanup_ops.models import STORAGE_KEY_MAX_BYTES, DispositionState, DocumentDisposition, DocumentSpelling
from cleanup_ops.sql import composed, ident
from retention.registry import REGISTRY, RecordKindSpec

FUNCTION = "cleanup_ops_document_named"

_FUNCTION_TEMPLATE = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
    named text := to_jsonb(NEW) ->> TG_ARGV[0];
    name text;
BEGIN
    IF named IS NULL OR named = '' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND named IS NOT DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0]) THEN
        RETURN NEW;
    END IF;
    IF octet_length(named) > {max_bytes} THEN
        -- Longer than any store takes: never purged (the batch names the
        -- record as unpurgeable), so there is no decision to take part in.
        RETURN NEW;
    END IF;
    name := named;
    IF TG_NARGS > 3 THEN
        -- The storage's own name of the key (its name rule and location are
        -- the third and fourth arguments): the file the storage would act on.
        name := cleanup_ops_storage_name(TG_ARGV[2], TG_ARGV[3], named);
        IF name IS NULL THEN
            -- Refused by the storage's name rules: never purged (the batch
            -- names the record as unpurgeable), no decision to take part in.
            RETURN NEW;
        END IF;
    END IF;
    IF TG_NARGS > 1 THEN
        -- A kind whose files are in a Django storage: the document's
        -- reference is <alias>:<canonical key> (downstream.stores.document_ref).
        name := TG_ARGV[1] || ':' || name;
    END IF;
    -- The document's decision row, created if it has none yet (a purge that
    -- starts now waits for this transaction), then locked: this waits for a
    -- purge deciding about the document (it holds the row FOR UPDATE), and
    -- the next statement, with a fresh snapshot, gives a document purged
    -- meanwhile or before a fresh decision.
    INSERT INTO {disposition} (document_id, state) VALUES (name, {pending})
        ON CONFLICT (document_id) DO NOTHING;
    PERFORM 1 FROM {disposition} WHERE document_id = name FOR UPDATE;
    UPDATE {disposition} SET state = {pending}, decided_by_id = NULL, decided_at = NULL
        WHERE document_id = name AND state = {purged};
    IF TG_NARGS > 1 AND name <> (TG_ARGV[1] || ':' || named) THEN
        -- Spelled other than the storage's name: the purge's living check
        -- asks the record tables for this spelling too. Written under the
        -- decision row, so it commits with the record or not at all.
        INSERT INTO {spelling} (document_id, spelling) VALUES (name, named)
            ON CONFLICT (document_id, spelling) DO NOTHING;
    END IF;
    RETURN NEW;
END
$guard$"""


def function_sql() -> pg.Composed:
    return composed(
        _FUNCTION_TEMPLATE,
        function=ident(FUNCTION),
        max_bytes=pg.Literal(STORAGE_KEY_MAX_BYTES),
        disposition=ident(DocumentDisposition._meta.db_table),
        spelling=ident(DocumentSpelling._meta.db_table),
        pending=pg.Literal(str(DispositionState.PENDING)),
        purged=pg.Literal(str(DispositionState.PURGED)),
    )


def trigger_name(spec: RecordKindSpec) -> str:
    return f"cleanup_ops_guard_{spec.kind}"[:63]


def trigger_arguments(spec: RecordKindSpec) -> list[str]:
    """The trigger's arguments: the column; for a storage's kind its alias,
    and its name rule and location (``AttachmentStore.name_rule``, read from
    the storage as configured now)."""
    column = str(spec.attachment_column)
    if not spec.attachment_storage:
        return [column]
    from cleanup_ops.downstream.stores import storage_store

    rule, location = storage_store(spec.attachment_storage).name_rule()
    return [column, spec.attachment_storage, rule, location]


def trigger_sql(spec: RecordKindSpec) -> list[pg.Composed]:
    """The statements that (re)create the guard on one kind's table."""
    name, table, column = ident(trigger_name(spec)), ident(spec.table), ident(str(spec.attachment_column))
    arguments = pg.SQL(", ").join(pg.Literal(argument) for argument in trigger_arguments(spec))
    return [
        composed("DROP TRIGGER IF EXISTS {name} ON {table}", name=name, table=table),
        composed(
            "CREATE TRIGGER {name} BEFORE INSERT OR UPDATE OF {column} ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION {function}({arguments})",
            name=name,
            table=table,
            column=column,
            function=ident(FUNCTION),
            arguments=arguments,
        ),
    ]


def _canonical_spellings(spec: RecordKindSpec) -> tuple[pg.Composed, pg.Literal]:
    """The CTEs ``named`` (every distinct spelling a kind's rows hold, up to a
    key's length) and ``canonical`` (each with the storage's name for it): what
    the backfill records and the check counts, written once. With the kind's
    alias, which prefixes a name into a document id."""
    _, alias, rule, location = trigger_arguments(spec)
    ctes = composed(
        "WITH named AS (SELECT DISTINCT {column} AS spelling FROM {table}"
        " WHERE {column} <> '' AND octet_length({column}) <= {max_bytes}),"
        " canonical AS (SELECT spelling, cleanup_ops_storage_name({rule}, {location}, spelling) AS name FROM named)",
        column=ident(str(spec.attachment_column)),
        table=ident(spec.table),
        max_bytes=pg.Literal(STORAGE_KEY_MAX_BYTES),
        rule=pg.Literal(rule),
        location=pg.Literal(location),
    )
    return ctes, pg.Literal(alias)


def spellings_backfill_sql(spec: RecordKindSpec) -> pg.Composed | None:
    """The statement recording every spelling a kind's rows hold other than
    the storage's name (rows written before the guard), or None for a kind of
    the HTTP store (ids are their own name). One scan of the table: run when
    a guard is installed or changes, never per purge."""
    if not spec.attachment_storage:
        return None
    ctes, alias = _canonical_spellings(spec)
    return composed(
        "{ctes} INSERT INTO {spellings} (document_id, spelling)"
        " SELECT {alias} || ':' || name, spelling FROM canonical WHERE name IS NOT NULL AND name <> spelling"
        " ON CONFLICT (document_id, spelling) DO NOTHING",
        ctes=ctes,
        alias=alias,
        spellings=ident(DocumentSpelling._meta.db_table),
    )


def spellings_missing_sql(spec: RecordKindSpec) -> pg.Composed | None:
    """How many distinct spellings a kind's rows hold that the storage names
    otherwise and ``DocumentSpelling`` does not record (cleanup_ops.W010)."""
    if not spec.attachment_storage:
        return None
    ctes, alias = _canonical_spellings(spec)
    return composed(
        "{ctes} SELECT count(*) FROM canonical c WHERE c.name IS NOT NULL AND c.name <> c.spelling"
        " AND NOT EXISTS (SELECT 1 FROM {spellings} s WHERE s.document_id = {alias} || ':' || c.name"
        " AND s.spelling = c.spelling)",
        ctes=ctes,
        alias=alias,
        spellings=ident(DocumentSpelling._meta.db_table),
    )


def guarded_kinds(*, include_unmanaged: bool = False) -> list[RecordKindSpec]:
    return [
        spec for spec in REGISTRY.values() if spec.attachment_column and (include_unmanaged or spec.model._meta.managed)
    ]


def guard_arguments(spec: RecordKindSpec, *, cur: Any) -> tuple[int, list[str]] | None:
    """The kind's trigger on its table as it is: (its oid, its arguments), or None when missing."""
    cur.execute(
        """
        SELECT t.oid, t.tgnargs, t.tgargs FROM pg_trigger t
        WHERE t.tgrelid = to_regclass(quote_ident(%s)) AND t.tgname = %s
        """,
        [spec.table, trigger_name(spec)],
    )
    row = cur.fetchone()
    if row is None:
        return None
    oid, nargs, raw = row
    # tgargs: each argument followed by a NUL byte.
    return int(oid), [argument.decode() for argument in bytes(raw).split(b"\x00")[:nargs]]


def guard_current(spec: RecordKindSpec, *, cur: Any) -> bool:
    """Is the kind's trigger there, with the arguments it would be installed with now?"""
    found = guard_arguments(spec, cur=cur)
    return found is not None and found[1] == trigger_arguments(spec)


def guards_install(*, include_unmanaged: bool = False, backfill: bool = False, using: Any = None) -> list[str]:
    """Create the function and every trigger missing or different; returns the kinds guarded.

    A trigger already there with the arguments it would be installed with now
    (``guard_current``) is left alone: replacing it would take a lock on its
    table (and every table partition) and invalidate every cached plan over
    them, at every ``migrate`` and every test flush, for nothing.

    A storage kind's rows get their spellings recorded (``spellings_backfill_sql``)
    when ``backfill`` says so or its trigger was missing or different: in the
    transaction that creates the trigger, whose lock on the table keeps a
    record written meanwhile waiting until the trigger sees it."""
    kinds = guarded_kinds(include_unmanaged=include_unmanaged)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(function_sql())
        for spec in kinds:
            # Read before the trigger is replaced: was it missing or different?
            current = guard_current(spec, cur=cur)
            if not current:
                for statement in trigger_sql(spec):
                    cur.execute(statement)
            fill = spellings_backfill_sql(spec)
            if fill is not None and (backfill or not current):
                cur.execute(fill)
    return [spec.kind for spec in kinds]


def spellings_missing() -> dict[str, int]:
    """Per guarded storage kind with unrecorded spellings, how many (cleanup_ops.W010)."""
    missing: dict[str, int] = {}
    for spec in guarded_kinds(include_unmanaged=True):
        query = spellings_missing_sql(spec)
        if query is None:
            continue
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(query)
                (count,) = cur.fetchone()
        except DatabaseError:
            continue  # not migrated yet (no table, no function): nothing to count
        if count:
            missing[spec.kind] = int(count)
    return missing


def guards_outdated() -> list[str]:
    """The storage kinds whose trigger is missing or was installed with other
    arguments (another name rule or location, or before issue 37: no
    canonical names) — cleanup_ops.W011."""
    outdated = []
    for spec in guarded_kinds(include_unmanaged=True):
        if not spec.attachment_storage:
            continue
        try:
            with transaction.atomic(), connection.cursor() as cur:
                current = guard_current(spec, cur=cur)
        except DatabaseError:
            continue  # not migrated yet
        if not current:
            outdated.append(spec.kind)
    return outdated


def guards_on_migrate(sender: Any, **kwargs: Any) -> None:
    """``post_migrate``: guard the managed record tables once the product's tables exist."""
    if getattr(sender, "name", "") != "cleanup_ops":
        return
    guards_install()
