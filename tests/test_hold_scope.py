"""Which holds reach a record: one rule (``retention.eligibility.hold_scope``), and
every path that asks agrees with it.

Enumerated: every record shape (an integer key with a direct property, a UUID key,
no property, a property through the unit) by every hold a reviewer can place (its
portfolio, property, kind and record each the record's, another, or none; active
or released). For each, the record is asked of every consumer of the rule — the
eligibility predicate inside each DELETE (``hold_covers_sql``), the single
partition's held count, the group's held count (``g``), the purge's test over a
deleted record (``deleted_record_held_sql``), and the table-partition drop's
whole-portfolio check — and each answer is compared with the rule as the
glossary states it (``reaches`` below). A consumer that restates the rule and
misses a part of it (the property of a kind without one, a released hold, a
record hold's kind) is a mismatch named with its case.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection
from psycopg.sql import SQL, Placeholder

from cleanup_ops.execution import statements
from cleanup_ops.sql import composed, ident
from cleanup_ops.table_partitions import portfolios_held
from properties.models import Portfolio, Property
from retention.eligibility import deleted_record_held_sql, hold_covers_sql, hold_scope
from retention.models import LegalHold
from retention.registry import get_spec
from tests.schema_b.models import Unit

from . import record_shapes
from .conftest import make_records, make_user, utc

shapes = record_shapes.shapes

OLD = utc("2020-01-01T00:00:00Z")
OTHER_KIND = "maintenance_record"


@dataclass(frozen=True)
class Row:
    kind: str
    key: int | str  # as a hold names it: the integer id, or the key's text
    portfolio: int
    property: int | None  # NULL for a kind without a property (through the unit for a path)


@dataclass(frozen=True)
class Hold:
    portfolio: int
    property: int | None
    kind: str
    record: int | str | None
    released: bool


def reaches(hold: Hold, row: Row, *, whole_portfolio: bool = False) -> bool:
    """The rule as the glossary states it. ``whole_portfolio``: for every property
    and record of the portfolio at once (the drop)."""
    if hold.released or hold.portfolio != row.portfolio:
        return False
    if hold.property is not None and (row.property is None or (not whole_portfolio and hold.property != row.property)):
        return False  # a property's hold never reaches a kind without one
    if hold.kind not in ("", row.kind):
        return False
    return whole_portfolio or hold.record is None or hold.record == row.key


def _row(kind: str, portfolio: Portfolio, building: Property) -> Row:
    if kind == "lease":
        (pk,) = make_records(building, "lease", 1, ended=OLD)
        return Row(kind, pk, portfolio.pk, building.pk)
    if kind == "ticket":
        (key,) = record_shapes.tickets(building, 1, at=OLD)
        return Row(kind, str(key), portfolio.pk, building.pk)
    if kind == "notice":
        (pk,) = record_shapes.notices(portfolio, 1, at=OLD)
        return Row(kind, pk, portfolio.pk, None)
    unit = Unit.objects.create(building=building)
    (pk,) = record_shapes.visits(unit, portfolio, 1, at=OLD)
    return Row(kind, pk, portfolio.pk, building.pk)


def _answers(row: Row) -> dict[str, bool]:
    """What each consumer of the rule says of ``row`` with the holds now in place."""
    spec = get_spec(row.kind)
    key = row.key if spec.integer_key else uuid.UUID(str(row.key))
    names = {"table": ident(spec.table), "pk": ident(spec.pk_column)}
    partition = {"portfolio_id": row.portfolio, "property_id": row.property, "kind": row.kind, "id": key}
    with connection.cursor() as cur:
        covers, params = hold_covers_sql(row.kind)
        cur.execute(
            composed("SELECT {covers} FROM {table} r WHERE r.{pk} = %s", covers=covers, **names), [*params, key]
        )
        live = cur.fetchone()[0]
        single = statements._held_count(
            spec,
            scope=hold_scope(
                spec,
                portfolio=Placeholder("portfolio_id"),
                property=Placeholder("property_id"),
                kind=Placeholder("kind"),
            ),
            rows=SQL("c"),
            key=SQL("c.id"),
        )
        cur.execute(
            composed(
                "WITH c AS (SELECT CAST(%(id)s AS {t}) AS id) SELECT {held}", t=SQL(spec.pk_sql_type), held=single
            ),
            partition,
        )
        single_held = cur.fetchone()[0]
        group = statements._held_in(spec, composed("r.{pk} = %(id)s", **names))
        cur.execute(
            composed(
                "SELECT {held} FROM (VALUES (CAST(%(portfolio_id)s AS bigint), CAST(%(property_id)s AS bigint)))"
                " AS g (portfolio_id, property_id)",
                held=group,
            ),
            partition,
        )
        group_held = cur.fetchone()[0]
        cur.execute(
            composed(
                "SELECT {held} FROM (VALUES (CAST(%s AS bigint), CAST(%s AS bigint), CAST(%s AS text),"
                " CAST(%s AS bigint), CAST(%s AS text))) AS d (portfolio_id, property_id, record_kind, record_id,"
                " record_key)",
                held=deleted_record_held_sql("d"),
            ),
            [
                row.portfolio,
                row.property,
                row.kind,
                row.key if spec.integer_key else None,
                "" if spec.integer_key else row.key,
            ],
        )
        deleted = cur.fetchone()[0]
        drop = portfolios_held(cur, spec=spec, portfolios=[row.portfolio])
    return {
        "DELETE's predicate": bool(live),
        "single partition's held count": single_held == 1,
        "group's held count": group_held == 1,
        "purge's deleted-record test": bool(deleted),
        "drop's check (whole portfolio)": drop,
    }


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["lease", "ticket", "notice", "visit"])
def test_every_consumer_of_the_hold_rule_agrees_with_it_for_every_hold_a_reviewer_can_place(kind: str, shapes) -> None:  # type: ignore[no-untyped-def]
    portfolio = Portfolio.objects.create(name="Held", slug="held")
    elsewhere = Portfolio.objects.create(name="Elsewhere", slug="elsewhere")
    building = Property.objects.create(portfolio=portfolio, name="Building")
    neighbour = Property.objects.create(portfolio=portfolio, name="Neighbour")
    row = _row(kind, portfolio, building)
    another = 10**9 if isinstance(row.key, int) else str(uuid.uuid4())
    reviewer = make_user("hold-scope-reviewer", "compliance_reviewer")
    integer_key = get_spec(kind).integer_key

    cases = [
        Hold(p, prop, k, record, released)
        for p, prop, k, record, released in itertools.product(
            [portfolio.pk, elsewhere.pk],
            [None, building.pk, neighbour.pk],
            ["", kind, OTHER_KIND],
            [None, row.key, another],
            [False, True],
        )
        if not (k == "" and record is not None)  # a record hold names its kind (legalhold_record_needs_kind)
    ]
    mismatches = []
    for case in cases:
        hold = LegalHold.objects.create(
            portfolio_id=case.portfolio,
            property_id=case.property,
            record_kind=case.kind,
            record_id=case.record if integer_key else None,
            record_key="" if integer_key or case.record is None else str(case.record),
            reason="a subpoena for the file",
            placed_by=reviewer,
            placed_at=OLD,
            released_by=reviewer if case.released else None,
            released_at=OLD if case.released else None,
        )
        expected = reaches(case, row)
        for consumer, says in _answers(row).items():
            wants = reaches(case, row, whole_portfolio=True) if consumer.startswith("drop") else expected
            if says != wants:
                mismatches.append(f"{consumer} says {says} for {case} (the rule: {wants})")
        hold.delete()
    assert len(cases) == 84
    assert not mismatches, "\n".join(mismatches[:20])


@pytest.mark.unit
def test_the_hold_rule_is_written_in_one_module_of_the_product() -> None:
    """Every statement asks ``hold_scope``: no other product module spells an
    active hold's test (``released_at IS NULL``) in SQL."""
    root = Path(__file__).resolve().parent.parent
    spelled = sorted(
        str(path.relative_to(root))
        for package in ("retention", "cleanup_ops")
        for path in (root / package).rglob("*.py")
        if "migrations" not in path.parts and "h.released_at IS NULL" in path.read_text()
    )
    assert spelled == ["retention/eligibility.py"]
