"""A large partition never keeps small portfolios waiting for its slice.

Within a group lease every partition gets a batch before any gets a second
(processor sharing); when the slice ends, the partitions it never reached keep
their place in the queue (splitting a portfolio's jobs among its lease slots
is in test_multi_partition.py). The order is read
from the ledger (one row per batch, in commit order), not from timings.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from cleanup_ops.execution.leases import jobs_lease_group
from cleanup_ops.execution.runner import group_run_slice
from cleanup_ops.models import CleanupJob, JobState, LedgerEntry
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property

from .conftest import make_records, utc
from .conftest import one_property_portfolios as estate

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def batch_order() -> list[int]:
    return list(LedgerEntry.objects.order_by("id").values_list("property_id", flat=True))


def big_and_three_small(active_policy, settings) -> dict[str, Property]:  # type: ignore[no-untyped-def]
    """Batches of 5; Big (30 rows: six batches) first in key order, as in a
    backlog, then S1-S3 (6 rows: two batches each); one lease slot each."""
    settings.CLEANUP_BATCH_SIZE = 5
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
    props = estate(active_policy, ["Big", "S1", "S2", "S3"], rows=6)
    make_records(props["Big"], "lease", 24, ended=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    return props


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_every_leased_partition_gets_a_batch_before_the_large_one_gets_its_third(active_policy, settings):
    props = big_and_three_small(active_policy, settings)
    result = group_run_slice(owner="w", max_batches=100)
    assert result.finished == 4
    order = batch_order()
    big = props["Big"].pk
    third_big = [i for i, p in enumerate(order) if p == big][2]
    for name in ("S1", "S2", "S3"):
        batches = [i for i, p in enumerate(order) if p == props[name].pk]
        # Six rows with a batch of five: two batches, both before the big one's third.
        assert len(batches) == 2 and max(batches) < third_big, (name, order)
    assert order.count(big) == 6


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_partitions_a_slice_never_reached_keep_their_place_and_worked_ones_go_behind(active_policy, settings, clock):
    settings.CLEANUP_BATCH_SIZE = 5
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
    props = estate(active_policy, ["A", "B", "C"], rows=20)  # four batches each
    sweep_trigger(slot=SLOT, now=NOW)
    before = dict(CleanupJob.objects.values_list("property_id", "available_at"))
    clock.move_to(NOW + timedelta(minutes=1), tick=False)
    group_run_slice(owner="w", max_batches=2)
    after = {job.property_id: job for job in CleanupJob.objects.all()}
    worked = {p for p in batch_order()}
    assert len(worked) == 2
    untouched = set(after) - worked
    assert all(after[p].state == JobState.PENDING for p in after)
    # Not reached: the same available_at, so the next pick takes it first;
    # worked ones are due again now, behind it.
    assert all(after[p].available_at == before[p] for p in untouched)
    assert all(after[p].available_at == NOW + timedelta(minutes=1) for p in worked)
    nxt = jobs_lease_group(owner="w2", limit=1)
    assert nxt is not None
    assert CleanupJob.objects.get(pk=nxt.job_ids[0]).property_id in untouched
    assert {props[n].pk for n in "ABC"} == set(after)


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_the_drains_slice_ends_once_most_of_its_partitions_are_done(active_policy, settings):
    props = big_and_three_small(active_policy, settings)
    # The drain's default budget: a slice's batches per partition leased. Once
    # the three small ones are done, the big one alone is not kept: it goes
    # back (cursor kept) so the next lease also takes whatever else waits.
    result = group_run_slice(owner="drain")
    assert result.finished == 3
    big = CleanupJob.objects.get(property_id=props["Big"].pk)
    assert big.state == JobState.PENDING and 0 < big.rows_deleted < 30
