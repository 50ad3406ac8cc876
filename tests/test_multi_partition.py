"""Many small partitions leased together and worked in shared transactions.

Each partition of a group must behave exactly as it would alone — a hold, a
withdrawn policy, a lost lease, a replay or a paused portfolio affects only its
own partition — while the others complete. Concurrency here is real: other
PostgreSQL connections, and the batch's lock wait is observed in
``pg_stat_activity``, not inferred from elapsed time.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from cleanup_ops.clock import offset as clock_offset
from cleanup_ops.execution.batches import jobs_load, operation_id, run_group_batch
from cleanup_ops.execution.leases import jobs_lease_group, jobs_release
from cleanup_ops.execution.runner import cleanup_drain, group_run_slice
from cleanup_ops.models import CleanupJob, JobState, LedgerEntry
from cleanup_ops.ratelimit import runtime_limits
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, Property
from retention.services import legal_hold_place, policy_version_approve, policy_version_submit

from .conftest import make_records, make_user, remaining_ids, utc
from .conftest import one_property_portfolios as estate

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "operator decision for the test"


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(NOW, tick=False)
    return time_machine


def job_of(prop: Property) -> CleanupJob:
    return CleanupJob.objects.get(property_id=prop.pk, job_kind="delete")


def in_other_connection(fn) -> None:  # type: ignore[no-untyped-def]
    """Run ``fn`` committed on a connection of its own (a second worker, a reviewer)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with transaction.atomic():
                fn()
        except BaseException as exc:  # pragma: no cover - re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if errors:
        raise errors[0]


def backend_waits_on_lock(pid: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cur.fetchone()
    return bool(row) and row[0] == "Lock"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clock")
def test_each_partition_of_a_shared_batch_behaves_as_alone_under_concurrent_changes(active_policy):
    props = estate(active_policy, ["Held", "Plain", "Withdrawn", "Lost", "Replayed", "Paused"])
    manager, reviewer = make_user("m2", "property_manager"), make_user("r2", "compliance_reviewer")
    sweep_trigger(slot=SLOT, now=NOW)
    pipeline_pause(actor=None, reason=REASON, portfolio_id=props["Paused"].portfolio_id)

    group = jobs_lease_group(owner="worker-a", limit=10)
    assert group is not None
    leased = set(group.job_ids)
    assert job_of(props["Paused"]).pk not in leased  # a paused portfolio is not leased
    assert {job_of(props[n]).pk for n in ["Held", "Plain", "Withdrawn", "Lost", "Replayed"]} == leased

    # Replay: an earlier delivery applied the first batch of "Replayed" (its
    # rows are gone and its ledger row exists) but its acknowledgement was lost.
    replayed_job = job_of(props["Replayed"])
    first_two = sorted(remaining_ids(props["Replayed"], "lease"))[:2]
    Lease.objects.filter(pk__in=first_two).delete()
    op = operation_id(
        record_kind="lease",
        property_id=props["Replayed"].pk,
        slot=SLOT,
        cutoff=replayed_job.cutoff,
        after_id=0,
        limit=1000,
    )
    LedgerEntry.objects.create(
        operation_id=op,
        job=replayed_job,
        portfolio_id=replayed_job.portfolio_id,
        property_id=replayed_job.property_id,
        record_kind="lease",
        policy_version_id=replayed_job.policy_version_id,
        cutoff=replayed_job.cutoff,
        after_id=0,
        last_id=first_two[-1],
        batch_limit=1000,
        candidates=2,
        rows_deleted=2,
        applied_at=NOW,
    )
    # Lost lease: another worker took "Lost" over (its lease had expired).
    lost_job = job_of(props["Lost"])
    in_other_connection(lambda: CleanupJob.objects.filter(pk=lost_job.pk).update(lease_token=uuid.uuid4()))
    # Withdrawn policy: a reviewer approves a disabled version.
    withdrawn = props["Withdrawn"].portfolio

    def withdraw() -> None:
        from retention.models import RetentionPolicy

        policy = RetentionPolicy.objects.get(portfolio=withdrawn, record_kind="lease")
        version = policy_version_submit(
            policy=policy, retention_days=365, enabled=False, author=manager, reason="w for the tests"
        )
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")

    in_other_connection(withdraw)

    # Hold race: a hold on "Held" is placed by another connection whose
    # transaction holds the property lock while the shared batch starts.
    hold_locked, release_hold = threading.Event(), threading.Event()
    batch_pid: list[int] = []
    steps: dict = {}

    def place_hold() -> None:
        try:
            with transaction.atomic():
                legal_hold_place(
                    portfolio=props["Held"].portfolio,
                    property=props["Held"],
                    placed_by=reviewer,
                    reason="urgent for the tests",
                )
                hold_locked.set()
                assert release_hold.wait(30)
        finally:
            connections.close_all()

    def run_batch_in_worker() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                batch_pid.append(cur.fetchone()[0])
            jobs = jobs_load(group.job_ids)
            steps.update(run_group_batch(jobs=[jobs[i] for i in group.job_ids], lease=group.lease, limit=1000))
        finally:
            connections.close_all()

    holder = threading.Thread(target=place_hold)
    holder.start()
    assert hold_locked.wait(30)
    worker = threading.Thread(target=run_batch_in_worker)
    worker.start()
    deadline = time.monotonic() + 30
    while not (batch_pid and backend_waits_on_lock(batch_pid[0])):
        assert time.monotonic() < deadline, "the batch never queued behind the hold's lock"
        time.sleep(0.02)
    release_hold.set()
    holder.join(30)
    worker.join(30)

    by_name = {name: job_of(prop) for name, prop in props.items()}
    # The hold committed first: the batch saw it and deleted none of those rows.
    assert (by_name["Held"].state, by_name["Held"].outcome) == (JobState.DONE, "held")
    assert len(remaining_ids(props["Held"], "lease")) == 3
    # The others went on as if alone.
    assert (by_name["Plain"].state, by_name["Plain"].outcome, by_name["Plain"].rows_deleted) == ("done", "deleted", 3)
    assert remaining_ids(props["Plain"], "lease") == set()
    assert (by_name["Withdrawn"].outcome, len(remaining_ids(props["Withdrawn"], "lease"))) == ("policy_withdrawn", 3)
    assert steps[lost_job.pk].lost and not steps[lost_job.pk].applied
    assert (by_name["Lost"].cursor, by_name["Lost"].batches, len(remaining_ids(props["Lost"], "lease"))) == (0, 0, 3)
    assert by_name["Replayed"].cursor == first_two[-1] and by_name["Replayed"].state == JobState.LEASED
    assert steps[replayed_job.pk].deleted == 0
    assert (by_name["Paused"].state, by_name["Paused"].leases) == (JobState.PENDING, 0)

    # The replayed partition finishes from its ledger cursor, never applying the batch twice.
    jobs = jobs_load([replayed_job.pk])
    run_group_batch(jobs=list(jobs.values()), lease=group.lease, limit=1000)
    replayed_job.refresh_from_db()
    assert (replayed_job.state, replayed_job.outcome, replayed_job.rows_deleted) == ("done", "deleted", 1)
    assert remaining_ids(props["Replayed"], "lease") == set()
    assert LedgerEntry.objects.filter(job=replayed_job).count() == 2
    assert LedgerEntry.objects.filter(operation_id=op).count() == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
class TestGroupSlices:
    def test_small_partitions_share_one_transaction_and_a_large_one_runs_alone(self, active_policy, settings):
        settings.CLEANUP_BATCH_SIZE = 10
        props = estate(active_policy, ["A", "B", "C"], rows=2)
        big = Property.objects.create(portfolio=props["A"].portfolio, name="Tower")
        make_records(big, "lease", 25, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        result = group_run_slice(owner="w", max_batches=1)
        # One transaction: round-robin puts one job of each portfolio first
        # (A's small one, B, C: 6 candidates); the big one would overflow
        # the batch, so it waits for a transaction of its own.
        assert (result.leased, result.transactions) == (4, 1)
        ledger = [(e.property_id, e.rows_deleted) for e in LedgerEntry.objects.order_by("id")]
        assert sorted(ledger) == sorted([(props["A"].pk, 2), (props["B"].pk, 2), (props["C"].pk, 2)])
        # Everything still leased by the slice went back to pending, cursors kept.
        assert CleanupJob.objects.filter(state=JobState.LEASED).count() == 0
        cleanup_drain()
        assert {j.outcome for j in CleanupJob.objects.all()} == {"deleted"}
        assert Lease.objects.count() == 0
        # Each partition has its own ledger rows; the big one took three batches.
        assert LedgerEntry.objects.filter(property_id=big.pk).count() == 3
        assert LedgerEntry.objects.values("operation_id").distinct().count() == LedgerEntry.objects.count()

    def test_a_portfolios_jobs_are_split_over_its_lease_slots_so_a_second_worker_finds_work(
        self, active_policy, settings
    ):
        settings.CLEANUP_PORTFOLIO_MAX_LEASES = 2
        props = estate(active_policy, ["A"], rows=1)
        for n in range(10):
            make_records(Property.objects.create(portfolio=props["A"].portfolio, name=f"H{n}"), "lease", 1, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        first = jobs_lease_group(owner="w1", limit=100)
        # Eleven due jobs, two slots: the first group takes six, the second the other five.
        assert first is not None and len(first.job_ids) == 6
        second = jobs_lease_group(owner="w2", limit=100)
        assert second is not None and len(second.job_ids) == 5
        assert not set(first.job_ids) & set(second.job_ids)
        # Both slots are taken now: a third worker gets nothing in the portfolio.
        assert jobs_lease_group(owner="w3", limit=100) is None

    def test_the_portfolio_cap_counts_lease_holders_not_jobs(self, active_policy, settings):
        settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
        props = estate(active_policy, ["A"], rows=1)
        for n in range(3):
            make_records(Property.objects.create(portfolio=props["A"].portfolio, name=f"H{n}"), "lease", 1, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        first = jobs_lease_group(owner="w1", limit=2)
        assert first is not None and len(first.job_ids) == 2
        # One holder already works in the portfolio: a second worker gets nothing there.
        assert jobs_lease_group(owner="w2", limit=10) is None
        jobs_release(lease=first.lease, job_ids=first.job_ids)
        second = jobs_lease_group(owner="w2", limit=10)
        assert second is not None and len(second.job_ids) == 4

    def test_a_group_lease_reads_what_its_slice_needs_in_a_fixed_number_of_statements(self, active_policy):
        props = estate(active_policy, ["A", "B"], rows=1)
        for n in range(10):
            make_records(Property.objects.create(portfolio=props["A"].portfolio, name=f"H{n}"), "lease", 1, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        # The operators' run-time limits (the lease cap) and the database's
        # clock: reads a process makes at most every RUNTIME_LIMITS_CACHE_SECONDS
        # and CLEANUP_CLOCK_SYNC_SECONDS, not per lease (on a loaded machine the
        # clock's 30 s could otherwise run out between the two leases).
        runtime_limits()
        clock_offset()
        with CaptureQueriesContext(connection) as two:
            small = jobs_lease_group(owner="w1", limit=2)
        assert small is not None and len(small.jobs) == 2
        # What the slice needs of each job comes with the lease: what a load reads after it.
        assert small.jobs == jobs_load(small.job_ids)
        jobs_release(lease=small.lease, job_ids=small.job_ids, keep_place=True)
        with CaptureQueriesContext(connection) as many:
            large = jobs_lease_group(owner="w2", limit=100)
        assert large is not None and len(large.jobs) > 2 * len(small.jobs)
        assert large.jobs == jobs_load(large.job_ids)
        # The pauses and the holders are one read before the pick (and one more
        # under the stripe locks on PostgreSQL), however many jobs a group takes.
        assert len(many.captured_queries) == len(two.captured_queries)
        assert len(two.captured_queries) <= 5 + 2  # reads, pick, stripe locks, re-read, UPDATE (+ savepoints)

    def test_the_lease_slots_are_the_active_pauses_and_the_holders_per_portfolio(self, active_policy, settings):
        settings.CLEANUP_PORTFOLIO_MAX_LEASES = 5
        props = estate(active_policy, ["A", "B"], rows=1)
        for n in range(3):
            make_records(Property.objects.create(portfolio=props["A"].portfolio, name=f"H{n}"), "lease", 1, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        a, b = props["A"].portfolio_id, props["B"].portfolio_id
        assert CleanupJob.objects.lease_slots(now=NOW) == (set(), {})
        first = jobs_lease_group(owner="w1", limit=2)
        second = jobs_lease_group(owner="w2", limit=2)
        assert first is not None and second is not None
        # A leased row without a token counts as a holder of its own.
        CleanupJob.objects.filter(portfolio_id=a, state=JobState.PENDING).update(
            state=JobState.LEASED, lease_expires_at=NOW + timedelta(minutes=5)
        )
        pipeline_pause(actor=None, reason=REASON, portfolio_id=b)
        paused, holders = CleanupJob.objects.lease_slots(now=NOW)
        assert paused == {b}
        assert holders == CleanupJob.objects.lease_holders_by_portfolio(now=NOW)
        assert holders[a] >= 2
        pipeline_pause(actor=None, reason=REASON, portfolio_id=None)
        assert None in CleanupJob.objects.lease_slots(now=NOW)[0]
        # An expired lease holds nothing.
        assert CleanupJob.objects.lease_slots(now=NOW + timedelta(days=1))[1] == {}

    def test_a_group_pick_takes_portfolios_round_robin(self, active_policy):
        props = estate(active_policy, ["A", "B"], rows=1)
        for n in range(4):
            make_records(Property.objects.create(portfolio=props["A"].portfolio, name=f"A{n}"), "lease", 1, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        group = jobs_lease_group(owner="w", limit=2)
        assert group is not None
        portfolios = set(CleanupJob.objects.filter(pk__in=group.job_ids).values_list("portfolio_id", flat=True))
        assert portfolios == {props["A"].portfolio_id, props["B"].portfolio_id}

    def test_a_failing_shared_transaction_runs_each_job_alone_and_blames_only_the_culprit(
        self, active_policy, monkeypatch
    ):
        props = estate(active_policy, ["A", "B"], rows=2)
        sweep_trigger(slot=SLOT, now=NOW)
        culprit = job_of(props["B"])
        from cleanup_ops.execution import runner
        from cleanup_ops.recovery.classification import InvalidInput

        real = runner.run_group_batch

        def failing(*, jobs, **kwargs):  # type: ignore[no-untyped-def]
            if any(job.id == culprit.pk for job in jobs):
                raise InvalidInput("bad partition")
            return real(jobs=jobs, **kwargs)

        # One patch covers both: a job alone is a group of one (the same batch transaction).
        monkeypatch.setattr(runner, "run_group_batch", failing)
        result = group_run_slice(owner="w")
        assert result.fell_back
        good, bad = job_of(props["A"]), job_of(props["B"])
        assert (good.state, good.outcome) == ("done", "deleted")
        assert bad.state == JobState.DEAD and bad.dead_letter.category == "policy_or_input"

    def test_a_portfolio_without_a_rate_token_is_left_out_not_waited_for(self, active_policy, settings):
        settings.CLEANUP_RATE_PORTFOLIO = 0.001
        settings.CLEANUP_BURST_PORTFOLIO = 1.0
        props = estate(active_policy, ["A", "B"], rows=1)
        make_records(Property.objects.create(portfolio=props["A"].portfolio, name="A2"), "lease", 1, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        from cleanup_ops.ratelimit import tokens_acquire

        # A's bucket is empty; B's is full.
        assert tokens_acquire(portfolio_id=props["A"].portfolio_id, now=NOW.timestamp()) == 0.0
        started = time.monotonic()
        result = group_run_slice(owner="w")
        assert time.monotonic() - started < 5  # deferred, not waited for
        assert result.deferred_seconds > 0
        b = job_of(props["B"])
        assert (b.state, b.outcome) == ("done", "deleted")
        a_jobs = CleanupJob.objects.filter(portfolio_id=props["A"].portfolio_id)
        assert all(j.state == JobState.PENDING and j.available_at > NOW + timedelta(seconds=1) for j in a_jobs)
        assert all(j.attempt == 0 for j in a_jobs)


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_after_sigterm_a_worker_finishes_the_batch_in_flight_and_takes_no_new_lease(
    active_policy, monkeypatch, settings
):
    import os
    import signal

    from cleanup_ops.execution import runner

    settings.CLEANUP_BATCH_SIZE = 2  # one batch cannot finish either partition
    props = estate(active_policy, ["A", "B"], rows=3)
    sweep_trigger(slot=SLOT, now=NOW)
    previous = signal.getsignal(signal.SIGTERM)
    real = runner.run_group_batch

    def batch_then_sigterm(**kwargs):  # type: ignore[no-untyped-def]
        steps = real(**kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while this turn is working
        return steps

    monkeypatch.setattr(runner, "run_group_batch", batch_then_sigterm)
    try:
        runner.stop_on_sigterm()
        turn = runner.worker_turn(job_id=job_of(props["A"]).pk)
        assert runner.stop_requested()
        # The batch in flight committed whole; the rest went back, nothing is left leased.
        assert turn.slices == 1
        assert [(e.property_id, e.rows_deleted) for e in LedgerEntry.objects.all()] == [(props["A"].pk, 2)]
        assert CleanupJob.objects.filter(state=JobState.LEASED).count() == 0
        assert CleanupJob.objects.filter(state=JobState.PENDING).count() == 2
        # Due work remains, but a stopping worker takes no new lease.
        assert runner.group_run_slice(owner="w").leased == 0
        assert runner.job_run_slice(job_id=job_of(props["B"]).pk).leased is False
    finally:
        runner._stopping.clear()
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_delivered_job_the_turn_could_not_lease_can_be_sent_again_at_once(active_policy, settings):
    from cleanup_ops.execution.runner import worker_turn

    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
    props = estate(active_policy, ["A"], rows=1)
    make_records(Property.objects.create(portfolio=props["A"].portfolio, name="A2"), "lease", 1, ended=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    other = jobs_lease_group(owner="another-worker", limit=1)  # the portfolio's one slot is taken
    assert other is not None
    delivered = CleanupJob.objects.exclude(pk__in=other.job_ids).get()
    CleanupJob.objects.filter(pk=delivered.pk).update(enqueued_at=NOW)  # its message was sent and fetched
    turn = worker_turn(job_id=delivered.pk)
    assert turn.jobs_leased == 0
    delivered.refresh_from_db()
    assert (delivered.state, delivered.enqueued_at) == (JobState.PENDING, None)  # sendable again at once


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_deferral_hints_only_the_jobs_the_lease_still_holds(active_policy):
    props = estate(active_policy, ["A", "B"], rows=1)
    sweep_trigger(slot=SLOT, now=NOW)
    group = jobs_lease_group(owner="w", limit=10)
    assert group is not None
    taken = job_of(props["B"])
    CleanupJob.objects.filter(pk=taken.pk).update(lease_token=uuid.uuid4(), enqueued_at=None)  # another worker's now
    later = NOW + timedelta(seconds=30)
    assert jobs_release(lease=group.lease, job_ids=group.job_ids, available_at=later) == 1
    mine, theirs = job_of(props["A"]), job_of(props["B"])
    assert (mine.state, mine.available_at, mine.enqueued_at) == (JobState.PENDING, later, later)
    assert (theirs.state, theirs.enqueued_at) == (JobState.LEASED, None)
