from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.execution.leases import job_lease
from cleanup_ops.models import CleanupJob, JobState, Sweep
from cleanup_ops.ratelimit import BucketConfig, tokens_acquire
from properties.models import Portfolio, Property
from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

from .conftest import make_user, utc


@pytest.mark.django_db
def test_a_bucket_grants_its_rate_plus_its_burst_under_a_controlled_clock():
    buckets = [BucketConfig("global", rate=10, burst=5)]
    granted, start = 0, 1_000_000.0
    for step in range(4001):  # four workers asking in turn every 2.5 ms for 10 s
        if tokens_acquire(portfolio_id=1, now=start + step * 0.0025, buckets=buckets) == 0:
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


@pytest.mark.postgres
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


@pytest.mark.postgres
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
