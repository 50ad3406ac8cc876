"""Record kinds whose property is not a column of their own (tests/schema_b,
"Record shapes"): a kind without a property, partitioned by portfolio, and
a kind that reaches its property through a join, partitioned, held and
deleted through it — the rows that reach no property reported, not kept in
silence.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from cleanup_ops.admission import sweep_preview
from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob, JobOutcome, LedgerEntry, Sweep
from cleanup_ops.proof import proof_csv_sign, proof_sign, sweep_proof
from cleanup_ops.proof_keys import proof_public_keys
from cleanup_ops.proof_verify import verify, verify_text
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio
from retention.checks import check_kind, unreachable_records_check
from retention.models import LegalHold
from retention.registry import get_spec
from retention.services import legal_hold_place
from tests.schema_b.models import Notice, Unit, Visit

from . import record_shapes
from .record_shapes import NOTICE, NOW, OLD, SLOT, VISIT, YOUNG, buildings, notices, visits

# The fixtures, one definition for the record shapes' modules (tests/record_shapes.py).
shapes = record_shapes.shapes
clock = record_shapes.clock


# --- No property ----------------------------------------------------------------


def test_a_kind_without_a_property_passes_the_checks_with_its_portfolio_keyset_index(shapes):
    assert check_kind("notice", NOTICE) == []
    assert get_spec("notice").keyset_index_fields() == ["customer", "id"]


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_kind_without_a_property_is_partitioned_by_portfolio_and_honours_portfolio_and_record_holds(
    shapes, settings, active_policy, reviewer, docstore
):
    settings.CLEANUP_BATCH_SIZE = 3
    first = Portfolio.objects.create(name="First", slug="first")
    second = Portfolio.objects.create(name="Second", slug="second")
    held_whole = Portfolio.objects.create(name="Held", slug="held")
    for portfolio in (first, second, held_whole):
        active_policy(portfolio, "notice", 30)
    old_first = notices(first, 7, at=OLD, documents=True)
    notices(second, 7, at=OLD)
    kept = notices(held_whole, 4, at=OLD)
    young = notices(first, 2, at=YOUNG)
    docstore.create(*Notice.objects.exclude(document_id="").values_list("document_id", flat=True))
    legal_hold_place(
        portfolio=first, record_kind="notice", record_id=old_first[3], placed_by=reviewer, reason="one notice kept"
    )
    legal_hold_place(portfolio=held_whole, record_kind="notice", placed_by=reviewer, reason="every notice kept")

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert set(Notice.objects.values_list("pk", flat=True)) == {old_first[3], *kept, *young}
    jobs = {job.portfolio_id: job for job in CleanupJob.objects.filter(record_kind="notice", job_kind="delete")}
    assert {job.property_id for job in jobs.values()} == {None}
    assert all(job.key.endswith(f":{job.portfolio_id}:-:notice") for job in jobs.values())
    # The two portfolios' batches have the same slot, cutoff, cursor and limit:
    # only the partition tells their operation ids apart, so both deleted.
    assert (jobs[first.pk].rows_deleted, jobs[first.pk].rows_held) == (6, 1)
    assert (jobs[second.pk].rows_deleted, jobs[second.pk].outcome) == (7, JobOutcome.DELETED)
    assert (jobs[held_whole.pk].rows_held, jobs[held_whole.pk].outcome) == (4, JobOutcome.HELD)
    assert set(LedgerEntry.objects.filter(record_kind="notice").values_list("property_id", flat=True)) == {None}
    assert docstore.documents() == {Notice.objects.get(pk=old_first[3]).document_id}
    proof = sweep_proof(sweep=Sweep.objects.get())
    keys = proof_public_keys()
    assert verify(proof_sign(proof=proof), keys=keys).ok
    assert verify_text(proof_csv_sign(proof=proof), keys=keys).ok


@pytest.mark.django_db
def test_a_property_hold_cannot_be_placed_on_a_kind_without_a_property(shapes, portfolio, prop, reviewer):
    with pytest.raises(ValidationError) as refused:
        legal_hold_place(
            portfolio=portfolio, property=prop, record_kind="notice", placed_by=reviewer, reason="a building's notices"
        )
    assert "belongs to no property" in refused.value.message_dict["property"][0]
    assert not LegalHold.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_portfolio_partition_has_at_most_one_open_delete_job(shapes, portfolio, active_policy):
    active_policy(portfolio, "notice", 30)
    notices(portfolio, 3, at=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    job = CleanupJob.objects.get(record_kind="notice")
    # A later sweep while it is still open: carried over, not admitted twice.
    later = sweep_trigger(slot=SLOT + timedelta(days=1), now=NOW + timedelta(days=1))
    assert CleanupJob.objects.filter(record_kind="notice").count() == 1
    assert Sweep.objects.get(pk=later.sweep.pk).carried_over == 1
    # And whoever else would insert one, the database refuses it.
    fields = {f: getattr(job, f) for f in ("portfolio_id", "record_kind", "policy_version_id", "cutoff", "sweep_id")}
    with pytest.raises(IntegrityError), transaction.atomic():
        CleanupJob.objects.create(key="another", property_id=None, available_at=NOW, **fields)


# --- A one-hop property path ----------------------------------------------------


def test_a_one_hop_path_passes_the_checks_and_a_wrong_one_is_refused_naming_the_property(shapes):
    assert check_kind("visit", VISIT) == []
    assert get_spec("visit").keyset_index_fields() == ["unit", "id"]
    for wrong, words in [
        ("unit__name", "is not a foreign key (the second hop of 'unit__name')"),
        ("customer__building", "has no field 'building'"),
        ("unit__building__portfolio", "one hop is supported"),
        ("visited_at__building", "is not a foreign key (the first hop"),
    ]:
        (problem,) = check_kind("visit", {**VISIT, "property": wrong})
        assert problem.id == "retention.E005"
        assert "RETENTION_RECORD_KINDS['visit']['property']" in problem.msg and words in problem.msg, problem.msg


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_kind_reached_through_its_unit_is_partitioned_held_and_deleted_through_the_join(
    shapes, settings, portfolio, active_policy, reviewer
):
    settings.CLEANUP_BATCH_SIZE = 3
    active_policy(portfolio, "visit", 30)
    sites = buildings(portfolio, 6)  # more than the per-partition statements: the lateral one too
    units = {site.pk: [Unit.objects.create(building=site), Unit.objects.create(building=site)] for site in sites}
    old = {
        site.pk: visits(units[site.pk][0], portfolio, 3, at=OLD) + visits(units[site.pk][1], portfolio, 2, at=OLD)
        for site in sites
    }
    young = visits(units[sites[0].pk][0], portfolio, 2, at=YOUNG)
    orphan_unit = Unit.objects.create(building=None)
    nowhere = visits(orphan_unit, portfolio, 2, at=OLD) + visits(None, portfolio, 1, at=OLD)
    held_site = sites[1]
    legal_hold_place(portfolio=portfolio, property=held_site, placed_by=reviewer, reason="a building under a claim")
    held_one = old[sites[0].pk][1]
    legal_hold_place(
        portfolio=portfolio,
        property=sites[0],
        record_kind="visit",
        record_id=held_one,
        placed_by=reviewer,
        reason="one visit under a claim",
    )
    # Moved into the held building before the sweep: held through its new unit's building.
    moved = old[sites[2].pk][0]
    Visit.objects.filter(pk=moved).update(unit=units[held_site.pk][0])

    preview = {row.record_kind: row for row in sweep_preview(slot=SLOT, portfolio_id=portfolio.pk).rows}
    assert (preview["visit"].expired, preview["visit"].held, preview["visit"].unreachable) == (30, 7, 3)
    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    kept = {held_one, *old[held_site.pk], moved, *young, *nowhere}
    assert set(Visit.objects.values_list("pk", flat=True)) == kept
    jobs = {job.property_id: job for job in CleanupJob.objects.filter(record_kind="visit", job_kind="delete")}
    assert set(jobs) == {site.pk for site in sites}  # none for the visits that reach no property
    assert (jobs[held_site.pk].rows_held, jobs[held_site.pk].outcome) == (6, JobOutcome.HELD)
    assert (jobs[sites[0].pk].rows_deleted, jobs[sites[0].pk].rows_held) == (4, 1)
    assert jobs[sites[2].pk].rows_deleted == 4
    assert sum(job.rows_deleted for job in jobs.values()) == 30 - 7
    # The visits that reach no property are reported, not kept in silence.
    (warning,) = unreachable_records_check(databases=["default"])
    assert warning.id == "retention.W009" and "3 rows of schema_b.Visit" in warning.msg


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_the_dry_run_command_reports_the_rows_a_null_path_keeps(shapes, portfolio, prop, active_policy):
    from io import StringIO

    from django.core.management import call_command

    active_policy(portfolio, "visit", 30)
    visits(Unit.objects.create(building=prop), portfolio, 2, at=OLD)
    visits(None, portfolio, 4, at=OLD)
    out = StringIO()
    call_command("cleanup_sweep", "--dry-run", "--slot", "2026-08-21T02:00Z", stdout=out)
    assert f"Portfolio {portfolio.pk}, visit: 4 rows past the cutoff belong to no property" in out.getvalue()


def _swept_unit(portfolio: Portfolio, active_policy, *, count: int):  # type: ignore[no-untyped-def]
    """Two buildings, a unit in the first with ``count`` old visits, swept:
    (first, second, unit, the visits' ids)."""
    first, second = buildings(portfolio, 2)
    active_policy(portfolio, "visit", 30)
    unit = Unit.objects.create(building=first)
    ids = visits(unit, portfolio, count, at=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    return first, second, unit, ids


@dataclass
class _WaitingBatch:
    """A drain whose batch's DELETE waits on a visit the application holds."""

    application: Any  # the application's connection, its transaction open
    observer: Any
    worker: Any  # the drain's InThread
    worker_pid: int  # its session's backend, as the checkpoint named it

    def blocked(self) -> bool:
        (blockers,) = self.observer.execute("SELECT pg_blocking_pids(%s)", [self.worker_pid]).fetchone()
        return bool(blockers)


@contextmanager
def _batch_waiting_on(settings, visit_id: int) -> Iterator[_WaitingBatch]:  # type: ignore[no-untyped-def]
    """The application holds ``visit_id``'s row (an UPDATE, not committed); a
    drain runs on a thread past ``batch.before_delete`` until its DELETE waits
    on that row. On leaving, the checkpoint and the connections are let go."""
    from tests.interleaving import CheckpointHold, InThread, poll, raw_connection

    settings.CLEANUP_CHECKPOINTS = frozenset({"batch.before_delete"})
    hold = CheckpointHold("batch.before_delete")
    observer = raw_connection()
    application = raw_connection(autocommit=False)
    try:
        application.execute(f"UPDATE {Visit._meta.db_table} SET visited_at = visited_at WHERE id = %s", [visit_id])
        worker = InThread(cleanup_drain, name="worker")
        worker_pid = hold.wait_for_worker(worker)
        hold.release()
        waiting = _WaitingBatch(application=application, observer=observer, worker=worker, worker_pid=worker_pid)
        poll(waiting.blocked, what="the batch's DELETE to wait on the application's row")
        yield waiting
    finally:
        hold.release()
        application.close()
        observer.close()
        settings.CLEANUP_CHECKPOINTS = frozenset()


@pytest.mark.django_db(transaction=True)
def test_a_unit_moved_into_a_held_building_while_the_batch_deletes_keeps_its_visits_or_moves_after_the_delete(
    shapes, settings, time_machine, portfolio, active_policy, reviewer
):
    """Issue 37, C1: the batch's DELETE waits on a visit the application holds;
    meanwhile the application moves the visits' unit into another building
    and a reviewer holds that building. Either the move waits for the batch
    (the unit is locked with the scope: its visits are deleted while still
    in the first building), or, had the move committed first, none of the
    moved visits may be deleted under the new building's hold."""
    from tests.interleaving import InThread

    time_machine.move_to(NOW, tick=False)
    _, second, unit, moved_visits = _swept_unit(portfolio, active_policy, count=4)
    with _batch_waiting_on(settings, moved_visits[0]) as batch:
        move = InThread(lambda: Unit.objects.filter(pk=unit.pk).update(building=second), name="move")
        move_state = move.settle(batch.observer)
        moved_first = move_state == "done"
        assert batch.blocked(), "the batch went on before the application's row was released"
        placed = InThread(
            lambda: legal_hold_place(
                portfolio=portfolio, property=second, placed_by=reviewer, reason="a claim on the second building"
            ),
            name="hold",
        )
        assert placed.settle(batch.observer) == "done"
        placed.reraise()
        batch.application.commit()
        batch.worker.join()
        move.join()
        batch.worker.reraise()
        move.reraise()

    left = set(Visit.objects.filter(pk__in=moved_visits).values_list("pk", flat=True))
    if moved_first:
        assert left == set(moved_visits), (
            f"{len(moved_visits) - len(left)} visit(s) of a unit moved into a held building were deleted after"
            " the move and the hold committed"
        )
    # The move waits for the batch: the visits go while their unit is still in the first building.
    assert move_state == "waiting"
    assert left == set()
    assert Unit.objects.get(pk=unit.pk).building_id == second.pk
    assert LegalHold.objects.filter(property_id=second.pk, released_at__isnull=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_application_that_changes_a_visit_then_moves_its_unit_under_a_batch_goes_on_and_the_batch_steps_back(
    shapes, settings, time_machine, portfolio, active_policy, caplog
):
    """The lock cycle the unit lock makes possible: the application changes a
    visit (the batch's DELETE waits on it), then moves the visit's unit (it
    waits on the batch's unit lock). PostgreSQL ends the side that waited
    first, the batch; the application's transaction commits, nothing is
    deleted, and the batch, a transient database error, is run again."""
    time_machine.move_to(NOW, tick=False)
    first, second, unit, kept = _swept_unit(portfolio, active_policy, count=3)
    with _batch_waiting_on(settings, kept[0]) as batch:
        batch.application.execute(
            f"UPDATE {Unit._meta.db_table} SET building_id = %s WHERE id = %s", [second.pk, unit.pk]
        )
        batch.application.commit()
        batch.worker.join()
        batch.worker.reraise()

    assert Unit.objects.get(pk=unit.pk).building_id == second.pk
    assert set(Visit.objects.filter(pk__in=kept).values_list("pk", flat=True)) == set(kept)
    job = CleanupJob.objects.get(record_kind="visit", property_id=first.pk)
    # Run again at once, after the unit's move: nothing of the first building is left to delete.
    assert (job.state, job.outcome, job.rows_deleted) == ("done", JobOutcome.NOTHING_ELIGIBLE, 0)
    (stepped_back,) = [r for r in caplog.records if getattr(r, "category", "") == "transient_database"]
    assert "OperationalError" in stepped_back.getMessage()
