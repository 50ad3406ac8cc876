"""Row deletes on a table partitioned by its retention timestamp read only the
table partitions their candidates lie in (``execution.statements``: the
DELETE keeps to the candidates' lowest and highest timestamp; the demo's
tenant activity is monthly partitioned on PostgreSQL, properties 0006).

The id is not the partition key: a DELETE matching the candidates by id
alone reads every table partition before the cutoff for each batch, which
made row deletes here several times slower per batch than on an
unpartitioned table (``docs/benchmarks.md``, "Table partitions").

Each DELETE a batch runs is first run under ``EXPLAIN (ANALYZE)`` in a
savepoint rolled back, which tells the table partitions its plan read from
those of the rows it deletes; then it runs as the product sent it. Both
shapes are seen: a partition alone (candidates and DELETE in one statement,
the span read by initplans: pruned as it starts) and a group of partitions
(``group_delete``, the span bound as literals: pruned when planned).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from django.db import connection

from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property, TenantActivity
from retention.services import legal_hold_place

from .conftest import make_records, utc

SLOT = utc("2026-08-21T02:00:00Z")  # a 365-day policy's cutoff: 2025-08-21
NOW = utc("2026-08-21T02:05:00Z")
TABLE = "properties_tenantactivity"

# Reads tenant activity's table partitions (their plans): as the migration made them (tests/conftest.py).
pytestmark = pytest.mark.table_partitions

KIND = "tenant_activity"
MONTHS = 6  # properties H0..H5, H<i>'s old rows in month i + 1 of 2020


def month(index: int) -> datetime:
    return utc(f"2020-{index + 1:02d}-15T00:00:00Z")


def table_partition(index: int) -> str:
    return f"{TABLE}_2020_{index + 1:02d}"


@dataclass
class Probe:
    shape: str  # "alone": candidates and DELETE in one statement; "group": group_delete
    read: set[str]  # table partitions of TABLE its plan read (the candidate walk apart)
    deleted: set[str]  # table partitions of the rows it deleted


def read_by(node: dict[str, Any]) -> set[str]:
    """Table partitions of ``TABLE`` a plan node and its children read (a scan
    executed at least once), leaving out the candidate walk ``CTE c``: it
    walks the keyset index of every table partition before the cutoff, by
    design (the cursor is an id)."""
    if node.get("Subplan Name") == "CTE c":
        return set()
    found = set()
    name = node.get("Relation Name", "")
    if name.startswith(f"{TABLE}_") and node.get("Actual Loops", 0) > 0:
        found.add(name)
    for child in node.get("Plans", []):
        found |= read_by(child)
    return found


@contextmanager
def delete_probes() -> Iterator[list[Probe]]:
    """Every DELETE of ``TABLE`` the batches run, probed first (module docstring)."""
    probes: list[Probe] = []

    def probe(execute: Any, sql: Any, params: Any, many: bool, context: dict[str, Any]) -> Any:
        # The product's statements arrive composed: read them as the text they run as.
        text = sql if isinstance(sql, str) else sql.as_string(context["connection"].connection)
        if f'DELETE FROM "{TABLE}"' in text:
            raw = context["cursor"].cursor  # psycopg's own: not through this wrapper again
            raw.execute("SAVEPOINT pruning_probe")
            raw.execute(f"SELECT id, tableoid::regclass::text FROM {TABLE}")
            before = dict(raw.fetchall())
            raw.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, params)
            (plan,) = raw.fetchone()[0]
            raw.execute(f"SELECT id FROM {TABLE}")
            gone = set(before) - {row[0] for row in raw.fetchall()}
            raw.execute("ROLLBACK TO SAVEPOINT pruning_probe")
            raw.execute("RELEASE SAVEPOINT pruning_probe")
            shape = "alone" if re.search(r"USING c\s", text) else "group"
            probes.append(Probe(shape, read_by(plan["Plan"]), {before[i] for i in gone}))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(probe):
        yield probes


@dataclass
class Estate:
    a: Portfolio
    b: Portfolio
    houses: list[Property]  # portfolio A's, one per month
    old: dict[int, list[int]]  # house index -> its old rows' ids (month index)
    young: list[int]
    b_rows: list[int]  # portfolio B's old rows, in the same table partitions, not yet due


def build_estate(active_policy, *, rows: int = 2) -> Estate:  # type: ignore[no-untyped-def]
    a = Portfolio.objects.create(name="A", slug="a")
    b = Portfolio.objects.create(name="B", slug="b")
    active_policy(a, KIND, 365)
    active_policy(b, KIND, 5000)  # cutoff 2013: none of B's rows is due
    houses = [Property.objects.create(portfolio=a, name=f"H{i}") for i in range(MONTHS)]
    b_house = Property.objects.create(portfolio=b, name="B0")
    old = {i: make_records(house, KIND, rows, ended=month(i)) for i, house in enumerate(houses)}
    young = make_records(houses[0], KIND, 2, ended=utc("2025-10-05T00:00:00Z"))
    b_rows = [i for index in range(MONTHS) for i in make_records(b_house, KIND, 1, ended=month(index))]
    return Estate(a, b, houses, old, young, b_rows)


def table_partitions_before_the_cutoff() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass AND c.relname < %s",
            [TABLE, f"{TABLE}_2025_09"],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
@pytest.mark.parametrize(("batch_size", "shape"), [(1, "alone"), (1000, "group")])
def test_each_batchs_delete_reads_only_the_table_partitions_its_candidates_lie_in(
    active_policy, settings, time_machine, row_deletes_only, batch_size, shape
):
    settings.CLEANUP_BATCH_SIZE = batch_size
    time_machine.move_to(NOW, tick=False)
    estate = build_estate(active_policy)
    assert table_partitions_before_the_cutoff() > 20 * MONTHS  # 2015 onwards: most are empty

    sweep_trigger(slot=SLOT, now=NOW)
    with delete_probes() as probes:
        cleanup_drain()

    assert shape in {probe.shape for probe in probes}, probes
    for probe in probes:
        # Every table partition the DELETE read holds rows it deleted: its
        # candidates' (here no hold keeps one, and the months are contiguous).
        assert probe.read == probe.deleted, probe
    every = {table_partition(i) for i in range(MONTHS)}
    assert set().union(*(probe.deleted for probe in probes)) == every
    left = set(TenantActivity.objects.values_list("id", flat=True))
    assert left == set(estate.young) | set(estate.b_rows)


@pytest.mark.django_db
@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_a_batch_still_deletes_exactly_the_eligible_unheld_rows_and_counts_the_held(
    active_policy, settings, time_machine, row_deletes_only, reviewer, batch_size
):
    settings.CLEANUP_BATCH_SIZE = batch_size
    time_machine.move_to(NOW, tick=False)
    estate = build_estate(active_policy, rows=3)
    record = estate.old[2][1]
    legal_hold_place(
        portfolio=estate.a,
        record_kind=KIND,
        record_id=record,
        placed_by=reviewer,
        reason="a disputed login for the tests",
    )
    legal_hold_place(portfolio=estate.a, property=estate.houses[4], placed_by=reviewer, reason="litigation for tests")

    sweep_trigger(slot=SLOT, now=NOW)
    with delete_probes() as probes:
        cleanup_drain()

    held = {record, *estate.old[4]}
    left = set(TenantActivity.objects.values_list("id", flat=True))
    assert left == held | set(estate.young) | set(estate.b_rows)
    jobs = {job.property_id: job for job in CleanupJob.objects.filter(record_kind=KIND, portfolio_id=estate.a.pk)}
    assert {house: (job.rows_deleted, job.rows_held) for house, job in jobs.items()} == {
        house.pk: (0 if i == 4 else 2 if i == 2 else 3, 3 if i == 4 else 1 if i == 2 else 0)
        for i, house in enumerate(estate.houses)
    }
    assert not CleanupJob.objects.filter(record_kind=KIND, portfolio_id=estate.b.pk).exists()  # nothing due in B
    for probe in probes:
        # A held candidate's table partition is read but keeps its row.
        assert probe.deleted <= probe.read <= {table_partition(i) for i in range(MONTHS)}, probe
