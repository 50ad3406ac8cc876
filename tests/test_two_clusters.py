"""Two ``qcluster`` processes, started as two hosts would start them, drain one sweep.

Each cluster is a real ``manage.py qcluster`` in its own session (process
group) with its own ``CLEANUP_CLUSTER_NAME``; both take messages from the one
django-q2 queue. The portfolio lease cap, pauses and the global rate limit
live in the database, so they hold across the clusters; killing one cluster
(its whole process group, as a host crash would) leaves the other draining,
and its leases come back to the survivor when they expire.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule
from django_q.status import Stat

from cleanup_ops.dispatch import dispatch_due_jobs
from cleanup_ops.models import CleanupJob, LedgerEntry, WorkerHeartbeat
from cleanup_ops.recovery.operator import pipeline_pause, pipeline_resume
from cleanup_ops.schedule import sweep_trigger
from harness.qcluster import QCluster
from properties.models import Lease, Portfolio

from .conftest import make_lease_estate
from .interleaving import CheckpointHold

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
ROWS_PER_PROPERTY = 40
RATE, BURST = 12.0, 3.0  # batches per second across every worker of both clusters


def cluster_env(name: str, **overrides: str) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CLEANUP_CLUSTER_NAME": name,
        "Q_WORKERS": "2",
        "CLEANUP_BATCH_SIZE": "5",
        "CLEANUP_SLICE_BATCHES": "2",
        "CLEANUP_SLICE_SECONDS": "1",
        "CLEANUP_LEASE_JOBS": "1",  # one partition per lease: the cap counts every worker
        "CLEANUP_PORTFOLIO_MAX_LEASES": "1",
        "CLEANUP_LEASE_SECONDS": "10",
        "CLEANUP_HEARTBEAT_SECONDS": "0",
        "LOG_LEVEL": "ERROR",
        **overrides,
    }


@pytest.fixture
def start_cluster() -> Iterator[Callable[..., QCluster]]:
    """Start a named cluster; every cluster started is stopped with the unit's procedure
    (SIGTERM to the main process, the group after a grace) and must leave nothing behind."""
    # The periodic dispatcher a migrated database has (the flush of the previous
    # transactional test removed it): a message that found its job's portfolio at
    # its cap leaves the job marked sent until it is re-sent.
    Schedule.objects.update_or_create(
        name="cleanup_dispatch",
        defaults={"func": "cleanup_ops.tasks.dispatch", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )
    started: list[QCluster] = []

    def start(name: str, **overrides: str) -> QCluster:
        cluster = QCluster(cluster_env(name, **overrides), cwd=ROOT)
        started.append(cluster)
        return cluster

    yield start
    survivors = {cluster.pid: cluster.stop(grace=30) for cluster in started}
    assert not any(survivors.values()), f"processes of stopped clusters survived: {survivors}"


@pytest.fixture
def estate() -> list[Portfolio]:
    props = make_lease_estate(rows=ROWS_PER_PROPERTY)
    return list(dict.fromkeys(prop.portfolio for prop in props))


def open_jobs(**filters: object) -> int:
    return CleanupJob.objects.open().filter(**filters).count()


def wait_for(predicate: Callable[[], bool], timeout: float, *, every: Callable[[], None] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if every:
            every()
        if predicate():
            return True
        time.sleep(0.05)
    return False


def assert_exactly_once(*, rows_before: int) -> None:
    entries = list(LedgerEntry.objects.values_list("operation_id", "rows_deleted"))
    assert len({op for op, _ in entries}) == len(entries), "an operation id is twice in the ledger"
    assert sum(n for _, n in entries) == rows_before - Lease.objects.count()


def test_two_clusters_drain_one_sweep_together_and_the_lease_cap_holds_across_them(start_cluster):
    # Which cluster polls first must not decide whether both take work (a turn holds
    # many batches, so a sweep is few messages and the first poller could take them
    # all). So every worker is held at the batch's first checkpoint: a cluster holds
    # at most workers + queue_limit + the one message its pusher waits to queue
    # (2 + 2 + 1), the dispatcher keeps topping the queue up from eight
    # portfolios, and the rest can only reach the other cluster. Three workers
    # waiting at once is more than one cluster has, so both clusters leased a job.
    make_lease_estate(portfolios=8, properties=1, rows=ROWS_PER_PROPERTY)
    held = {"CLEANUP_CHECKPOINTS": "batch.after_fence"}
    hold = CheckpointHold("batch.after_fence")
    holders_seen: dict[int, int] = {}

    def sample_holders() -> None:
        for portfolio_id, n in CleanupJob.objects.lease_holders_by_portfolio(now=timezone.now()).items():
            holders_seen[portfolio_id] = max(holders_seen.get(portfolio_id, 0), n)

    def sample_and_dispatch() -> None:
        sample_holders()
        dispatch_due_jobs()

    try:
        start_cluster("host-a", **held)
        start_cluster("host-b", **held)
        assert wait_for(lambda: len(Stat.get_all()) == 2, timeout=30), "django-q2's Stat does not see both clusters"
        assert len({stat.cluster_id for stat in Stat.get_all()}) == 2
        sweep_trigger()
        assert wait_for(lambda: len(hold.waiters()) >= 3, timeout=60, every=sample_and_dispatch), (
            f"workers waiting at the checkpoint: {len(hold.waiters())} (one cluster has 2)"
        )
    finally:
        hold.release()

    assert wait_for(lambda: open_jobs() == 0, timeout=180, every=sample_holders), "the sweep did not drain"

    assert Lease.objects.count() == 0
    assert_exactly_once(rows_before=8 * ROWS_PER_PROPERTY)
    assert holders_seen and max(holders_seen.values()) == 1, f"lease holders per portfolio: {holders_seen}"

    # A worker writes its heartbeat after its turn returns, so the last
    # batch's job is done a moment before its rows reach the heartbeat.
    def beats_add_up() -> bool:
        return sum(WorkerHeartbeat.objects.values_list("rows_deleted", flat=True)) == 8 * ROWS_PER_PROPERTY

    assert wait_for(beats_add_up, timeout=20), "the heartbeats never counted every deleted row"
    beats = {hb.cluster: hb for hb in WorkerHeartbeat.objects.all()}
    assert set(beats) == {"host-a", "host-b"}
    assert all(hb.jobs_leased > 0 for hb in beats.values()), "one cluster took no work"
    assert sum(hb.rows_deleted for hb in beats.values()) == 8 * ROWS_PER_PROPERTY


def test_the_global_rate_limit_holds_across_two_clusters(estate, start_cluster):
    # The cap is not binding here: a rate-limit deferral re-sends its job as a
    # due-at hint, and this test is about the token bucket alone.
    limits = {"CLEANUP_RATE_GLOBAL": str(RATE), "CLEANUP_BURST_GLOBAL": str(BURST), "CLEANUP_PORTFOLIO_MAX_LEASES": "2"}
    start_cluster("host-a", **limits)
    start_cluster("host-b", **limits)
    # Both clusters up before the sweep, as above: on a loaded machine the first one
    # up could drain it alone while the other was still starting.
    assert wait_for(lambda: len(Stat.get_all()) == 2, timeout=30), "django-q2's Stat does not see both clusters"
    sweep_trigger()
    assert wait_for(lambda: open_jobs() == 0, timeout=180), "the sweep did not drain"
    assert Lease.objects.count() == 0
    assert_exactly_once(rows_before=6 * ROWS_PER_PROPERTY)
    # Not asserted here that each cluster leased: which one polls first decides
    # that (a sweep is a handful of messages), and holding workers at a checkpoint
    # to make both take work would either hold their tokens (a batch's
    # checkpoints come after its token) or, at the lease, not be reached (a turn
    # leases through its group). That both clusters drain one sweep together is
    # the test above's, by construction; this one holds the bucket while both run.
    # The global token bucket: in any window, at most the burst plus the refill (one
    # token per transaction; with one partition per lease, one ledger row each).
    times = sorted(t.timestamp() for t in LedgerEntry.objects.values_list("applied_at", flat=True))
    worst = max(
        (j - i + 1) - (BURST + RATE * (times[j] - times[i])) for i in range(len(times)) for j in range(i, len(times))
    )
    assert worst <= 1.0, f"the rate limit was exceeded by {worst:.1f} batches"


def test_a_pause_holds_for_both_clusters_and_a_resume_lets_either_finish(estate, start_cluster):
    paused = estate[0]
    start_cluster("host-a")
    start_cluster("host-b")
    sweep_trigger()
    assert wait_for(lambda: LedgerEntry.objects.filter(portfolio_id=paused.pk).exists(), timeout=60)
    pipeline_pause(actor=None, reason="legal asked us to wait", portfolio_id=paused.pk)
    paused_at = timezone.now()

    assert wait_for(lambda: open_jobs() == open_jobs(portfolio_id=paused.pk), timeout=180)
    # A slice running at the pause finishes (at most CLEANUP_SLICE_SECONDS); no new lease starts.
    time.sleep(3)
    assert open_jobs(portfolio_id=paused.pk) > 0
    late = LedgerEntry.objects.filter(portfolio_id=paused.pk, applied_at__gt=paused_at + timedelta(seconds=2))
    assert not late.exists(), "a cluster leased a paused portfolio's job"

    pipeline_resume(actor=None, reason="legal cleared it", portfolio_id=paused.pk)
    assert wait_for(lambda: open_jobs() == 0, timeout=180), "the resumed portfolio did not drain"
    assert Lease.objects.count() == 0
    assert_exactly_once(rows_before=6 * ROWS_PER_PROPERTY)


def test_killing_one_cluster_leaves_the_other_draining_and_the_survivor_finishes_its_leases(estate, start_cluster):
    # A global rate limit keeps the sweep running for seconds (48 batches at 4 a
    # second), so the kill always lands mid-sweep: unlimited, two clusters can
    # finish it before host-a's first heartbeat is read (seen on a loaded CI host).
    slow = {"CLEANUP_RATE_GLOBAL": "4", "CLEANUP_BURST_GLOBAL": "1"}
    victim = start_cluster("host-a", **slow)
    start_cluster("host-b", **slow)
    sweep_trigger()
    assert wait_for(lambda: WorkerHeartbeat.objects.filter(cluster="host-a", jobs_leased__gt=0).exists(), timeout=60), (
        "host-a never took work"
    )
    assert open_jobs() > 0
    victim.kill()  # the whole process group at once: a host that died
    assert wait_for(lambda: victim.survivors() == [], timeout=10), "processes of the killed cluster survived"
    killed_at = timezone.now()

    # host-a's leases come back when they expire (CLEANUP_LEASE_SECONDS) and the
    # dispatcher's next tick sends their jobs again. Its Schedule ticks once a
    # minute; the test ticks it once a second instead (the same function the
    # Schedule runs), so the minute is not waited out. It sends nothing a lease
    # still holds: that is the dispatcher's rule, not the test's.
    last_tick = [0.0]

    def tick() -> None:
        if time.monotonic() - last_tick[0] >= 1.0:
            last_tick[0] = time.monotonic()
            dispatch_due_jobs()

    assert wait_for(lambda: open_jobs() == 0, timeout=180, every=tick), "host-b did not finish the sweep"
    assert Lease.objects.count() == 0
    assert_exactly_once(rows_before=6 * ROWS_PER_PROPERTY)
    survivor = WorkerHeartbeat.objects.get(cluster="host-b")
    assert survivor.last_progress_at is not None and survivor.last_progress_at > killed_at
