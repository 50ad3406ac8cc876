"""The second schema's record kinds (tests/schema_b, "Record shapes") as the
``RETENTION_RECORD_KINDS`` entries an adopter would write, the ``shapes``
fixture that registers them beside the demo's for one test, the ``clock``
at the sweep's moment, and the writers of each shape's rows.

Shared by the record shapes' test modules (``tests/test_record_shapes*.py``),
which take the fixtures in as ``shapes = record_shapes.shapes``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connection

from properties.models import Portfolio, Property
from retention.registry import DEFAULT_RECORD_KINDS, registry_reload
from tests.schema_b.models import MeterReading, Notice, Ticket, Unit, Visit

from .conftest import utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2026-05-01T00:00:00Z")  # past a 30-day cutoff
YOUNG = utc("2026-08-15T00:00:00Z")

TICKET = {
    "model": "schema_b.Ticket",
    "label": "Ticket",
    "timestamp": "resolved_at",
    "portfolio": "customer",
    "property": "building",
    "attachment": {"field": "document_id"},
}


NOTICE = {
    "model": "schema_b.Notice",
    "label": "Notice",
    "timestamp": "sent_at",
    "portfolio": "customer",
    "property": None,
    "attachment": {"field": "document_id"},
}
VISIT = {
    "model": "schema_b.Visit",
    "label": "Visit",
    "timestamp": "visited_at",
    "portfolio": "customer",
    "property": "unit__building",
}
CHARGE = {
    "model": "schema_b.LegacyCharge",
    "label": "Legacy charge",
    "timestamp": "billed_at",
    "portfolio": "customer",
    "property": "building",
}
READING = {
    "model": "schema_b.MeterReading",
    "label": "Meter reading",
    "timestamp": "read_at",
    "portfolio": "customer",
    "property": "building",
}
SHAPES = {"ticket": TICKET, "notice": NOTICE, "visit": VISIT, "legacy_charge": CHARGE, "meter_reading": READING}


@pytest.fixture
def shapes(settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """The demo's kinds and the shapes' kinds, for one test."""
    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, **SHAPES}
    registry_reload()
    yield
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def tickets(building: Property, count: int, *, at: datetime, documents: bool = False) -> list[uuid.UUID]:
    rows = [
        Ticket(
            customer_id=building.portfolio_id,
            building=building,
            resolved_at=at + timedelta(minutes=i),
            document_id=f"ticket-doc-{building.pk}-{at:%m%d}-{i}" if documents else "",
        )
        for i in range(count)
    ]
    Ticket.objects.bulk_create(rows)
    return [row.pk for row in rows]


def buildings(portfolio: Portfolio, count: int) -> list[Property]:
    return [Property.objects.create(portfolio=portfolio, name=f"Building {i}") for i in range(count)]


def notices(portfolio: Portfolio, count: int, *, at: datetime, documents: bool = False) -> list[int]:
    rows = [
        Notice(
            customer=portfolio,
            sent_at=at + timedelta(minutes=i),
            document_id=f"notice-doc-{portfolio.pk}-{at:%m%d}-{i}" if documents else "",
        )
        for i in range(count)
    ]
    return [row.pk for row in Notice.objects.bulk_create(rows)]


def visits(unit: Unit | None, portfolio: Portfolio, count: int, *, at: datetime) -> list[int]:
    rows = [Visit(customer=portfolio, unit=unit, visited_at=at + timedelta(minutes=i)) for i in range(count)]
    return [row.pk for row in Visit.objects.bulk_create(rows)]


def legacy_charges(building: Property, count: int, *, at: datetime) -> None:
    """Rows written as the other application writes them: plain SQL."""
    with connection.cursor() as cursor:
        for i in range(count):
            cursor.execute(
                "INSERT INTO legacy_charges (account_ref, site_ref, billed) VALUES (%s, %s, %s)",
                [building.portfolio_id, building.pk, at + timedelta(minutes=i)],
            )


def readings(building: Property, count: int, *, at: datetime) -> list[int]:
    rows = [
        MeterReading(customer_id=building.portfolio_id, building=building, read_at=at + timedelta(days=i))
        for i in range(count)
    ]
    return [row.pk for row in MeterReading.objects.bulk_create(rows)]


def shape_records(kind: str, building: Property, count: int, *, at: datetime) -> None:
    if kind == "ticket":
        tickets(building, count, at=at)
    elif kind == "notice":
        notices(building.portfolio, count, at=at)
    elif kind == "visit":
        visits(Unit.objects.create(building=building), building.portfolio, count, at=at)
    elif kind == "legacy_charge":
        legacy_charges(building, count, at=at)
    else:
        readings(building, count, at=at)
