"""One purge decision per document, a guarantee that is a structure now,
with the case that broke it: a held record's file purged through another
record's request. Concurrency is real: the hold is placed on another
PostgreSQL connection (``tests/interference.py``), and the purge's wait for
it is observed in ``pg_stat_activity``, not inferred from elapsed time.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from cleanup_ops.execution.runner import cleanup_drain, group_run_slice, job_run_slice
from cleanup_ops.models import CleanupJob, DispositionState, DocumentDisposition, JobKind, JobOutcome
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, MaintenanceRecord, Property
from retention.services import legal_hold_place, legal_hold_release

from . import interference
from .conftest import make_records, wait_until_blocked
from .interference import NEXT_SLOT, NOW, OLD, SLOT, Held, in_thread

clock = interference.clock


# --- 1. One purge decision per document -------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clock")
class TestOneDecisionPerDocument:
    @pytest.fixture
    def shared(self, portfolio, prop, active_policy, docstore):  # type: ignore[no-untyped-def]
        """A lease and a maintenance record of one property both name ``shared-1``;
        both are past their cutoff and deleted in one shared batch transaction."""
        active_policy(portfolio, "lease", 365)
        active_policy(portfolio, "maintenance_record", 365)
        (lease,) = make_records(prop, "lease", 1, ended=OLD)
        (record,) = make_records(prop, "maintenance_record", 1, ended=OLD)
        Lease.objects.filter(pk=lease).update(document_id="shared-1")
        MaintenanceRecord.objects.filter(pk=record).update(document_id="shared-1")
        docstore.create("shared-1")
        sweep_trigger(slot=SLOT, now=NOW)
        result = group_run_slice(owner="w")
        assert (result.leased, result.transactions, result.rows_deleted) == (2, 1, 2)
        purges = {job.record_kind: job for job in CleanupJob.objects.filter(job_kind=JobKind.PURGE)}
        assert set(purges) == {"lease", "maintenance_record"}
        return purges

    @pytest.mark.parametrize("first", ["maintenance_record", "lease"])
    def test_a_hold_on_one_record_that_named_a_file_keeps_it_whichever_request_purges_first(
        self, shared, portfolio, prop, reviewer, docstore, first
    ):
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="maintenance_record",
            placed_by=reviewer,
            reason="audit for the tests",
        )
        second = "lease" if first == "maintenance_record" else "maintenance_record"
        for kind in (first, second):
            assert job_run_slice(job_id=shared[kind].pk).outcome == JobOutcome.PURGE_HELD
        assert "shared-1" in docstore.documents()
        assert docstore.requests() == []
        decision = DocumentDisposition.objects.get(document_id="shared-1")
        assert decision.state == DispositionState.SET_ASIDE

    def test_a_later_request_from_another_scope_never_deletes_a_file_set_aside_under_an_active_hold(
        self, shared, portfolio, prop, reviewer, docstore, clock
    ):
        hold = legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="maintenance_record",
            placed_by=reviewer,
            reason="audit for the tests",
        )
        for job in shared.values():
            job_run_slice(job_id=job.pk)
        # Another property of the portfolio names the same file; its lease goes next sweep.
        other = Property.objects.create(portfolio=portfolio, name="Annex")
        (late,) = make_records(other, "lease", 1, ended=OLD)
        Lease.objects.filter(pk=late).update(document_id="shared-1")
        clock.move_to(NEXT_SLOT, tick=False)
        sweep_trigger(slot=NEXT_SLOT, now=NEXT_SLOT)
        cleanup_drain()
        assert not Lease.objects.filter(pk=late).exists()
        assert "shared-1" in docstore.documents() and docstore.requests() == []
        # Released: the next sweep's purge decides again, once.
        legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="audit closed")
        third = NEXT_SLOT + timedelta(days=1)
        clock.move_to(third, tick=False)
        sweep_trigger(slot=third, now=third)
        cleanup_drain()
        assert "shared-1" not in docstore.documents()
        assert [r["path"] for r in docstore.requests()] == ["/documents/shared-1"]
        assert DocumentDisposition.objects.get(document_id="shared-1").state == DispositionState.PURGED

    def test_a_document_is_deleted_once_however_many_requests_name_it(self, shared, docstore):
        for job in shared.values():
            assert job_run_slice(job_id=job.pk).outcome == JobOutcome.PURGED
        assert [r["path"] for r in docstore.requests()] == ["/documents/shared-1"]
        assert DocumentDisposition.objects.get(document_id="shared-1").state == DispositionState.PURGED

    def test_a_purge_waits_for_a_hold_being_placed_on_another_record_that_named_the_file(
        self, shared, portfolio, prop, reviewer, docstore
    ):
        # The hold's transaction locks the property row (FOR UPDATE) and stays
        # open; the lease's purge — whose own scope the hold does not name —
        # must wait for it, then see it.
        placing = Held(
            lambda: legal_hold_place(
                portfolio=portfolio,
                property=prop,
                record_kind="maintenance_record",
                placed_by=reviewer,
                reason="x for the tests",
            )
        )
        thread, outcome = in_thread(lambda: job_run_slice(job_id=shared["lease"].pk).outcome)
        while "pid" not in outcome:
            thread.join(0.01)
        wait_until_blocked(int(outcome["pid"]), by=placing.pid)  # type: ignore[arg-type]
        placing.release()
        thread.join(30)
        assert outcome.get("result") == JobOutcome.PURGE_HELD, outcome
        assert "shared-1" in docstore.documents()
