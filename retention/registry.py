"""The record-kind registry: which tables expire, by which timestamp.

The policy choices, the eligibility predicate, admission, the delete
statement and the purge's reference check all read from this mapping. Adding
a record kind is more than one ``RecordKindSpec`` here, though. Today it also
takes the model (``properties/models.py``, with ``record_indexes`` and, for an
attachment, ``document_id_field``), its admin (``retention/admin_domain.py``),
the record builders of the demo seeder (``demo/services.py``) and of the tests
(``tests/conftest.py``, ``make_records``), and migrations: the new table, its
composite foreign key to the property on PostgreSQL (as
``properties/migrations/0003_record_portfolio_matches_property.py`` adds for
the others), and the ``record_kind`` choices of ``retention``'s and
``cleanup_ops``'s models.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from django.apps import apps
from django.db import models


@dataclass(frozen=True)
class RecordKindSpec:
    kind: str
    label: str
    model_label: str
    timestamp_field: str

    @cached_property
    def model(self) -> type[models.Model]:
        return apps.get_model(self.model_label)

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    @property
    def timestamp_column(self) -> str:
        return self.model._meta.get_field(self.timestamp_field).column


REGISTRY: dict[str, RecordKindSpec] = {
    spec.kind: spec
    for spec in (
        RecordKindSpec("lease", "Lease", "properties.Lease", "ended_on"),
        RecordKindSpec("maintenance_record", "Maintenance record", "properties.MaintenanceRecord", "closed_at"),
        RecordKindSpec("tenant_activity", "Tenant activity", "properties.TenantActivity", "occurred_at"),
    )
}

RECORD_KIND_CHOICES: list[tuple[str, str]] = [(spec.kind, spec.label) for spec in REGISTRY.values()]


class UnknownRecordKind(ValueError):
    def __init__(self, kind: str) -> None:
        super().__init__(f"record_kind: unknown record kind {kind!r}; expected one of {', '.join(REGISTRY)}")
        self.kind = kind


def get_spec(kind: str) -> RecordKindSpec:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise UnknownRecordKind(kind) from None
