"""The record-kind registry: which tables expire, by which timestamp, in which scope.

A record kind is configured, not coded: ``RETENTION_RECORD_KINDS`` maps each
kind's name to its model and the fields the pipeline reads::

    RETENTION_RECORD_KINDS = {
        "work_order": {
            "model": "maintenance.WorkOrder",    # managed or unmanaged
            "label": "Work order",
            "timestamp": "closed_on",            # DateField or DateTimeField
            "portfolio": "customer",             # FK to RETENTION_PORTFOLIO_MODEL
            "property": "building",              # FK to RETENTION_PROPERTY_MODEL,
                                                 # "unit__building" (one hop), or None
            "attachment": {"field": "document_id"},  # optional
        },
    }

An attachment lives in the demo's HTTP document store (``DOCSTORE_URL``),
or, with ``"attachment": {"field": "contract_pdf", "storage": "contracts"}``,
in the Django storage ``STORAGES["contracts"]`` (a ``FileField``, or a char
field holding the storage's key): ``cleanup_ops.downstream.stores``.

The default (``DEFAULT_RECORD_KINDS``) is the demo's three kinds. The policy
choices, the eligibility predicate, admission, the delete statement, the
purge's reference check and the console read column names — and, for the
shapes below, SQL fragments — from here, never literals; ``retention.checks``
validates the whole setting at start-up (Django's system checks), naming the
setting, the kind and the field, so a wrong configuration never reaches a
sweep. Adding a kind writes no product migration: the ``record_kind`` fields
take their choices from ``record_kind_choices``, a callable.

What a kind's model needs, and why: a primary key that is an integer (any
integer type) or a UUID (the keyset cursor walks it), the portfolio's
foreign key (the policy's and the hold's scope, and the customer isolation),
the retention timestamp, and the index the keyset scan walks
(``keyset_index_fields``: ``(property, pk)``, ``(unit, pk)`` for a one-hop
path, ``(portfolio, pk)`` without a property).

**Keys.** ``pk_sql_type`` is ``bigint`` for every integer key and ``uuid``
for a ``UUIDField``. An integer kind's cursor is carried exactly as before,
in the bigint columns (``CleanupJob.cursor``, ``LedgerEntry.after_id`` /
``last_id``, ``DeletedAttachment.record_id``, ``LegalHold.record_id``), and
its statements are the same texts as before this option existed (the demo's
path is not slowed by it). A non-integer kind's cursor and record ids are
carried as *text* in the columns beside them (``cursor_key``,
``after_key``/``last_key``, ``record_key``), the bigint ones left at 0/NULL:
the text is the database's own ``CAST(pk AS text)`` (``key_text``), so the
keyset comparison is ``pk > CAST(cursor_key AS uuid)`` on the column's own
index, and the start of the walk is the empty text (``KEY_START``). Only a
non-integer kind pays the two statements more per batch that read and
write the text cursor (and one more on a replay, for its last key); the
ledger rows of a group take the two text columns only when the group has
such a kind. The operation id is built from
the cursor as it is carried (the integer, or the text).

**Property.** ``property`` names the record's foreign key to the property
(``direct``), a one-hop path ``"unit__building"`` (``path``: the record's
foreign key to a unit model, whose foreign key is the property; every
statement goes through the join, no copied column), or ``None`` (``none``:
the partition is the portfolio, ``CleanupJob.property_id`` is NULL, and
holds reach the kind at portfolio and record scope only, never a
property's). A path row whose unit has no property (a NULL on the path)
belongs to no partition and is never deleted: the retention.W009
database check and the dry run count them (``count_unreachable``), so they
are reported rather than kept in silence.

**Table partitions.** ``"drop_table_partitions": True`` (default False)
opts a kind whose table is ``PARTITION BY RANGE`` on its timestamp
in to whole table partitions dropped when they lie past every portfolio's
cutoff and no hold can reach them (``cleanup_ops.table_partitions``); the rest
is deleted row by row as for any kind. Dropping is DDL: opt in only when
nothing else depends on old table partitions. Refused for a kind with an
attachment (its files need a purge decision per record).

A ``DateField`` timestamp is eligible only when its whole day (UTC) is before
the cutoff (``cutoff_sql``): a record closed on the cutoff's own day is kept.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import models
from psycopg import sql as pg

DEFAULT_RECORD_KINDS: dict[str, dict[str, Any]] = {
    "lease": {
        "model": "properties.Lease",
        "label": "Lease",
        "timestamp": "ended_at",
        "portfolio": "portfolio",
        "property": "property",
        "attachment": {"field": "document_id"},
    },
    "maintenance_record": {
        "model": "properties.MaintenanceRecord",
        "label": "Maintenance record",
        "timestamp": "closed_at",
        "portfolio": "portfolio",
        "property": "property",
        "attachment": {"field": "document_id"},
    },
    "tenant_activity": {
        "model": "properties.TenantActivity",
        "label": "Tenant activity",
        "timestamp": "occurred_at",
        "portfolio": "portfolio",
        "property": "property",
        # Monthly partitioned (properties 0006): whole old table
        # partitions out of every hold's reach are dropped (cleanup_ops.table_partitions).
        "drop_table_partitions": True,
    },
}

# The keys a kind's entry may have (``retention.checks`` refuses others).
KIND_KEYS = ("model", "label", "timestamp", "portfolio", "property", "attachment", "drop_table_partitions")


# The cursor of a non-integer key before its first batch (``cursor_key``).
KEY_START = ""


@dataclass(frozen=True)
class RecordKindSpec:
    kind: str
    label: str
    model_label: str
    timestamp_field: str
    portfolio_field: str = "portfolio"
    # The property's foreign key, a one-hop path ("unit__building"), or None.
    property_field: str | None = "property"
    attachment_field: str | None = None
    # The ``STORAGES`` alias the attachment lives in; None: the HTTP document
    # store at ``DOCSTORE_URL`` (``cleanup_ops.downstream.stores``).
    attachment_storage: str | None = None
    # Opted in to whole table partitions dropped (``cleanup_ops.table_partitions``).
    drop_table_partitions: bool = False

    @cached_property
    def model(self) -> type[models.Model]:
        return apps.get_model(self.model_label)

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    def _column(self, name: str) -> str:
        return self.model._meta.get_field(name).column  # type: ignore[union-attr, return-value]  # a concrete field: has a column

    @property
    def timestamp_column(self) -> str:
        return self._column(self.timestamp_field)

    @property
    def portfolio_column(self) -> str:
        return self._column(self.portfolio_field)

    @property
    def property_shape(self) -> str:
        """``direct``, ``path`` (one hop) or ``none``."""
        if self.property_field is None:
            return "none"
        return "path" if "__" in self.property_field else "direct"

    @property
    def has_property(self) -> bool:
        return self.property_field is not None

    @property
    def property_column(self) -> str:
        """The record's column of the property (``direct``), else of the unit (``path``)."""
        if self.property_field is None:
            raise ValueError(f"record kind {self.kind!r} has no property")
        return self._column(self.property_field.split("__")[0])

    @cached_property
    def path_hop(self) -> tuple[str, str, str] | None:
        """(unit table, unit pk column, unit's property column) of a one-hop
        path, None for other shapes: the rows a disposition locks ``FOR
        SHARE`` before it reads which property a record is in (lock, then
        read: a unit moved meanwhile waits for the disposition)."""
        return self._hop if self.property_shape == "path" else None

    @cached_property
    def _hop(self) -> tuple[str, str, str]:
        """(unit table, unit pk column, unit's property column) of a one-hop path."""
        first, second = str(self.property_field).split("__")
        unit = self.model._meta.get_field(first).related_model
        meta = unit._meta  # type: ignore[union-attr]  # a foreign key (checked by E005): its model is a class
        site = meta.get_field(second)
        return str(meta.db_table), str(meta.pk.column), str(site.column)  # type: ignore[union-attr]  # a foreign key

    def _at(self, alias: str, column: str) -> pg.Identifier:
        """Column ``column`` of row ``alias``, both quoted."""
        return pg.Identifier(alias, column)

    def _unit_hop(self) -> dict[str, pg.Identifier]:
        """The one-hop path's unit table and columns as identifiers, a
        template's ``{unit}``, ``{unit_pk}``, ``{unit_property}``."""
        table, pk, prop = self._hop
        return {"unit": pg.Identifier(table), "unit_pk": pg.Identifier(pk), "unit_property": pg.Identifier(prop)}

    def in_partition(self, alias: str, *, property_sql: pg.Composable, portfolio_sql: pg.Composable) -> pg.Composed:
        """Row ``alias`` belongs to the partition (``property_sql``,
        ``portfolio_sql``, SQL expressions): its property (through the path)
        or, without one, its portfolio."""
        shape = self.property_shape
        if shape == "direct":
            return pg.SQL("{column} = {property}").format(
                column=self._at(alias, self.property_column), property=property_sql
            )
        if shape == "none":
            return pg.SQL("{column} = {portfolio}").format(
                column=self._at(alias, self.portfolio_column), portfolio=portfolio_sql
            )
        return pg.SQL("{column} IN (SELECT u.{unit_pk} FROM {unit} u WHERE u.{unit_property} = {property})").format(
            column=self._at(alias, self.property_column), property=property_sql, **self._unit_hop()
        )

    def property_of(self, alias: str) -> pg.Composable:
        """The property id of row ``alias`` as an expression (NULL without one)."""
        shape = self.property_shape
        if shape == "direct":
            return self._at(alias, self.property_column)
        if shape == "none":
            return pg.SQL("NULL")
        return pg.SQL("(SELECT u.{unit_property} FROM {unit} u WHERE u.{unit_pk} = {column})").format(
            column=self._at(alias, self.property_column), **self._unit_hop()
        )

    def keyset_order(self, alias: str) -> pg.Composable:
        """The ORDER BY of the keyset walk, in the keyset index's order."""
        pk = self._at(alias, self.pk_column)
        if self.property_shape == "direct":
            return pg.SQL(", ").join([self._at(alias, self.property_column), pk])
        if self.property_shape == "none":
            return pg.SQL(", ").join([self._at(alias, self.portfolio_column), pk])
        return pk

    @property
    def integer_key(self) -> bool:
        return not isinstance(self.model._meta.pk, models.UUIDField)

    @property
    def pk_sql_type(self) -> str:
        """The key's type in every cast: ``bigint`` or ``uuid``."""
        return "bigint" if self.integer_key else "uuid"

    @property
    def key_start(self) -> int | str:
        return 0 if self.integer_key else KEY_START

    def key_text(self, value: Any) -> str:
        """A key as the database's ``CAST(pk AS text)`` spells it (PostgreSQL:
        the hyphenated form)."""
        parsed = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
        return str(parsed)

    def key_value(self, value: Any) -> int | str:
        """A key read from the database as the cursor carries it."""
        return int(value) if self.integer_key else self.key_text(value)

    def key_param(self, param: pg.Composable) -> pg.Composable:
        """A text parameter/column of a key as the key's type."""
        if self.integer_key:
            return param
        return pg.SQL("CAST(NULLIF({param}, '') AS uuid)").format(param=param)

    def after(self, alias: str, param: pg.Composable) -> pg.Composed:
        """Row ``alias`` lies after the cursor ``param`` (``KEY_START``: every row)."""
        pk = self._at(alias, self.pk_column)
        if self.integer_key:
            return pg.SQL("{pk} > {param}").format(pk=pk, param=param)
        return pg.SQL("({param} = '' OR {pk} > {key})").format(param=param, pk=pk, key=self.key_param(param))

    def at_most(self, alias: str, param: pg.Composable) -> pg.Composed:
        return pg.SQL("{pk} <= {key}").format(pk=self._at(alias, self.pk_column), key=self.key_param(param))

    def max_key(self, expr: pg.Composable) -> pg.Composed:
        """The largest key of ``expr`` as the cursor carries it (no ``max(uuid)`` in PostgreSQL)."""
        if self.integer_key:
            return pg.SQL("MAX({expr})").format(expr=expr)
        return pg.SQL("MAX(CAST({expr} AS text))").format(expr=expr)

    def key_sql_type(self) -> str:
        """The type a key is carried in by the batch's row lists."""
        return "bigint" if self.integer_key else "varchar"

    @property
    def pk_column(self) -> str:
        return self.model._meta.pk.column

    @property
    def attachment_column(self) -> str | None:
        return self._column(self.attachment_field) if self.attachment_field else None

    @property
    def timestamp_is_date(self) -> bool:
        field = self.model._meta.get_field(self.timestamp_field)
        return isinstance(field, models.DateField) and not isinstance(field, models.DateTimeField)

    def cutoff_sql(self, cutoff: pg.Composable) -> pg.Composable:
        """The value the timestamp column is compared with (``column < …``) for
        the cutoff expression ``cutoff`` (a timestamp): the cutoff itself, or
        for a ``DateField`` the cutoff's UTC date — a day is eligible only
        once all of it lies before the cutoff."""
        if not self.timestamp_is_date:
            return cutoff
        return pg.SQL("CAST(({cutoff}) AT TIME ZONE 'UTC' AS date)").format(cutoff=cutoff)

    def keyset_index_fields(self) -> list[str]:
        """The index the keyset scan walks: (property — the unit of a path,
        the portfolio without one —, primary key)."""
        first = self.portfolio_field if self.property_field is None else self.property_field.split("__")[0]
        return [first, self.model._meta.pk.name]


def spec_from_entry(kind: str, entry: Mapping[str, Any]) -> RecordKindSpec:
    attachment = entry.get("attachment") or None
    return RecordKindSpec(
        kind=kind,
        label=str(entry.get("label") or kind.replace("_", " ").capitalize()),
        model_label=str(entry["model"]),
        timestamp_field=str(entry["timestamp"]),
        portfolio_field=str(entry.get("portfolio", "portfolio")),
        property_field=None if entry.get("property", "property") is None else str(entry.get("property", "property")),
        attachment_field=str(attachment["field"]) if isinstance(attachment, Mapping) else None,
        attachment_storage=(str(attachment["storage"]) if attachment.get("storage") else None)
        if isinstance(attachment, Mapping)
        else None,
        drop_table_partitions=entry.get("drop_table_partitions") is True,
    )


def configured_kinds() -> Mapping[str, Any]:
    return getattr(settings, "RETENTION_RECORD_KINDS", None) or DEFAULT_RECORD_KINDS


def _build() -> dict[str, RecordKindSpec]:
    specs: dict[str, RecordKindSpec] = {}
    for kind, entry in configured_kinds().items():
        try:
            specs[kind] = spec_from_entry(kind, entry)
        except (KeyError, TypeError):
            # A malformed entry: retention.checks reports it at start-up.
            continue
    return specs


REGISTRY: dict[str, RecordKindSpec] = _build()


def registry_reload() -> None:
    """Rebuild ``REGISTRY`` in place from the settings (tests that change them)."""
    REGISTRY.clear()
    REGISTRY.update(_build())


def record_kind_choices() -> list[tuple[str, str]]:
    """The ``record_kind`` fields' choices: a callable, so that adding a kind
    in the settings writes no migration."""
    return [(spec.kind, spec.label) for spec in REGISTRY.values()]


class UnknownRecordKind(ValueError):
    def __init__(self, kind: str) -> None:
        super().__init__(f"record_kind: unknown record kind {kind!r}; expected one of {', '.join(REGISTRY)}")
        self.kind = kind


def get_spec(kind: str) -> RecordKindSpec:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise UnknownRecordKind(kind) from None
