"""The record-kind registry: which tables expire, by which timestamp, in which scope.

A record kind is configured, not coded: ``RETENTION_RECORD_KINDS`` maps each
kind's name to its model and the fields the pipeline reads::

    RETENTION_RECORD_KINDS = {
        "work_order": {
            "model": "maintenance.WorkOrder",    # managed or unmanaged
            "label": "Work order",
            "timestamp": "closed_on",            # DateField or DateTimeField
            "portfolio": "customer",             # FK to RETENTION_PORTFOLIO_MODEL
            "property": "building",              # FK to RETENTION_PROPERTY_MODEL
            "attachment": {"field": "document_id"},  # optional
        },
    }

An attachment lives in the demo's HTTP document store (``DOCSTORE_URL``),
or, with ``"attachment": {"field": "contract_pdf", "storage": "contracts"}``,
in the Django storage ``STORAGES["contracts"]`` (a ``FileField``, or a char
field holding the storage's key): ``cleanup_ops.downstream.stores``.

The default (``DEFAULT_RECORD_KINDS``) is the demo's three kinds. The policy
choices, the eligibility predicate, admission, the delete statement, the
purge's reference check and the console read column names from here, never
literals; ``retention.checks`` validates the whole setting at start-up
(Django's system checks), naming the setting, the kind and the field, so a
wrong configuration never reaches a sweep. Adding a kind writes no product
migration: the ``record_kind`` fields take their choices from
``record_kind_choices``, a callable.

What a kind's model needs, and why: an integer primary key (the keyset
cursor is a bigint), a foreign key to the property (the partition, and a
legal hold's scope) and one to the portfolio (the policy's and the hold's
scope, and the customer isolation), the retention timestamp, and the index
``(property, pk) INCLUDE (timestamp)`` the keyset scan walks
(``keyset_index_fields``). Not yet supported, and refused by the checks
with that message: UUID primary keys, a property reached through a one-hop
path, and a kind without a property.

A ``DateField`` timestamp is eligible only when its whole day (UTC) is before
the cutoff (``cutoff_sql``): a record closed on the cutoff's own day is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import connection, models

DEFAULT_RECORD_KINDS: dict[str, dict[str, Any]] = {
    "lease": {
        "model": "properties.Lease",
        "label": "Lease",
        "timestamp": "ended_on",
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
    },
}

# The keys a kind's entry may have (``retention.checks`` refuses others).
KIND_KEYS = ("model", "label", "timestamp", "portfolio", "property", "attachment")


@dataclass(frozen=True)
class RecordKindSpec:
    kind: str
    label: str
    model_label: str
    timestamp_field: str
    portfolio_field: str = "portfolio"
    property_field: str = "property"
    attachment_field: str | None = None
    # The ``STORAGES`` alias the attachment lives in; None: the HTTP document
    # store at ``DOCSTORE_URL`` (``cleanup_ops.downstream.stores``).
    attachment_storage: str | None = None

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
    def property_column(self) -> str:
        return self._column(self.property_field)

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

    def cutoff_sql(self, cutoff: str) -> str:
        """The value the timestamp column is compared with (``column < …``) for
        the cutoff expression ``cutoff`` (a timestamp): the cutoff itself, or
        for a ``DateField`` the cutoff's UTC date — a day is eligible only
        once all of it lies before the cutoff."""
        if not self.timestamp_is_date:
            return cutoff
        if connection.vendor == "postgresql":
            return f"CAST(({cutoff}) AT TIME ZONE 'UTC' AS date)"
        return f"date({cutoff})"

    def keyset_index_fields(self) -> list[str]:
        """The index the keyset scan walks: (property, primary key)."""
        return [self.property_field, self.model._meta.pk.name]


def spec_from_entry(kind: str, entry: Mapping[str, Any]) -> RecordKindSpec:
    attachment = entry.get("attachment") or None
    return RecordKindSpec(
        kind=kind,
        label=str(entry.get("label") or kind.replace("_", " ").capitalize()),
        model_label=str(entry["model"]),
        timestamp_field=str(entry["timestamp"]),
        portfolio_field=str(entry.get("portfolio", "portfolio")),
        property_field=str(entry.get("property", "property")),
        attachment_field=str(attachment["field"]) if isinstance(attachment, Mapping) else None,
        attachment_storage=(str(attachment["storage"]) if attachment.get("storage") else None)
        if isinstance(attachment, Mapping)
        else None,
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
