"""A worker's turn holds as many batches as its slice's seconds allow (issue 40).

Each turn is one broker task, so the turns a backlog takes are its broker
hand-offs; ``CleanupJob.leases`` counts every job lease. A turn works group
after group without a broker round trip between them, each group the slice
of ``CLEANUP_SLICE_BATCHES`` transactions a turn used to be. Counted, not
timed: the slice's seconds are set far beyond what the few batches here take.
"""

from __future__ import annotations

import pytest
from django.db.models import Sum

from cleanup_ops.execution.runner import worker_turn
from cleanup_ops.models import CleanupJob, JobState, LedgerEntry
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property

from .conftest import one_property_portfolios as estate
from .conftest import utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def job_of(prop: Property) -> CleanupJob:
    return CleanupJob.objects.get(property_id=prop.pk, job_kind="delete")


def turns_until_drained(first: CleanupJob, limit: int = 100) -> int:
    """Run broker tasks' turns, each delivered the oldest open job, until none is open."""
    turns, job_id = 0, first.pk
    while CleanupJob.objects.open().exists() and turns < limit:
        worker_turn(job_id=job_id, owner="worker")
        turns += 1
        nxt = CleanupJob.objects.open().order_by("available_at", "id").first()
        job_id = nxt.pk if nxt else job_id
    return turns


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_one_turn_drains_six_partitions_with_one_broker_hand_off_and_no_more_leases_than_before(
    active_policy, settings
):
    settings.CLEANUP_BATCH_SIZE = 5
    settings.CLEANUP_SLICE_BATCHES = 2  # a turn of 2 transactions would need a hand-off every 2 batches
    settings.CLEANUP_SLICE_SECONDS = 60.0  # the seconds never end a turn in this test
    props = estate(active_policy, ["A", "B", "C", "D", "E", "F"], rows=10)  # two full batches each
    sweep_trigger(slot=SLOT, now=NOW)

    turns = turns_until_drained(job_of(props["A"]))

    batches = LedgerEntry.objects.count()
    leases = CleanupJob.objects.aggregate(n=Sum("leases"))["n"]
    assert set(CleanupJob.objects.values_list("state", flat=True)) == {JobState.DONE}
    # One broker hand-off for the whole backlog (the code that ended a turn
    # every 2 transactions took 7).
    assert turns == 1
    # Leases per batch are those of the turns of 2 transactions: each group
    # is such a slice (31 job leases for 12 batches here, as before). A lease
    # kept across the slices leased 1.7 per transaction at 200k rows but made
    # small portfolios finish later: left out (docs/benchmarks.md, "Backlog").
    assert leases <= 31, f"{leases} job leases for {batches} batches"


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_turn_that_keeps_going_leaves_a_job_whose_message_waits_to_that_message(active_policy, settings):
    settings.CLEANUP_BATCH_SIZE = 5
    settings.CLEANUP_LEASE_JOBS = 1  # one partition per group
    settings.CLEANUP_SLICE_SECONDS = 60.0
    props = estate(active_policy, ["A", "B", "C"], rows=10)
    sweep_trigger(slot=SLOT, now=NOW)
    CleanupJob.objects.filter(pk=job_of(props["B"]).pk).update(enqueued_at=NOW)  # its message waits in the broker

    turn = worker_turn(job_id=job_of(props["A"]).pk, owner="worker")

    # A first (the delivered, oldest due job), then C in the same turn; B is
    # left to the worker its message reaches.
    assert (turn.slices, turn.jobs_leased) == (2, 2)
    assert set(LedgerEntry.objects.values_list("property_id", flat=True)) == {props["A"].pk, props["C"].pk}
    b = job_of(props["B"])
    assert (b.state, b.leases, b.enqueued_at) == (JobState.PENDING, 0, NOW)
