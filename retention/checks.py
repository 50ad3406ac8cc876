"""System checks of ``RETENTION_RECORD_KINDS``: a wrong configuration never reaches a sweep.

Run by Django's check framework at start-up (``manage.py check``, ``runserver``,
``migrate``, every management command). Each error names the setting, the
kind and the field, and says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import models

from retention.registry import KIND_KEYS, configured_kinds

KIND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
SETTING = "RETENTION_RECORD_KINDS"


def _portfolio_label() -> str:
    return str(getattr(settings, "RETENTION_PORTFOLIO_MODEL", "properties.Portfolio"))


def _property_label() -> str:
    return str(getattr(settings, "RETENTION_PROPERTY_MODEL", "properties.Property"))


def _error(kind: str, key: str, message: str, code: int) -> Error:
    return Error(f"{SETTING}[{kind!r}][{key!r}]: {message}", id=f"retention.E{code:03d}")


def _fk_to(model: type[models.Model], name: str, target_label: str) -> str | None:
    """None when ``name`` is a foreign key of ``model`` to ``target_label``, else what is wrong."""
    try:
        field = model._meta.get_field(name)
    except Exception:
        return f"{model._meta.label} has no field {name!r}"
    if not isinstance(field, models.ForeignKey):
        return f"{model._meta.label}.{name} is not a foreign key"
    target = field.related_model
    if target is None or target._meta.label_lower != target_label.lower():  # type: ignore[union-attr]  # 'self' resolved once loaded
        return f"{model._meta.label}.{name} points at {target}, not at {target_label}"
    return None


def check_kind(kind: str, entry: Any) -> list[CheckMessage]:
    """Every problem of one kind's entry."""
    if not KIND_NAME.match(str(kind)):
        return [_error(str(kind), "name", "a kind's name is 1-40 of a-z, 0-9 and _, starting with a letter", 1)]
    if not isinstance(entry, Mapping):
        return [_error(kind, "entry", "expected a dict with model, timestamp, portfolio and property", 1)]
    problems: list[CheckMessage] = []
    unknown = sorted(set(entry) - set(KIND_KEYS))
    if unknown:
        problems.append(_error(kind, unknown[0], f"unknown key; expected some of {', '.join(KIND_KEYS)}", 1))
    for key in ("model", "timestamp"):
        if not entry.get(key):
            problems.append(_error(kind, key, "required", 1))
    if problems:
        return problems
    try:
        model = apps.get_model(str(entry["model"]))
    except (LookupError, ValueError):
        return [_error(kind, "model", f"no installed model {entry['model']!r} (expected 'app_label.ModelName')", 2)]
    meta = model._meta
    try:
        stamp = meta.get_field(str(entry["timestamp"]))
    except Exception:
        problems.append(_error(kind, "timestamp", f"{meta.label} has no field {entry['timestamp']!r}", 3))
    else:
        if not isinstance(stamp, models.DateField):
            problems.append(
                _error(kind, "timestamp", f"{meta.label}.{stamp.name} is not a DateField or DateTimeField", 3)
            )
    portfolio_problem = _fk_to(model, str(entry.get("portfolio", "portfolio")), _portfolio_label())
    if portfolio_problem:
        problems.append(_error(kind, "portfolio", portfolio_problem, 4))
    prop = entry.get("property", "property")
    if prop is not None:
        property_problem = _property_problem(model, str(prop))
        if property_problem:
            problems.append(_error(kind, "property", property_problem, 5 if "__" in str(prop) else 4))
    pk = meta.pk
    if not isinstance(
        pk, models.AutoField | models.BigAutoField | models.IntegerField | models.BigIntegerField | models.UUIDField
    ):
        problems.append(
            _error(
                kind,
                "model",
                f"{meta.label}'s primary key {pk.name if pk else None!r} is neither an integer nor a UUID: "
                "the keyset cursor walks the key, and only those two are carried (give the table one of them)",
                6,
            )
        )
    attachment = entry.get("attachment")
    if attachment is not None:
        if not isinstance(attachment, Mapping) or not attachment.get("field"):
            problems.append(_error(kind, "attachment", "expected {'field': <name of a CharField>}", 7))
        else:
            problems += _attachment_problems(kind, meta, attachment)
    if not problems:
        first = str(entry.get("portfolio", "portfolio")) if prop is None else str(prop).split("__")[0]
        problems += _index_problems(kind, model, first, str(entry["timestamp"]))
        problems += _table_partition_problems(kind, model, entry)
    return problems


def _table_partition_problems(kind: str, model: type[models.Model], entry: Mapping[str, Any]) -> list[CheckMessage]:
    """retention.E010, the half that reads no database: ``drop_table_partitions``
    is a bool, and True is refused for a kind with an attachment (a dropped
    table partition's files would get no purge decision). The table's shape
    is the database check's (``table_partitions_check``)."""
    value = entry.get("drop_table_partitions", False)
    if not isinstance(value, bool):
        return [_error(kind, "drop_table_partitions", f"expected True or False, got {value!r}", 10)]
    if value and entry.get("attachment") is not None:
        return [
            _error(
                kind,
                "drop_table_partitions",
                "refused for a kind with an attachment: a dropped table partition's records would leave their "
                "files without a purge decision (remove 'drop_table_partitions', or the attachment)",
                10,
            )
        ]
    return []


def table_partition_shape_problems(kind: str, entry: Mapping[str, Any]) -> list[CheckMessage]:
    """retention.E010, the half that reads the database: for a well-formed
    kind with ``drop_table_partitions`` True, once the table
    exists and its app's migrations are applied, the table must be
    ``PARTITION BY RANGE`` on exactly the kind's timestamp column
    (``cleanup_ops.table_partitions`` reads each table partition's bounds as
    times of that column). [] for any other entry (``check_kind`` reports
    a malformed one)."""
    if entry.get("drop_table_partitions") is not True or check_kind(kind, entry):
        return []
    model = apps.get_model(str(entry["model"]))
    column = str(model._meta.get_field(str(entry["timestamp"])).column)  # check_kind passed: a concrete field
    found = _partitioning(model)
    if found is None or found == ("r", [column]):
        return []
    strategy, columns = found
    shape = (
        "not partitioned"
        if strategy is None
        else f"PARTITION BY {({'r': 'RANGE', 'l': 'LIST', 'h': 'HASH'}).get(strategy, strategy)} ({', '.join(columns)})"
    )
    return [
        _error(
            kind,
            "drop_table_partitions",
            f"{model._meta.db_table} is {shape}; whole table partitions are dropped only from a table "
            f"PARTITION BY RANGE ({column}), the kind's timestamp (partition it so, or remove the key)",
            10,
        )
    ]


def _partitioning(model: type[models.Model]) -> tuple[str | None, list[str]] | None:
    """(strategy, key columns) of the model's table — (None, []) when it is
    not partitioned —, or None when it cannot be told yet: not PostgreSQL,
    the table missing or the database unreadable, or the app's migrations
    not all applied (``migrate`` runs this check before the migration that
    partitions the table)."""
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pt.partstrat, ARRAY(SELECT a.attname FROM unnest(CAST(pt.partattrs AS int2[]))"
                " WITH ORDINALITY k(attnum, n) JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
                " ORDER BY k.n) FROM pg_class c LEFT JOIN pg_partitioned_table pt ON pt.partrelid = c.oid"
                " WHERE c.oid = to_regclass(%s)",
                [model._meta.db_table],
            )
            row = cursor.fetchone()
        if row is None:
            return None
        found = (row[0], list(row[1] or []))
        if found[0] != "r" and model._meta.managed and _migrations_pending(model._meta.app_label):
            return None
        return found
    except DatabaseError:
        return None


def _migrations_pending(app_label: str) -> bool:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return any(migration.app_label == app_label for migration, _ in plan)


# A storage alias, as a purge's document reference carries it (``alias:key``).
STORAGE_ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def _attachment_problems(kind: str, meta: Any, attachment: Mapping[str, Any]) -> list[CheckMessage]:
    """The attachment's field, and its storage when it names one: an alias of
    ``STORAGES`` whose file (a ``FileField``) or key (a char field) it holds."""
    unknown = sorted(set(attachment) - {"field", "storage"})
    if unknown:
        return [_error(kind, "attachment", f"unknown key {unknown[0]!r}; expected 'field' and optionally 'storage'", 7)]
    storage = attachment.get("storage")
    problems: list[CheckMessage] = []
    if storage is not None:
        configured = getattr(settings, "STORAGES", None) or {}
        if not isinstance(storage, str) or not STORAGE_ALIAS.match(storage):
            problems.append(
                _error(
                    kind,
                    "attachment",
                    f"'storage' must be a STORAGES alias of 1-64 of A-Z, a-z, 0-9, _ and -, got {storage!r}",
                    7,
                )
            )
        elif storage not in configured:
            problems.append(
                _error(
                    kind,
                    "attachment",
                    f"'storage' names {storage!r}, which is not an alias in STORAGES "
                    f"(configured: {', '.join(sorted(configured)) or 'none'}); add it to STORAGES or fix 'storage'",
                    7,
                )
            )
    try:
        field = meta.get_field(str(attachment["field"]))
    except Exception:
        return [*problems, _error(kind, "attachment", f"{meta.label} has no field {attachment['field']!r}", 7)]
    if storage is None and not isinstance(field, models.CharField):
        problems.append(_error(kind, "attachment", f"{meta.label}.{field.name} is not a CharField (a document id)", 7))
    elif storage is not None and not isinstance(field, models.CharField | models.FileField):
        problems.append(
            _error(
                kind,
                "attachment",
                f"{meta.label}.{field.name} is neither a FileField nor a CharField (a storage key)",
                7,
            )
        )
    return problems


def _property_problem(model: type[models.Model], prop: str) -> str | None:
    """None when ``prop`` reaches the property: a foreign key to it, or a
    one-hop path ``unit__building`` (a foreign key to a model whose foreign
    key is the property)."""
    parts = prop.split("__")
    if len(parts) == 1:
        return _fk_to(model, prop, _property_label())
    if len(parts) > 2:
        return f"{prop!r} is a path of {len(parts) - 1} hops; one hop is supported ('unit__building')"
    try:
        hop = model._meta.get_field(parts[0])
    except Exception:
        return f"{model._meta.label} has no field {parts[0]!r} (the first hop of {prop!r})"
    if not isinstance(hop, models.ForeignKey) or hop.related_model is None:
        return f"{model._meta.label}.{parts[0]} is not a foreign key (the first hop of {prop!r})"
    unit = hop.related_model
    problem = _fk_to(unit, parts[1], _property_label())  # type: ignore[arg-type]
    return f"{problem} (the second hop of {prop!r})" if problem else None


def _index_problems(kind: str, model: type[models.Model], prop: str, timestamp: str) -> list[CheckMessage]:
    """The keyset scan walks an index on (property, primary key) — (unit, pk)
    for a path, (portfolio, pk) without a property; without it every batch
    sorts the partition's expired rows. An unmanaged table's index need not
    be declared: it is looked for in the database (a partitioned table's
    index counts when every partition has it)."""
    meta = model._meta
    pk = meta.pk.name
    wanted = [prop, pk]
    declared = [list(index.fields[:2]) for index in meta.indexes] + [list(t[:2]) for t in meta.unique_together]
    if wanted in declared or [prop, "pk"] in declared:
        return []
    columns = [str(getattr(meta.get_field(prop), "column", prop)), str(meta.pk.column)]
    if not meta.managed and _index_in_database(model, columns):
        return []
    name = f"{meta.db_table[:20]}_keyset_idx"
    hint = f"add models.Index(fields={wanted!r}, include=[{timestamp!r}], name={name!r}) to {meta.label}.Meta.indexes"
    message = f"{SETTING}[{kind!r}]: {meta.label} has no index on ({prop}, {pk}), which the keyset scan walks"
    if not meta.managed:
        # The table is not ours: the index may exist without being declared.
        return [Warning(message, hint=hint + " (or create it on the table)", id="retention.W008")]
    return [Error(message, hint=hint, id="retention.E008")]


def _index_in_database(model: type[models.Model], columns: list[str]) -> bool:
    """Whether the table (every partition of it, when it is partitioned) has
    an index whose first columns are ``columns``. False when the database
    cannot be read (the warning then stands)."""
    from django.db import DatabaseError, connection

    table = model._meta.db_table
    try:
        with connection.cursor() as cursor:
            tables = [table]
            cursor.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
                [table],
            )
            tables += [row[0] for row in cursor.fetchall()]
            for name in tables:
                constraints = connection.introspection.get_constraints(cursor, name)
                if not any(c.get("index") and list(c["columns"][:2]) == columns for c in constraints.values()):
                    return False
            return True
    except DatabaseError:
        return False


@register(Tags.models)
def record_kinds_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    kinds = configured_kinds()
    if not isinstance(kinds, Mapping) or not kinds:
        return [Error(f"{SETTING}: expected a non-empty dict of record kinds", id="retention.E001")]
    return [problem for kind, entry in kinds.items() for problem in check_kind(kind, entry)]


@register(Tags.database)
def table_partitions_check(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """retention.E010's table shape (``table_partition_shape_problems``), with
    the database checks (``check --database default``, ``migrate``): the
    models checks run where no database may be read."""
    kinds = configured_kinds()
    if not databases or not isinstance(kinds, Mapping):
        return []
    return [
        problem
        for kind, entry in kinds.items()
        if isinstance(entry, Mapping)
        for problem in table_partition_shape_problems(str(kind), entry)
    ]


@register(Tags.database)
def unreachable_records_check(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """retention.W009: rows of a kind whose property is a one-hop path
    that belong to no property (the path is NULL). No job ever deletes them
    (they are in no partition): said at start-up rather than kept in
    silence. Runs with the database checks (``check --database default``,
    ``migrate``)."""
    if not databases:
        return []
    from django.db import DatabaseError

    from retention.eligibility import count_unreachable
    from retention.registry import REGISTRY

    problems: list[CheckMessage] = []
    for kind, spec in REGISTRY.items():
        if spec.property_shape != "path":
            continue
        try:
            count = count_unreachable(kind)
        except DatabaseError:
            continue  # not migrated yet: nothing to count
        if count:
            problems.append(
                Warning(
                    f"{SETTING}[{kind!r}]['property']: {count} row{'' if count == 1 else 's'} of {spec.model_label}"
                    f" {'reaches' if count == 1 else 'reach'} no property "
                    f"through {spec.property_field!r} (a NULL on the path); no job will ever delete them",
                    hint="give them a unit in a property, or delete them yourself; "
                    "cleanup_sweep --dry-run counts them per portfolio",
                    id="retention.W009",
                )
            )
    return problems
