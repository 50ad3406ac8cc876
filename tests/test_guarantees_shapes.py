"""The pipeline's promises on the second schema: the model-based machine of
``tests/test_guarantees_model.py`` run on ``tests/schema_b``'s kinds of other
shapes — a UUID key, no property, a one-hop property path, an unmanaged
table made in SQL, a monthly-partitioned table.

The same rules (the estate, holds of every scope at any moment, sweeps,
group and single slices, two workers at once, a vanished worker, failures,
redrives, the application moving, re-timing, re-filing, deleting and
inserting rows, also while a batch's DELETE waits on them, a worker stalled
past its session) and the same promises after every step: no record under
an active hold or younger than its cutoff deleted, no document purged while
a surviving record or a hold needs it, no operation id twice, deleted <=
candidates and held counted from the holds, one open delete job per
partition. The application's "move" is the shape's: a record keyed by UUID
changes its building, a record without a property its customer, a visit its
unit (its property is its unit's).

Shorter than that one (the demo schema's machine is the long one): 6 examples of
30 steps in the ci profile (tests/testenv.py), 1 of 15 in dev, 62 of 38 in nightly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from properties.models import Property
from retention.registry import registry_reload
from tests.schema_b.models import MeterReading, Notice, Ticket, Unit, Visit

from .guarantees_model_world import OLD, Record, guarantees_run
from .test_guarantees_model import Guarantees
from .test_record_shapes import SHAPES

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = list(SHAPES)


def _truncate_unmanaged() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE legacy_charges, meter_readings")


class ShapeGuarantees(Guarantees):
    kinds = KINDS
    with_files = ("ticket", "notice")

    def _estate_extra(self) -> None:
        # The tables Django does not manage are not in the machine's truncate.
        _truncate_unmanaged()
        # One unit per building: a visit's property is its unit's.
        self.units = {prop.pk: Unit.objects.create(building=prop, name=f"U{prop.pk}") for prop in self.props}

    def _make_records(self, kind: str, target: Property, count: int, ended: object) -> list[Any]:
        portfolio = target.portfolio_id
        if kind == "ticket":
            rows: list[Any] = [Ticket(customer_id=portfolio, building=target, resolved_at=ended) for _ in range(count)]
        elif kind == "notice":
            rows = [Notice(customer_id=portfolio, sent_at=ended) for _ in range(count)]
        elif kind == "visit":
            rows = [Visit(customer_id=portfolio, unit=self.units[target.pk], visited_at=ended) for _ in range(count)]
        elif kind == "meter_reading":
            rows = [MeterReading(customer_id=portfolio, building=target, read_at=ended) for _ in range(count)]
        else:  # legacy_charge: the other application's table, written in SQL
            from django.db import connection

            with connection.cursor() as cursor:
                return [
                    cursor.execute(
                        "INSERT INTO legacy_charges (account_ref, site_ref, billed) VALUES (%s, %s, %s)"
                        " RETURNING charge_no",
                        [portfolio, target.pk, ended],
                    ).fetchone()[0]
                    for _ in range(count)
                ]
        return [row.pk for row in type(rows[0]).objects.bulk_create(rows)]

    def _move_sql(self, record: Record, target: Property) -> tuple[str, list, dict]:
        portfolio = target.portfolio_id
        if record.kind == "notice":
            return "customer_id = %s", [portfolio], {"portfolio_id": portfolio}
        fields = {"property_id": target.pk, "portfolio_id": portfolio}
        if record.kind == "visit":
            return "unit_id = %s, customer_id = %s", [self.units[target.pk].pk, portfolio], fields
        if record.kind == "legacy_charge":
            return "site_ref = %s, account_ref = %s", [target.pk, portfolio], fields
        return "building_id = %s, customer_id = %s", [target.pk, portfolio], fields

    def _application_change(self, record: Record, change: str, prop: int, age: str) -> tuple[str, list, dict]:
        statement, params, fields = super()._application_change(record, change, prop, age)
        if "document_id" in fields and fields["document_id"] is None:
            # This schema's "no document" is "" (the column is NOT NULL).
            params = ["" if value is None else value for value in params]
        return statement, params, fields

    def _insert_old(self, app: Any, target: Property) -> Record:
        key = uuid.uuid4()
        app.execute(
            "INSERT INTO schema_b_ticket (id, customer_id, building_id, resolved_at, document_id)"
            " VALUES (%s, %s, %s, %s, '')",
            [key, target.portfolio_id, target.pk, OLD],
        )
        return Record("ticket", key, target.portfolio_id, target.pk, OLD, None)

    # The rules that draw a kind, drawing the second schema's.

    @initialize(
        layout=st.lists(
            st.tuples(st.integers(0, 3), st.sampled_from(KINDS), st.sampled_from(["none", "shared", "unique"])),
            min_size=3,
            max_size=8,
        ),
        holds_first=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", *KINDS])), max_size=2),
        first_slices=st.integers(0, 2),
    )
    def an_estate_with_expired_records(
        self, layout: list[tuple[int, str, str]], holds_first: list[tuple[int, str]], first_slices: int
    ) -> None:
        self._estate(layout, holds_first, first_slices)

    @rule(
        kind=st.sampled_from(KINDS),
        prop=st.integers(0, 3),
        count=st.integers(1, 4),
        age=st.sampled_from(["old", "borderline", "young"]),
        doc=st.sampled_from(["none", "shared", "unique"]),
        shared=st.integers(0, 2),
    )
    def add_records(self, kind: str, prop: int, count: int, age: str, doc: str, shared: int) -> None:
        self._add(kind, prop, count, age, doc, shared)

    @rule(
        prop=st.one_of(st.none(), st.integers(0, 3)),
        portfolio=st.integers(0, 1),
        kind=st.sampled_from(["", *KINDS]),
        one_record=st.booleans(),
        pick=st.integers(0, 10_000),
    )
    def place_hold(self, prop: int | None, portfolio: int, kind: str, one_record: bool, pick: int) -> None:
        self._place(prop, portfolio, kind, one_record, pick)


@pytest.fixture
def shapes_only(settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    settings.RETENTION_RECORD_KINDS = dict(SHAPES)
    registry_reload()
    yield
    # Django's flush after this test leaves the unmanaged tables alone.
    _truncate_unmanaged()
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


@pytest.mark.usefixtures("shapes_only")
def test_the_guarantees_hold_on_kinds_of_other_shapes_under_any_interleaving(docstore, settings):  # type: ignore[no-untyped-def]
    guarantees_run(ShapeGuarantees, docstore=docstore, settings=settings, cost=80, step_share=0.75)
