"""The rate limiter: buckets that say when a token will be there, reservations
slept for, and what a worker does when it cannot wait (see ``cleanup_ops.ratelimit``)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cleanup_ops import clock
from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.execution import runner
from cleanup_ops.execution.leases import group_tokens, job_lease, token_sleep
from cleanup_ops.models import CleanupJob, JobState, LedgerEntry, RateBucket, Sweep
from cleanup_ops.ratelimit import BucketConfig, tokens_acquire, tokens_give_back, tokens_reserve
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

from .conftest import WALL_CLOCK, make_records, make_user, utc
from .conftest import one_property_portfolios as estate

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def frozen(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def job_of(prop: Property) -> CleanupJob:
    return CleanupJob.objects.get(property_id=prop.pk, job_kind="delete")


@pytest.mark.django_db
def test_a_bucket_grants_its_rate_plus_its_burst_under_a_controlled_clock():
    buckets = [BucketConfig("global", rate=10, burst=5)]
    granted, start = 0, 1_000_000.0
    # Asked every 25 ms for 10 s, four times the rate: each token waits for an ask
    # at most 25 ms, and every refused ask must leave the partial token it found.
    for step in range(401):
        if tokens_acquire(portfolio_id=1, now=start + step * 0.025, buckets=buckets) == 0:
            granted += 1
    assert granted == 5 + 100  # the burst, then 10 tokens/s for 10 s


@pytest.mark.django_db
def test_a_refused_portfolio_token_takes_nothing_from_the_global_bucket():
    portfolio = BucketConfig("portfolio:1", rate=1, burst=1)
    glob = BucketConfig("global", rate=1, burst=3)
    assert tokens_acquire(portfolio_id=1, now=100.0, buckets=[portfolio, glob]) == 0
    wait = tokens_acquire(portfolio_id=1, now=100.1, buckets=[portfolio, glob])
    assert wait == pytest.approx(0.9)
    # The global bucket still has 2 tokens: the refused attempt rolled back.
    assert tokens_acquire(portfolio_id=2, now=100.1, buckets=[glob]) == 0
    assert tokens_acquire(portfolio_id=2, now=100.1, buckets=[glob]) == 0
    assert tokens_acquire(portfolio_id=2, now=100.1, buckets=[glob]) > 0


@WALL_CLOCK
@pytest.mark.django_db(transaction=True)
def test_four_competing_workers_get_the_configured_rate_within_five_percent():
    rate, burst, seconds = 50.0, 5.0, 3.0
    bucket = [BucketConfig("global", rate=rate, burst=burst)]
    grants: list[float] = []
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    def worker() -> None:
        try:
            barrier.wait()
            end = time.time() + seconds
            while (now := time.time()) < end:
                wait = tokens_acquire(portfolio_id=1, now=now, buckets=bucket)
                if wait == 0:
                    with lock:
                        grants.append(now)
                else:
                    time.sleep(min(wait, 0.005))
        finally:
            connections.close_all()

    start = time.time()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = max(grants) - start
    expected = rate * elapsed + burst
    assert abs(len(grants) - expected) <= 0.05 * rate * elapsed, (len(grants), expected)


@pytest.mark.django_db(transaction=True)
def test_a_portfolio_with_most_jobs_never_holds_more_leases_than_its_cap_while_others_wait(settings):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 2
    manager, reviewer = make_user("m", "property_manager"), make_user("r", "compliance_reviewer")
    sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=utc("2026-08-21T02:00:00Z"))
    jobs_of: dict[int, list[int]] = {}
    for name, count in (("big", 12), ("small", 3)):
        portfolio = Portfolio.objects.create(name=name, slug=name)
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        version = policy_version_submit(policy=policy, retention_days=30, author=manager, reason="r for the tests")
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
        # One property per job: a partition has at most one open job.
        props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(count)]
        jobs_of[portfolio.pk] = [
            CleanupJob.objects.create(
                sweep=sweep,
                key=f"{name}-{i}",
                portfolio_id=portfolio.pk,
                property_id=props[i].pk,
                record_kind="lease",
                policy_version=version,
                cutoff=timezone.now() - timedelta(days=30),
                available_at=timezone.now() - timedelta(seconds=100 - i),
            ).pk
            for i in range(count)
        ]
    big, small = list(jobs_of)
    peak = {big: 0, small: 0}
    leased_at: dict[int, float] = {}
    lock = threading.Lock()

    def worker() -> None:
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                ids = fair_due_job_ids(now=timezone.now(), limit=4, exclude_enqueued=False)
                if not ids and not CleanupJob.objects.exclude(state=JobState.DONE).exists():
                    return
                for job_id in ids:
                    lease = job_lease(job_id=job_id, owner=threading.current_thread().name)
                    if lease is None:
                        continue
                    portfolio_id = CleanupJob.objects.values_list("portfolio_id", flat=True).get(pk=job_id)
                    live = CleanupJob.objects.filter(
                        portfolio_id=portfolio_id, state=JobState.LEASED, lease_expires_at__gt=timezone.now()
                    ).count()
                    with lock:
                        peak[portfolio_id] = max(peak[portfolio_id], live)
                        leased_at[job_id] = time.monotonic()
                    time.sleep(0.05)  # the slice's work
                    CleanupJob.objects.filter(pk=job_id, lease_token=lease.token).update(
                        state=JobState.DONE, lease_token=None, lease_expires_at=None
                    )
                    break
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert CleanupJob.objects.filter(state=JobState.DONE).count() == 15
    assert peak[big] == 2  # reached the cap, never above it, although 4 workers were free
    assert max(leased_at[j] for j in jobs_of[small]) < max(leased_at[j] for j in jobs_of[big])


# --- Reservations: one statement says when, and takes for then --------------------


@pytest.mark.django_db
def test_a_reservation_says_exactly_when_the_token_will_be_there_and_takes_it_for_then():
    bucket = [(None, BucketConfig("global", rate=2, burst=1))]
    first = tokens_reserve(members=bucket, now=100.0, max_wait=10)
    second = tokens_reserve(members=bucket, now=100.1, max_wait=10)
    third = tokens_reserve(members=bucket, now=100.2, max_wait=10)
    assert first.reserved and first.wait == 0.0
    # Each request is given the next free instant, in the order asked: 0.5 s apart at 2/s.
    assert second.reserved and second.at == pytest.approx(100.5) and second.wait == pytest.approx(0.4)
    assert third.reserved and third.at == pytest.approx(101.0) and third.wait == pytest.approx(0.8)
    # A worker that cannot wait that long takes nothing and is told exactly when.
    refused = tokens_reserve(members=bucket, now=100.3, max_wait=0.5)
    assert not refused.reserved and refused.at == pytest.approx(101.5)
    assert tokens_reserve(members=bucket, now=100.3, max_wait=5).at == pytest.approx(101.5)  # the refusal took nothing
    state = RateBucket.objects.get(name="global")
    assert (state.tokens, state.updated_at) == (pytest.approx(0.0, abs=1e-6), pytest.approx(101.5))


@pytest.mark.django_db
def test_a_group_is_told_when_on_the_database_clock_and_a_portfolio_without_a_token_is_left_out(settings, frozen):
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 4.0, 1.0
    settings.CLEANUP_RATE_PORTFOLIO, settings.CLEANUP_BURST_PORTFOLIO = 1.0, 1.0
    start = clock.now_ts()
    first = group_tokens({7}, max_wait=5.0)
    assert first.reserved and first.wait == 0.0 and first.allowed == {7}
    second = group_tokens({7, 8}, max_wait=5.0)
    # The global token is there in 0.25 s, portfolio 8's now, 7's in 1 s: the
    # transaction goes in 0.25 s with 8 alone; 7 is told its own instant.
    assert second.reserved and second.at == pytest.approx(start + 0.25) and second.allowed == {8}
    assert second.wait_of(7) == pytest.approx(1.0)
    assert dict(RateBucket.objects.values_list("name", "updated_at")) == {
        "global": pytest.approx(start + 0.25),
        "portfolio:7": pytest.approx(start),  # untouched by the second request
        "portfolio:8": pytest.approx(start + 0.25),
    }
    frozen.shift(1.0)
    third = group_tokens({7}, max_wait=0.0)
    assert third.reserved and third.wait == 0.0 and third.allowed == {7}


@WALL_CLOCK
@pytest.mark.django_db(transaction=True)
def test_two_workers_asleep_on_their_reservations_never_exceed_the_global_or_a_portfolio_rate():
    glob = BucketConfig("global", rate=15.0, burst=2.0)
    own = {p: BucketConfig(f"portfolio:{p}", rate=10.0, burst=1.0) for p in (1, 2)}
    RateBucket.objects.bulk_create(
        [RateBucket(name=b.name, tokens=b.burst, updated_at=0.0) for b in (glob, *own.values())]
    )
    seconds = 2.5
    granted: list[tuple[int, float, float]] = []  # (portfolio, reserved instant, woke at), database clock
    calls = {1: 0, 2: 0}
    statements = {1: 0, 2: 0}
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def worker(portfolio_id: int) -> None:
        try:
            barrier.wait()
            end = clock.now_ts() + seconds
            while clock.now_ts() < end:
                with CaptureQueriesContext(connection) as queries:
                    grant = tokens_reserve(
                        members=[(portfolio_id, own[portfolio_id]), (None, glob)],
                        now=clock.now_ts(),
                        max_wait=5.0,
                        portfolio_ids=[portfolio_id],
                    )
                calls[portfolio_id] += 1
                statements[portfolio_id] += len(queries.captured_queries)
                assert grant.reserved and grant.allowed == {portfolio_id}
                token_sleep(grant.wait)
                with lock:
                    granted.append((portfolio_id, grant.at, clock.now_ts()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(p,)) for p in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def worst_excess(times: list[float], rate: float, burst: float) -> float:
        times = sorted(times)
        return max(
            (j - i + 1) - (burst + rate * (times[j] - times[i]))
            for i in range(len(times))
            for j in range(i, len(times))
        )

    # The reserved instants keep every bucket's rate exactly; the instants the
    # workers woke at, within one token (a wake-up's few milliseconds).
    assert worst_excess([at for _, at, _ in granted], glob.rate, glob.burst) <= 1e-4
    assert worst_excess([woke for _, _, woke in granted], glob.rate, glob.burst) <= 1.0
    for p, bucket in own.items():
        assert worst_excess([at for q, at, _ in granted if q == p], bucket.rate, bucket.burst) <= 1e-4
    # And the global rate is what they got, not less: two workers share it.
    assert len(granted) >= glob.burst + glob.rate * (seconds - 0.2)
    assert min(calls.values()) > 0.3 * len(granted)  # neither worker starved
    # One statement per token granted: no retry, no read after a miss.
    assert statements == calls


# --- A worker under a limit: it sleeps, stays responsive, and spends only what it uses ------


def _bucket_statements(queries: CaptureQueriesContext) -> list[tuple[str, set[str]]]:
    """(what, the portfolios named) of each statement on the buckets, in order."""
    out = []
    for query in queries.captured_queries:
        text = query["sql"]
        if "cleanup_ops_ratebucket" not in text:
            continue
        what = "create" if text.startswith("INSERT") else "give back" if "tokens + 1" in text else "reserve"
        out.append((what, set(re.findall(r"portfolio:(\d+)", text))))
    return out


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_token_statements_name_only_the_portfolios_each_transaction_works(active_policy, settings):
    settings.CLEANUP_BATCH_SIZE = 10
    settings.CLEANUP_RATE_GLOBAL = settings.CLEANUP_RATE_PORTFOLIO = 1000.0  # present, never binding
    settings.CLEANUP_BURST_GLOBAL = settings.CLEANUP_BURST_PORTFOLIO = 100.0
    props = estate(active_policy, ["A", "B", "C"], rows=1)
    make_records(props["A"], "lease", 25, ended=OLD)  # A needs three batches, alone
    sweep_trigger(slot=SLOT, now=NOW)
    a, b, c = (str(props[name].portfolio_id) for name in "ABC")
    with CaptureQueriesContext(connection) as queries:
        result = runner.group_run_slice(owner="w", max_batches=20)
    assert result.transactions == 4 and result.finished == 3
    # One reservation per transaction, for the portfolios of the partitions it
    # works and nobody else's: after the first, A works alone and B and C
    # together. The first could not know A fills a batch alone (only its
    # count inside the transaction says so): B's and C's tokens go back, once.
    assert _bucket_statements(queries) == [
        *[("reserve", {a, b, c}), ("create", {a, b, c})],  # the buckets' first use: created full
        ("reserve", {a, b, c}),
        ("give back", {b, c}),
        ("reserve", {b, c}),
        ("reserve", {a}),
        ("reserve", {a}),
    ]


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_with_only_a_global_limit_no_token_statement_names_a_portfolio(active_policy, settings):
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 1000.0, 100.0
    estate(active_policy, ["A", "B", "C"], rows=3)
    sweep_trigger(slot=SLOT, now=NOW)
    with CaptureQueriesContext(connection) as queries:
        result = runner.group_run_slice(owner="w", max_batches=20)
    assert result.finished == 3
    first_use = [("reserve", set()), ("create", set())]
    assert _bucket_statements(queries) == first_use + [("reserve", set())] * result.transactions


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_a_worker_sleeps_until_its_reserved_instant_with_the_lease_kept_and_finishes_in_one_slice(
    active_policy, settings
):
    settings.CLEANUP_BATCH_SIZE = 2
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 8.0, 1.0  # a batch every 0.125 s
    props = estate(active_policy, ["A"], rows=5)
    sweep_trigger(slot=SLOT, now=NOW)
    with CaptureQueriesContext(connection) as queries:
        result = runner.group_run_slice(owner="w", max_batches=20)
    job = job_of(props["A"])
    # Three batches in one lease, each after a sleep, none deferred.
    assert (result.transactions, result.deferred_seconds, job.state, job.rows_deleted) == (3, 0.0, "done", 5)
    assert _bucket_statements(queries) == [("reserve", set()), ("create", set())] + [("reserve", set())] * 3
    # The third token was reserved for 0.25 s after the first (the clock is frozen).
    state = RateBucket.objects.get(name="global")
    assert state.updated_at == pytest.approx(NOW.timestamp() + 0.25)


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_a_wait_longer_than_the_lease_can_bear_reserves_nothing_and_defers_the_job_until_then(active_policy, settings):
    settings.CLEANUP_BATCH_SIZE = 2
    settings.CLEANUP_SLICE_SECONDS = 120.0
    settings.CLEANUP_LEASE_SECONDS = 20  # a sleep must end 5 s before the lease would expire
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 1 / 16, 1.0  # the next token in 16 s
    props = estate(active_policy, ["A"], rows=5)
    sweep_trigger(slot=SLOT, now=NOW)
    started = time.monotonic()
    result = runner.group_run_slice(owner="w", max_batches=20)
    assert time.monotonic() - started < 5  # deferred, not slept
    job = job_of(props["A"])
    assert (result.transactions, job.state, job.rows_deleted, job.attempt) == (1, JobState.PENDING, 2, 0)
    assert result.deferred_seconds == pytest.approx(16.0)
    assert job.available_at == NOW + timedelta(seconds=16)
    # Nothing was reserved for the refused wait: the bucket is as the first batch left it.
    assert RateBucket.objects.get(name="global").updated_at == pytest.approx(NOW.timestamp())

    # A 60 s lease can bear a 45 s sleep (the last quarter is kept for the batch).
    settings.CLEANUP_LEASE_SECONDS, settings.CLEANUP_TOKEN_WAIT_SECONDS = 60, 300.0
    bound = runner.token_wait_bound(lease_until=NOW + timedelta(seconds=60), slice_left=120.0)
    assert bound == pytest.approx(45.0)


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_a_worker_asleep_on_its_reservation_wakes_on_sigterm_and_gives_its_token_and_its_job_back(
    active_policy, settings
):
    settings.CLEANUP_BATCH_SIZE = 2
    settings.CLEANUP_SLICE_SECONDS = 60.0
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 0.1, 1.0  # the second batch's token in 10 s
    props = estate(active_policy, ["A"], rows=5)
    sweep_trigger(slot=SLOT, now=NOW)
    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.5, os.kill, [os.getpid(), signal.SIGTERM])
    try:
        runner.stop_on_sigterm()
        timer.start()
        started = time.monotonic()
        result = runner.group_run_slice(owner="w", max_batches=20)
        slept = time.monotonic() - started
        assert runner.stop_requested()
    finally:
        timer.cancel()
        runner._stopping.clear()
        signal.signal(signal.SIGTERM, previous)
    assert slept < 5  # woke on the signal, long before the token's instant
    job = job_of(props["A"])
    assert (result.transactions, job.state, job.rows_deleted, job.attempt) == (1, JobState.PENDING, 2, 0)
    assert LedgerEntry.objects.count() == 1
    # The token reserved for NOW + 10 s went back: the bucket holds it at that instant again.
    state = RateBucket.objects.get(name="global")
    assert (state.tokens, state.updated_at) == (pytest.approx(1.0), pytest.approx(NOW.timestamp() + 10))
    # So the next worker is told the same instant the stopped one was, not a later one.
    assert tokens_reserve(
        members=[(None, BucketConfig("global", 0.1, 1.0))], now=NOW.timestamp(), max_wait=0
    ).at == pytest.approx(NOW.timestamp() + 10)


@pytest.mark.django_db
def test_tokens_a_transaction_did_not_use_go_back_and_the_global_only_when_it_touched_nothing(settings):
    settings.CLEANUP_RATE_GLOBAL = settings.CLEANUP_RATE_PORTFOLIO = 0.001
    settings.CLEANUP_BURST_GLOBAL = settings.CLEANUP_BURST_PORTFOLIO = 2.0
    grant = group_tokens({7, 8}, max_wait=0.0)
    assert grant.reserved and grant.allowed == {7, 8}
    tokens_give_back(portfolio_ids={8})  # 8's partitions were left for the next transaction
    tokens = dict(RateBucket.objects.values_list("name", "tokens"))
    assert tokens == {
        "global": pytest.approx(1.0),
        "portfolio:7": pytest.approx(1.0),
        "portfolio:8": pytest.approx(2.0),
    }
    tokens_give_back(portfolio_ids={7}, include_global=True)  # it touched nothing after all
    tokens = dict(RateBucket.objects.values_list("name", "tokens"))
    assert tokens == {
        "global": pytest.approx(2.0),
        "portfolio:7": pytest.approx(2.0),
        "portfolio:8": pytest.approx(2.0),
    }
    tokens_give_back(portfolio_ids={7, 8}, include_global=True)  # never above the burst
    assert list(RateBucket.objects.values_list("tokens", flat=True)) == [pytest.approx(2.0)] * 3


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_a_slice_ending_before_the_next_token_gives_its_job_back_due_now_without_a_deferral(active_policy, settings):
    settings.CLEANUP_BATCH_SIZE = 2
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 1.0, 1.0  # the next token in 1 s
    props = estate(active_policy, ["A"], rows=5)
    sweep_trigger(slot=SLOT, now=NOW)
    # A slice with 0.3 s to run: the second token comes after its end, within
    # what the next slice (5 s) sleeps through.
    result = runner.group_run_slice(owner="w", max_seconds=0.3)
    job = job_of(props["A"])
    assert (result.transactions, result.out_of_time, result.deferred_seconds) == (1, True, 0.0)
    assert (job.state, job.rows_deleted, job.attempt, job.available_at) == (JobState.PENDING, 2, 0, NOW)
    # Nothing was reserved for the refused instant.
    assert RateBucket.objects.get(name="global").updated_at == pytest.approx(NOW.timestamp())
    # The next slice, with its whole budget, sleeps for the token instead.
    assert runner.group_run_slice(owner="w").transactions == 2
    assert job_of(props["A"]).state == JobState.DONE


@pytest.mark.django_db
@pytest.mark.usefixtures("frozen")
def test_a_turn_whose_next_token_comes_after_its_end_ends_without_leasing_again(active_policy, settings):
    settings.CLEANUP_BATCH_SIZE = 1
    settings.CLEANUP_SLICE_SECONDS = 0.5
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 4.0, 1.0  # a token every 0.25 s
    props = estate(active_policy, ["A"], rows=10)
    sweep_trigger(slot=SLOT, now=NOW)
    turn = runner.worker_turn(job_id=job_of(props["A"]).pk)
    # Two batches (the burst's token, then one 0.25 s later); the third token
    # comes after the turn's 0.5 s: the turn ends with the one group it leased.
    assert (turn.slices, turn.jobs_leased) == (1, 1)
    job = job_of(props["A"])
    assert (job.state, job.rows_deleted, job.attempt, job.available_at) == (JobState.PENDING, 2, 0, NOW)


def test_a_slice_budget_counts_its_work_not_its_sleeps_for_tokens_within_twice_its_seconds(monkeypatch):
    from cleanup_ops.execution import leases

    now = [100.0]
    monkeypatch.setattr(leases.time, "monotonic", lambda: now[0])
    budget = leases.SliceBudget.of(5.0)
    assert (budget.wall, budget.left()) == (5.0 * leases.TOKEN_SLEEP_STRETCH, 5.0)
    now[0] += 4.0  # 1 s of work, 3 s asleep for tokens
    budget.slept += 3.0
    assert (budget.left(), budget.wall_left()) == (4.0, 6.0)
    now[0] += 5.0  # asleep again: the wall bound comes first
    budget.slept += 5.0
    assert budget.left() == 1.0
    now[0] += 1.0
    assert budget.left() == 0.0
    # A turn's group slice gets what is left of the turn's wall seconds.
    assert leases.SliceBudget.of(2.0, 3.0).wall == 3.0


@pytest.mark.django_db
def test_a_turn_asleep_for_its_tokens_runs_more_batches_than_its_seconds_hold_and_ends_within_twice_them(
    active_policy, settings
):
    settings.CLEANUP_BATCH_SIZE = 1
    settings.CLEANUP_SLICE_SECONDS = 0.5
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 4.0, 1.0  # a token every 0.25 s
    props = estate(active_policy, ["A"], rows=10)
    sweep_trigger(slot=SLOT, now=NOW)
    started = time.monotonic()
    turn = runner.worker_turn(job_id=job_of(props["A"]).pk)
    took = time.monotonic() - started
    job = job_of(props["A"])
    # Counted by wall seconds, 0.5 s held two batches (at 0 and 0.25 s); asleep
    # most of it, the turn goes on to the tokens at 0.5 and 0.75 s, and ends
    # before the one at 1.0 s, its wall bound (twice its seconds).
    assert (turn.slices, job.state) == (1, JobState.PENDING)
    assert job.rows_deleted in (3, 4)
    assert took < 2 * 0.5 + 0.5  # the wall bound, and the release after the last batch
