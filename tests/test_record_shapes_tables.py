"""Record kinds over tables Django does not make (tests/schema_b, "Record
shapes"): an unmanaged model over a table made in SQL, and a monthly-
partitioned table (PostgreSQL) — each keyset index found in the database,
each cleaned by the same pipeline.
"""

from __future__ import annotations

import pytest
from django.db import connection
from psycopg.sql import SQL

from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob, JobOutcome
from cleanup_ops.schedule import sweep_trigger
from retention.checks import check_kind
from retention.registry import get_spec
from retention.services import legal_hold_place
from tests.schema_b.models import MeterReading

from . import record_shapes
from .conftest import utc
from .record_shapes import CHARGE, NOW, OLD, READING, SLOT, YOUNG, buildings, legacy_charges, readings

# The fixtures, one definition for the record shapes' modules (tests/record_shapes.py).
shapes = record_shapes.shapes
clock = record_shapes.clock


# --- An unmanaged model over a table made in SQL ---------------------------------


@pytest.mark.django_db
def test_an_unmanaged_tables_keyset_index_is_found_in_the_database_not_the_model(shapes):
    assert check_kind("legacy_charge", CHARGE) == []
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX legacy_charges_keyset")
    (problem,) = check_kind("legacy_charge", CHARGE)
    # Not ours to change: a warning with the index to create, not an error.
    assert problem.id == "retention.W008" and "(or create it on the table)" in problem.hint


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_an_unmanaged_model_over_a_sql_table_is_cleaned_by_the_same_pipeline(
    shapes, settings, portfolio, active_policy, reviewer
):
    settings.CLEANUP_BATCH_SIZE = 4
    active_policy(portfolio, "legacy_charge", 30)
    open_site, held_site = buildings(portfolio, 2)
    legacy_charges(open_site, 9, at=OLD)
    legacy_charges(open_site, 2, at=YOUNG)
    legacy_charges(held_site, 3, at=OLD)
    legal_hold_place(
        portfolio=portfolio,
        property=held_site,
        record_kind="legacy_charge",
        placed_by=reviewer,
        reason="billing dispute",
    )

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    with connection.cursor() as cursor:
        cursor.execute("SELECT site_ref, COUNT(*) FROM legacy_charges GROUP BY site_ref")
        left = dict(cursor.fetchall())
    assert left == {open_site.pk: 2, held_site.pk: 3}
    jobs = {job.property_id: job for job in CleanupJob.objects.filter(record_kind="legacy_charge")}
    assert (jobs[open_site.pk].rows_deleted, jobs[open_site.pk].batches) == (9, 3)
    assert (jobs[held_site.pk].rows_held, jobs[held_site.pk].outcome) == (3, JobOutcome.HELD)


# --- A monthly-partitioned table (PostgreSQL) -----------------------------------


def partitions_holding(ids: list[int]) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT tableoid::regclass::text FROM meter_readings WHERE id = ANY(%s)", [ids])
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db
def test_a_partitioned_tables_keyset_index_counts_when_every_partition_has_it(shapes):
    assert check_kind("meter_reading", READING) == []
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX meter_readings_keyset")
        # On the parent only: the partitions have none.
        cursor.execute("CREATE INDEX meter_readings_keyset_only ON ONLY meter_readings (building_id, id)")
    (problem,) = check_kind("meter_reading", READING)
    assert problem.id == "retention.W008"


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_monthly_partitioned_table_is_cleaned_by_row_deletes_pruned_to_the_partitions_before_the_cutoff(
    shapes, settings, portfolio, prop, active_policy, reviewer
):
    settings.CLEANUP_BATCH_SIZE = 25
    active_policy(portfolio, "meter_reading", 30)
    old = readings(prop, 100, at=utc("2026-03-01T00:00:00Z"))  # March to June
    young = readings(prop, 20, at=utc("2026-08-01T00:00:00Z"))
    assert len(partitions_holding(old)) == 4
    held = old[50]
    legal_hold_place(
        portfolio=portfolio,
        property=prop,
        record_kind="meter_reading",
        record_id=held,
        placed_by=reviewer,
        reason="a disputed meter reading",
    )
    # The batch's candidate scan, with the cutoff a batch would have: the
    # partitions wholly after it are pruned, the others walk their copy of the index.
    spec = get_spec("meter_reading")
    from cleanup_ops.execution import statements

    statement = statements.partition_candidates(spec)
    params = {"property_id": prop.pk, "after_id": 0, "cutoff": utc("2026-07-22T02:00:00Z"), "lim": 25}
    with connection.cursor() as cursor:
        cursor.execute(SQL("EXPLAIN {}").format(statement), params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "meter_readings_2026_03" in plan and "meter_readings_2026_07" in plan
    assert "meter_readings_2026_08" not in plan and "meter_readings_2026_12" not in plan, plan
    assert "meter_readings_2026_03_building_id_id_read_at_idx" in plan, plan

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert set(MeterReading.objects.values_list("pk", flat=True)) == {held, *young}
    job = CleanupJob.objects.get(record_kind="meter_reading")
    assert (job.rows_deleted, job.rows_held, job.batches) == (99, 1, 4)
