from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections, transaction

from cleanup_ops.execution.batches import job_load, run_batch
from cleanup_ops.execution.leases import job_lease
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, JobOutcome, JobState, LedgerEntry
from cleanup_ops.recovery.classification import LeaseLost
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import LegalHold
from retention.services import legal_hold_place, policy_version_approve, policy_version_submit

from .conftest import backend_pid, make_records, make_user, remaining_ids, utc, wait_until_blocked

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(NOW, tick=False)
    return time_machine


def admit() -> CleanupJob:
    sweep_trigger(slot=SLOT, now=NOW)
    return CleanupJob.objects.get()


def drain_job(job_id: int, **kwargs) -> list:
    results = []
    for _ in range(100):
        result = job_run_slice(job_id=job_id, **kwargs)
        results.append(result)
        if result.outcome or not result.leased:
            break
    return results


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
class TestBatches:
    def test_a_job_deletes_its_expired_rows_in_batches_with_one_ledger_row_each(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        old = make_records(prop, "lease", 25, ended=OLD)
        recent = make_records(prop, "lease", 3, ended=NOW - timedelta(days=10))
        job = admit()
        drain_job(job.pk, batch_size=10, max_batches=2)
        job.refresh_from_db()
        assert (job.state, job.outcome, job.rows_deleted, job.rows_held) == ("done", "deleted", 25, 0)
        assert remaining_ids(prop, "lease") == set(recent)
        ledger = list(LedgerEntry.objects.order_by("id"))
        assert [(e.after_id, e.last_id, e.rows_deleted) for e in ledger] == [
            (0, old[9], 10),
            (old[9], old[19], 10),
            (old[19], old[24], 5),
        ]
        assert len({e.operation_id for e in ledger}) == 3
        assert job.leases == 2  # slices of two batches each: the lease was released in between

    def test_a_job_whose_rows_are_all_held_ends_as_held(self, portfolio, prop, active_policy, reviewer):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 4, ended=OLD)
        job = admit()
        legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation")
        drain_job(job.pk)
        job.refresh_from_db()
        assert (job.outcome, job.rows_deleted, job.rows_held) == (JobOutcome.HELD, 0, 4)
        assert len(remaining_ids(prop, "lease")) == 4

    def test_rows_gone_before_execution_end_the_job_as_nothing_eligible(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 2, ended=OLD)
        job = admit()
        from properties.models import Lease

        Lease.objects.all().delete()
        drain_job(job.pk)
        job.refresh_from_db()
        assert job.outcome == JobOutcome.NOTHING_ELIGIBLE and not LedgerEntry.objects.exists()

    def test_a_missing_property_ends_the_job_as_scope_missing(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 2, ended=OLD)
        job = admit()
        CleanupJob.objects.filter(pk=job.pk).update(property_id=prop.pk + 1000)
        drain_job(job.pk)
        job.refresh_from_db()
        assert job.outcome == JobOutcome.SCOPE_MISSING
        assert len(remaining_ids(prop, "lease")) == 2

    def test_a_withdrawn_policy_deletes_nothing(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 3, ended=OLD)
        job = admit()
        active_policy(portfolio, "lease", 365, enabled=False)
        drain_job(job.pk)
        job.refresh_from_db()
        assert job.outcome == JobOutcome.POLICY_WITHDRAWN
        assert len(remaining_ids(prop, "lease")) == 3

    def test_a_stricter_policy_after_admission_deletes_less(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        older = make_records(prop, "lease", 2, ended=SLOT - timedelta(days=800))
        middle = make_records(prop, "lease", 3, ended=SLOT - timedelta(days=500))
        job = admit()
        active_policy(portfolio, "lease", 700)  # longer retention: cutoff moves back
        drain_job(job.pk)
        assert remaining_ids(prop, "lease") == set(middle)
        assert not set(older) & remaining_ids(prop, "lease")
        job.refresh_from_db()
        assert LedgerEntry.objects.get().policy_version_id != job.policy_version_id

    def test_a_laxer_policy_after_admission_deletes_no_more_than_admitted(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        older = make_records(prop, "lease", 2, ended=SLOT - timedelta(days=500))
        young = make_records(prop, "lease", 3, ended=SLOT - timedelta(days=100))
        job = admit()
        active_policy(portfolio, "lease", 30)  # shorter retention: would allow more
        drain_job(job.pk)
        assert remaining_ids(prop, "lease") == set(young)
        assert older and LedgerEntry.objects.get().policy_version_id == job.policy_version_id

    def test_a_hold_placed_after_admission_protects_its_rows(self, portfolio, prop, active_policy, reviewer):
        active_policy(portfolio, "lease", 365)
        ids = make_records(prop, "lease", 6, ended=OLD)
        job = admit()
        legal_hold_place(
            portfolio=portfolio, record_kind="lease", record_id=ids[2], placed_by=reviewer, reason="x for the tests"
        )
        legal_hold_place(
            portfolio=portfolio, record_kind="lease", record_id=ids[4], placed_by=reviewer, reason="y for the tests"
        )
        drain_job(job.pk, batch_size=2)
        assert remaining_ids(prop, "lease") == {ids[2], ids[4]}
        job.refresh_from_db()
        assert (job.rows_deleted, job.rows_held, job.outcome) == (4, 2, JobOutcome.DELETED)

    def test_held_rows_and_rows_inserted_during_the_drain_neither_stall_nor_skip_the_cursor(
        self, portfolio, prop, active_policy, reviewer
    ):
        active_policy(portfolio, "lease", 365)
        first = make_records(prop, "lease", 6, ended=OLD)
        job = admit()
        # A hold on the first two rows: a cursor that stopped at held rows would stall here.
        for record_id in first[:2]:
            legal_hold_place(
                portfolio=portfolio,
                record_kind="lease",
                record_id=record_id,
                placed_by=reviewer,
                reason="h for the tests",
            )
        loaded = job_load(job.pk)
        lease = job_lease(job_id=job.pk, owner="t")
        assert run_batch(job=loaded, lease=lease, limit=2) == (0, "")
        assert run_batch(job=loaded, lease=lease, limit=2) == (2, "")
        late = make_records(prop, "lease", 3, ended=OLD)  # inserted mid-drain, old timestamps
        while not run_batch(job=loaded, lease=lease, limit=2)[1]:
            pass
        assert remaining_ids(prop, "lease") == set(first[:2])
        assert not set(late) & remaining_ids(prop, "lease")
        job.refresh_from_db()
        assert (job.rows_deleted, job.rows_held) == (7, 2)


@pytest.mark.django_db
class TestLeasing:
    def test_a_job_is_never_leased_before_available_at(self, portfolio, prop, active_policy, clock):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 2, ended=OLD)
        job = admit()
        CleanupJob.objects.filter(pk=job.pk).update(available_at=NOW + timedelta(minutes=5))
        clock.move_to(NOW + timedelta(minutes=4, seconds=59), tick=False)
        assert job_run_slice(job_id=job.pk).leased is False
        assert len(remaining_ids(prop, "lease")) == 2
        clock.move_to(NOW + timedelta(minutes=5), tick=False)
        assert job_run_slice(job_id=job.pk).outcome == JobOutcome.DELETED

    def test_a_redelivered_finished_job_does_nothing(self, portfolio, prop, active_policy, clock):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 3, ended=OLD)
        job = admit()
        drain_job(job.pk)
        again = job_run_slice(job_id=job.pk)
        assert again.leased is False
        assert LedgerEntry.objects.count() == 1

    def test_a_worker_whose_lease_expired_commits_nothing(self, portfolio, prop, active_policy, clock, settings):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 4, ended=OLD)
        job = admit()
        loaded = job_load(job.pk)
        slow = job_lease(job_id=job.pk, owner="slow")
        clock.move_to(NOW + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS + 1), tick=False)
        with pytest.raises(LeaseLost):
            run_batch(job=loaded, lease=slow, limit=2)  # expired, even before anyone re-leases
        fast = job_lease(job_id=job.pk, owner="fast")
        assert fast is not None
        with pytest.raises(LeaseLost):
            run_batch(job=loaded, lease=slow, limit=2)
        assert len(remaining_ids(prop, "lease")) == 4 and not LedgerEntry.objects.exists()
        assert run_batch(job=loaded, lease=fast, limit=2)[0] == 2

    def test_a_lost_acknowledgement_is_replayed_from_the_ledger_not_applied_twice(
        self, portfolio, prop, active_policy, clock
    ):
        active_policy(portfolio, "lease", 365)
        ids = make_records(prop, "lease", 4, ended=OLD)
        job = admit()
        drain_job(job.pk, batch_size=2)
        assert LedgerEntry.objects.count() == 2
        # A second job for the same partition that starts from an earlier
        # cursor (as a redrive does) meets the same operation ids.
        make_records(prop, "lease", 1, ended=OLD)
        CleanupJob.objects.filter(pk=job.pk).update(
            state=JobState.PENDING, outcome="", cursor=0, rows_deleted=0, rows_held=0
        )
        drain_job(job.pk, batch_size=2)
        job.refresh_from_db()
        entries = list(LedgerEntry.objects.order_by("id"))
        assert len(entries) == 3 and len({e.operation_id for e in entries}) == 3
        assert entries[2].after_id == ids[3] and entries[2].rows_deleted == 1
        assert job.rows_deleted == 1  # the replayed batches deleted nothing again
        assert remaining_ids(prop, "lease") == set()


@pytest.mark.django_db(transaction=True)
class TestConcurrency:
    @pytest.fixture
    def job(self):
        manager = make_user("m", "property_manager")
        reviewer = make_user("r", "compliance_reviewer")
        portfolio = Portfolio.objects.create(name="P", slug="p")
        prop = Property.objects.create(portfolio=portfolio, name="B")
        from retention.services import retention_policy_get_or_create

        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="r for the tests")
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
        make_records(prop, "lease", 40, ended=OLD)
        return admit(), prop, reviewer

    def test_two_workers_racing_for_one_job_get_one_lease(self, job):
        job, _, _ = job
        barrier = threading.Barrier(8)
        leases: list = []

        def claim() -> None:
            try:
                barrier.wait()
                leases.append(job_lease(job_id=job.pk, owner=threading.current_thread().name))
            finally:
                connections.close_all()

        threads = [threading.Thread(target=claim) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(1 for lease in leases if lease is not None) == 1
        assert CleanupJob.objects.get(pk=job.pk).leases == 1

    def test_parallel_slices_of_one_job_never_delete_twice(self, job):
        job, prop, _ = job
        results: list = []

        def work() -> None:
            deadline = time.monotonic() + 20
            try:
                while time.monotonic() < deadline:
                    results.append(job_run_slice(job_id=job.pk, batch_size=3, max_batches=1))
                    if CleanupJob.objects.filter(pk=job.pk, state=JobState.DONE).exists():
                        break
            finally:
                connections.close_all()

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        entries = list(LedgerEntry.objects.all())
        assert sum(1 for r in results if r.leased) >= 14  # the slices really were spread over workers
        assert len({r.job_id for r in results}) == 1
        assert sum(e.rows_deleted for e in entries) == 40 == sum(r.rows_deleted for r in results)
        assert len({e.operation_id for e in entries}) == len(entries)
        assert remaining_ids(prop, "lease") == set()

    @pytest.mark.parametrize("scope", ["portfolio", "property", "record"])
    def test_a_hold_placed_while_a_batch_runs_is_seen_by_it_or_placed_after_it(self, job, scope):
        """The hold's transaction holds its scope's row lock (the portfolio row for a
        portfolio-wide or a record hold without a property, the property row
        otherwise); the batch queues behind it and then sees the hold.

        Deterministic: the hold's connection keeps its transaction open on an
        explicit event, and the test reads the batch's lock wait from
        pg_stat_activity/pg_locks instead of timing it.
        """
        job, prop, reviewer = job
        first_candidate = min(remaining_ids(prop, "lease"))
        hold_scope = {
            "portfolio": {},
            "property": {"property": prop},
            "record": {"record_kind": "lease", "record_id": first_candidate},
        }[scope]
        hold_open, commit_hold, batch_started = threading.Event(), threading.Event(), threading.Event()
        pids: dict[str, int] = {}
        results: list[int] = []
        errors: list = []

        def place_hold_and_wait() -> None:
            try:
                pids["hold"] = backend_pid()
                with transaction.atomic():
                    legal_hold_place(
                        portfolio=prop.portfolio, placed_by=reviewer, reason="urgent for the tests", **hold_scope
                    )
                    hold_open.set()
                    assert commit_hold.wait(20)  # the barrier: commit only once the batch is seen waiting
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        def run_one_batch() -> None:
            try:
                loaded = job_load(job.pk)
                lease = job_lease(job_id=job.pk, owner="w")
                pids["batch"] = backend_pid()
                batch_started.set()
                results.append(run_batch(job=loaded, lease=lease, limit=10)[0])
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        holder = threading.Thread(target=place_hold_and_wait)
        holder.start()
        batch = None
        try:
            assert hold_open.wait(10)
            batch = threading.Thread(target=run_one_batch)
            batch.start()
            assert batch_started.wait(10)
            # The batch's scope lock (FOR SHARE) waits for the hold's FOR UPDATE.
            waits = wait_until_blocked(pids["batch"], by=pids["hold"])
            # A row lock wait: the batch waits for the hold's transaction to end.
            assert waits == [("transactionid", "ShareLock")]
            assert not results  # nothing committed while it waits
        finally:
            commit_hold.set()
            holder.join(20)
            if batch is not None:
                batch.join(20)
        assert not errors
        held = set(remaining_ids(prop, "lease"))
        if scope == "record":
            # Of the batch's ten candidates only the held one survives.
            assert results == [9]
            assert first_candidate in held and len(held) == 31
        else:
            assert results == [0]
            assert len(held) == 40
        assert LegalHold.objects.count() == 1
