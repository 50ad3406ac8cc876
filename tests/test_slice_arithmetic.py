"""The arithmetic of a slice, without a database: whose turn it is among a
group slice's partitions (``runner._Turns``), how long a slice may work and
sleep (``leases.SliceBudget``), how long a worker may sleep for tokens
(``leases.token_wait_bound``, ``token_wait_next_slice``), and how a
transaction counts its partitions' candidates (``candidates.Counting``).

The unit tier: nothing here opens a connection. ``_Turns.release`` hands
its jobs to ``leases.jobs_release`` (an UPDATE); that one call is replaced
by a recorder, the choice of which jobs go back how is what is tested.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleanup_ops.execution import leases, runner
from cleanup_ops.execution.batches import PartitionStep
from cleanup_ops.execution.candidates import (
    PER_PARTITION_COUNTS_UP_TO,
    Counting,
    first_partition_counting,
    kind_counting,
)
from cleanup_ops.execution.runner import MIN_WINDOW

pytestmark = pytest.mark.unit

# Private to the runner (the layout rule forbids importing an underscore name), read as an attribute.
_Turns = runner._Turns


def applied(*job_ids: int, full: tuple[int, ...] = (), finished: tuple[int, ...] = ()) -> dict[int, PartitionStep]:
    """The steps of one transaction that applied a batch for each of ``job_ids``."""
    return {
        job_id: PartitionStep(
            job_id, applied=True, full=job_id in full, outcome="completed" if job_id in finished else ""
        )
        for job_id in job_ids
    }


# --- Whose turn it is: _Turns ---------------------------------------------------


class TestTurns:
    def test_the_first_transaction_covers_every_leased_partition(self):
        turns = _Turns([11, 12, 13], window=3)
        assert turns.next_working() == [11, 12, 13]

    def test_the_window_caps_how_many_partitions_one_transaction_covers(self):
        turns = _Turns([1, 2, 3, 4, 5], window=2)
        assert turns.next_working() == [1, 2]

    def test_partitions_that_were_worked_go_to_the_back_and_the_others_keep_their_place_at_the_front(self):
        turns = _Turns([1, 2, 3, 4], window=2)
        turns.after([1, 2], applied(1, 2), {1, 2})
        assert turns.pending == [3, 4, 1, 2]

    def test_a_partition_that_filled_its_batch_takes_its_next_one_alone(self):
        turns = _Turns([1, 2, 3], window=3)
        turns.after([1, 2, 3], applied(1, 2, 3, full=(1,)), {1, 2, 3})
        assert turns.pending == [1, 2, 3] and turns.large == {1}
        assert turns.next_working() == [1]

    def test_a_large_partition_waiting_behind_small_ones_does_not_join_their_transaction(self):
        turns = _Turns([2, 1, 3], window=3, large={1})
        assert turns.next_working() == [2, 3]

    def test_a_large_partition_whose_batch_was_short_is_small_again(self):
        turns = _Turns([1, 2], window=2, large={1})
        turns.after([1], applied(1), {1})
        assert turns.large == set()

    def test_a_partition_the_transaction_did_not_reach_stays_large(self):
        turns = _Turns([1, 2, 3], window=3, large={3})
        turns.after([1, 2], applied(1, 2), {1, 2})
        assert turns.large == {3}

    def test_finished_partitions_leave_the_turns(self):
        turns = _Turns([1, 2, 3], window=3)
        turns.after([1, 2, 3], applied(1, 2, 3, finished=(2,)), {1, 2, 3})
        assert turns.pending == [1, 3]

    def test_a_partition_whose_lease_was_lost_leaves_the_turns(self):
        turns = _Turns([1, 2], window=2)
        turns.after([1, 2], {1: PartitionStep(1, applied=True), 2: PartitionStep(2, lost=True)}, {1})
        assert turns.pending == [1]

    def test_the_window_doubles_when_every_partition_it_covered_was_applied(self):
        turns = _Turns([1, 2, 3, 4, 5, 6], window=3)
        turns.after([1, 2, 3], applied(1, 2, 3), {1, 2, 3})
        assert turns.window == 6

    def test_the_window_shrinks_to_twice_what_was_applied_but_never_below_its_minimum(self):
        turns = _Turns(list(range(1, 11)), window=10)
        turns.after(list(range(1, 11)), applied(1, 2, 3), {1, 2, 3})
        assert turns.window == 6
        turns.after([4, 5, 6], applied(), set())
        assert turns.window == MIN_WINDOW

    def test_a_transaction_of_one_partition_leaves_the_window_as_it_was(self):
        turns = _Turns([1, 2], window=5)
        turns.after([1], applied(1), {1})
        assert turns.window == 5

    def test_dropped_partitions_leave_the_turns_in_order(self):
        turns = _Turns([4, 1, 3, 2], window=4)
        turns.drop({1, 2})
        assert turns.pending == [4, 3]

    def test_at_the_slice_end_untouched_partitions_keep_their_place_and_worked_ones_go_behind(self, monkeypatch):
        released: list[tuple[list[int], bool]] = []
        monkeypatch.setattr(
            runner, "jobs_release", lambda *, lease, job_ids, keep_place=False: released.append((job_ids, keep_place))
        )
        turns = _Turns([1, 2, 3, 4], window=2)
        turns.after([1, 2], applied(1, 2), {1, 2})
        turns.release(SimpleNamespace(owner="w"))  # type: ignore[arg-type]
        assert released == [([3, 4], True), ([1, 2], False)]

    def test_at_the_slice_end_nothing_is_released_when_nothing_is_pending(self, monkeypatch):
        monkeypatch.setattr(runner, "jobs_release", lambda **kw: pytest.fail("released with nothing pending"))
        _Turns([], window=2).release(SimpleNamespace())  # type: ignore[arg-type]

    def test_at_the_slice_end_a_slice_that_worked_every_partition_releases_them_in_one_call(self, monkeypatch):
        released: list[tuple[list[int], bool]] = []
        monkeypatch.setattr(
            runner, "jobs_release", lambda *, lease, job_ids, keep_place=False: released.append((job_ids, keep_place))
        )
        turns = _Turns([1, 2], window=2)
        turns.after([1, 2], applied(1, 2), {1, 2})
        turns.release(SimpleNamespace())  # type: ignore[arg-type]
        assert released == [([1, 2], False)]

    @given(
        partitions=st.integers(min_value=1, max_value=8),
        fulls=st.lists(st.sets(st.integers(min_value=0, max_value=7)), min_size=1, max_size=30),
    )
    def test_every_partition_gets_a_batch_before_any_gets_a_second(self, partitions, fulls):
        """Whichever partitions fill their batches (``fulls``: which did, per transaction)."""
        turns = _Turns(list(range(partitions)), window=partitions)
        served = dict.fromkeys(range(partitions), 0)
        for full in fulls:
            working = turns.next_working()
            if min(served.values()) == 0:
                assert all(served[job_id] == 0 for job_id in working), (served, working)
            for job_id in working:
                served[job_id] += 1
            turns.after(working, applied(*working, full=tuple(full & set(working))), set(working))
            assert sorted(turns.pending) == list(range(partitions))

    @given(
        partitions=st.integers(min_value=1, max_value=8),
        fulls=st.lists(st.sets(st.integers(min_value=0, max_value=7)), min_size=1, max_size=40),
    )
    def test_no_partition_waits_more_transactions_than_there_are_partitions(self, partitions, fulls):
        """The front of the turns is always worked and worked ones go to the back, so a
        large partition lets small ones pass but never starves, nor do they."""
        turns = _Turns(list(range(partitions)), window=partitions)
        waited = dict.fromkeys(range(partitions), 0)
        for full in fulls:
            front = turns.pending[0]
            working = turns.next_working()
            assert working[0] == front
            for job_id in waited:
                waited[job_id] = 0 if job_id in working else waited[job_id] + 1
            assert max(waited.values()) < partitions, (waited, working)
            turns.after(working, applied(*working, full=tuple(full & set(working))), set(working))

    @given(
        partitions=st.integers(min_value=1, max_value=8),
        window=st.integers(min_value=1, max_value=8),
        transactions=st.integers(min_value=1, max_value=30),
    )
    def test_without_large_partitions_no_partition_is_ever_two_batches_ahead_of_another(
        self, partitions, window, transactions
    ):
        turns = _Turns(list(range(partitions)), window=window)
        served = dict.fromkeys(range(partitions), 0)
        for _ in range(transactions):
            working = turns.next_working()
            for job_id in working:
                served[job_id] += 1
            assert max(served.values()) - min(served.values()) <= 1, (served, working)
            turns.after(working, applied(*working), set(working))


# --- How long a slice works: SliceBudget -----------------------------------------


class FakeClock:
    def __init__(self, at: float) -> None:
        self.at = at

    def monotonic(self) -> float:
        return self.at


@pytest.fixture
def monotonic(monkeypatch):  # type: ignore[no-untyped-def]
    fake = FakeClock(1000.0)
    monkeypatch.setattr(leases, "time", fake)
    return fake


class TestSliceBudget:
    def test_a_budget_of_seconds_may_last_twice_as_long_on_the_wall(self):
        assert leases.SliceBudget.of(5.0).wall == 5.0 * leases.TOKEN_SLEEP_STRETCH == 10.0

    def test_a_budget_given_its_wall_seconds_keeps_them(self):
        budget = leases.SliceBudget.of(2.0, 3.0)
        assert (budget.seconds, budget.wall) == (2.0, 3.0)

    def test_a_budget_starts_when_it_is_made(self, monotonic):
        budget = leases.SliceBudget.of(5.0)
        assert budget.started == 1000.0 and budget.left() == 5.0 and budget.wall_left() == 10.0

    def test_seconds_of_work_count_against_the_budget(self, monotonic):
        budget = leases.SliceBudget.of(5.0)
        monotonic.at += 3.5
        assert budget.left() == 1.5

    def test_seconds_asleep_for_tokens_do_not_count_against_the_work(self, monotonic):
        budget = leases.SliceBudget.of(5.0)
        monotonic.at += 4.0
        budget.slept += 3.0
        assert (budget.left(), budget.wall_left()) == (4.0, 6.0)

    def test_the_wall_bounds_a_slice_that_mostly_sleeps(self, monotonic):
        budget = leases.SliceBudget.of(5.0)
        monotonic.at += 9.0
        budget.slept += 8.5  # half a second of work, 9 s on the wall
        assert budget.left() == 1.0 == budget.wall_left()

    def test_an_overrun_budget_has_negative_seconds_left(self, monotonic):
        budget = leases.SliceBudget.of(1.0)
        monotonic.at += 1.25
        assert budget.left() == -0.25


# --- How long a worker sleeps for tokens -------------------------------------------

NOW = datetime(2026, 8, 21, 2, 5, tzinfo=UTC)


@pytest.fixture
def lease_settings(settings):  # type: ignore[no-untyped-def]
    settings.CLEANUP_LEASE_SECONDS = 60
    settings.CLEANUP_TOKEN_WAIT_SECONDS = 30.0
    settings.CLEANUP_SLICE_SECONDS = 5.0
    return settings


class TestTokenWaitBound:
    def test_a_fresh_lease_and_a_long_slice_leave_the_configured_wait(self, lease_settings):
        bound = leases.token_wait_bound(lease_until=NOW + timedelta(seconds=60), slice_left=120.0, now=NOW)
        assert bound == 30.0

    def test_the_rest_of_the_slice_bounds_the_wait(self, lease_settings):
        bound = leases.token_wait_bound(lease_until=NOW + timedelta(seconds=60), slice_left=2.5, now=NOW)
        assert bound == 2.5

    def test_the_wait_ends_a_quarter_lease_before_the_lease_does(self, lease_settings):
        # 20 s of lease left, 15 s of it kept for the batch after the sleep.
        bound = leases.token_wait_bound(lease_until=NOW + timedelta(seconds=20), slice_left=120.0, now=NOW)
        assert bound == 5.0

    def test_a_lease_too_short_for_any_sleep_allows_none(self, lease_settings):
        bound = leases.token_wait_bound(lease_until=NOW + timedelta(seconds=10), slice_left=120.0, now=NOW)
        assert bound == 0.0

    def test_a_slice_already_over_allows_no_sleep(self, lease_settings):
        bound = leases.token_wait_bound(lease_until=NOW + timedelta(seconds=60), slice_left=-1.0, now=NOW)
        assert bound == 0.0

    def test_the_next_slice_would_sleep_through_a_wait_within_a_whole_slice(self, lease_settings):
        assert leases.token_wait_next_slice(5.0)
        assert not leases.token_wait_next_slice(5.01)

    def test_the_next_slice_is_bounded_by_three_quarters_of_a_lease_when_that_is_shorter(self, lease_settings):
        lease_settings.CLEANUP_SLICE_SECONDS = 120.0
        lease_settings.CLEANUP_TOKEN_WAIT_SECONDS = 120.0
        assert leases.token_wait_next_slice(45.0)
        assert not leases.token_wait_next_slice(45.5)

    def test_the_next_slice_is_bounded_by_the_configured_wait_when_that_is_shortest(self, lease_settings):
        lease_settings.CLEANUP_TOKEN_WAIT_SECONDS = 1.0
        assert leases.token_wait_next_slice(1.0)
        assert not leases.token_wait_next_slice(1.5)


# --- How a transaction counts candidates: Counting -----------------------------------


class TestCounting:
    @pytest.mark.parametrize("fresh", range(1, PER_PARTITION_COUNTS_UP_TO + 1))
    def test_a_few_fresh_partitions_count_the_first_with_its_delete(self, fresh):
        assert first_partition_counting(fresh) is Counting.WITH_ITS_DELETE

    @pytest.mark.parametrize("fresh", [PER_PARTITION_COUNTS_UP_TO + 1, 50])
    def test_many_fresh_partitions_count_the_first_like_the_others(self, fresh):
        assert first_partition_counting(fresh) is Counting.PER_PARTITION

    @pytest.mark.parametrize("partitions", range(0, PER_PARTITION_COUNTS_UP_TO + 1))
    def test_a_few_partitions_of_a_kind_are_counted_one_statement_each(self, partitions):
        assert kind_counting(partitions) is Counting.PER_PARTITION

    @pytest.mark.parametrize("partitions", [PER_PARTITION_COUNTS_UP_TO + 1, 500])
    def test_many_partitions_of_a_kind_are_counted_in_one_lateral_statement(self, partitions):
        assert kind_counting(partitions) is Counting.LATERAL

    def test_the_switch_from_per_partition_to_lateral_is_at_the_same_count_for_both_choices(self):
        edge = PER_PARTITION_COUNTS_UP_TO
        assert first_partition_counting(edge) is not first_partition_counting(edge + 1)
        assert kind_counting(edge) is not kind_counting(edge + 1)
