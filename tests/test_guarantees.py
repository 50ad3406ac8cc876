"""The guarantees that are structures now, each with the case that broke it.

Every test here failed on the code before the structures existed (the
reviews' reproductions): a large partition spending other portfolios' rate
tokens; one advisory lock per portfolio exhausting the lock table; a sweep
marked drained beside the job a redrive just created; the fallback after a
failed shared transaction ignoring the slice's deadline; two workers both
taking a portfolio's last lease slot. Concurrency is real: other PostgreSQL
connections (``tests/interference.py``), and a lock wait is observed in
``pg_stat_activity``, not inferred from elapsed time.

Two guarantees have modules of their own: one purge decision per document
(``tests/test_guarantees_purge_decisions.py``) and one open job per
partition (``tests/test_guarantees_open_jobs.py``).
"""

from __future__ import annotations

import hashlib
import threading

import pytest
from django.db import connection, connections

from cleanup_ops.execution.batches import job_load, operation_id, run_batch
from cleanup_ops.execution.leases import job_lease, jobs_lease_group
from cleanup_ops.execution.runner import group_run_slice, job_run_slice
from cleanup_ops.health import health_readiness
from cleanup_ops.models import CleanupJob, DeadLetter, JobOutcome, JobState, LedgerEntry, Sweep, SweepStatus
from cleanup_ops.recovery.classification import InvalidInput
from cleanup_ops.recovery.operator import dead_letter_redrive
from cleanup_ops.schedule import sweep_trigger
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from properties.models import Lease, Portfolio, Property

from . import interference
from .conftest import make_records, remaining_ids, utc, wait_until_blocked
from .conftest import one_property_portfolios as estate
from .interference import NOW, OLD, REASON, SLOT, Held, in_thread, raising

clock = interference.clock


def job_of(prop: Property) -> CleanupJob:
    return CleanupJob.objects.get(property_id=prop.pk, job_kind="delete")


# --- 3. Rate tokens for the portfolios a transaction touches ---------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_large_partition_alone_spends_only_its_own_portfolios_tokens(active_policy, settings):
    from cleanup_ops.models import RateBucket

    settings.CLEANUP_BATCH_SIZE = 10
    settings.CLEANUP_RATE_PORTFOLIO = 0.001
    settings.CLEANUP_BURST_PORTFOLIO = 1.0
    props = estate(active_policy, ["A", "B", "C"], rows=1)
    Lease.objects.filter(property_id=props["A"].pk).delete()
    make_records(props["A"], "lease", 25, ended=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    result = group_run_slice(owner="w", max_batches=20)  # a worker's turn
    # The first transaction drew a token each for A, B and C but held only
    # A's large batch: B's and C's tokens went back, so they ran next, and A
    # (no token left) was deferred to its own portfolio's refill.
    b, c, a = job_of(props["B"]), job_of(props["C"]), job_of(props["A"])
    assert (b.outcome, c.outcome) == (JobOutcome.DELETED, JobOutcome.DELETED)
    assert a.state == JobState.PENDING and a.rows_deleted == 10 and a.attempt == 0
    assert result.deferred_seconds > 0
    buckets = dict(RateBucket.objects.values_list("name", "tokens"))
    b_name, c_name = f"portfolio:{props['B'].portfolio_id}", f"portfolio:{props['C'].portfolio_id}"
    assert buckets[b_name] < 0.01 and buckets[c_name] < 0.01  # each spent once, on its own batch


# --- 4. A bounded number of lease locks -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_group_lease_over_hundreds_of_portfolios_takes_at_most_one_lock_per_stripe(settings, manager, reviewer):
    settings.CLEANUP_LEASE_JOBS = 100
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    portfolio = Portfolio.objects.create(name="P", slug="p")
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    version = policy_version_approve(
        version_id=policy_version_submit(policy=policy, retention_days=1, author=manager, reason="r for the tests").pk,
        reviewer=reviewer,
        note="approved for the tests",
    )
    sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=SLOT)
    # 400 due jobs of 400 portfolios (scope ids are plain ids: no rows needed to lease).
    CleanupJob.objects.bulk_create(
        [
            CleanupJob(
                sweep=sweep,
                key=f"k{n}",
                portfolio_id=10_000 + n,
                property_id=20_000 + n,
                record_kind="lease",
                policy_version=version,
                cutoff=OLD,
                available_at=OLD,
            )
            for n in range(400)
        ]
    )

    def lease_and_count() -> tuple[int, int]:
        group = jobs_lease_group(owner="w", limit=100)
        with connection.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'")
            return len(group.job_ids) if group else 0, int(cur.fetchone()[0])

    holding = Held(lease_and_count)
    leased, advisory = holding.result
    holding.release()
    assert leased == 100
    assert 0 < advisory <= settings.CLEANUP_LEASE_LOCK_STRIPES


@pytest.mark.django_db
def test_readiness_fails_when_the_lock_table_cannot_hold_a_lease_transactions_locks(settings):
    ok = health_readiness()
    assert ok.ok and ok.data["max_locks_per_transaction"] >= ok.data["lease_locks_needed"]
    settings.CLEANUP_LEASE_LOCK_STRIPES = ok.data["max_locks_per_transaction"]
    report = health_readiness()
    assert not report.ok and "max_locks_per_transaction" in report.detail


# --- 5. The races around sweeps and slices -----------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clock")
def test_a_sweep_is_not_marked_drained_while_a_redrive_gives_it_a_new_job(active_policy, operator_user):
    props = estate(active_policy, ["A", "B"])
    result = sweep_trigger(slot=SLOT, now=NOW)
    job_run_slice(job_id=job_of(props["A"]).pk, before_batch=raising(InvalidInput("bad input")))
    letter = DeadLetter.objects.get()
    # B's job is about to finish; the sweep is still running.
    job_run_slice(job_id=job_of(props["B"]).pk)
    Sweep.objects.filter(pk=result.sweep.pk).update(status=SweepStatus.RUNNING, finished_at=None)
    redriving = Held(lambda: dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON))
    thread, outcome = in_thread(lambda: sweep_mark_drained_if_finished(sweep_id=result.sweep.pk, now=NOW))
    while "pid" not in outcome:
        thread.join(0.01)
    wait_until_blocked(int(outcome["pid"]), by=redriving.pid)  # type: ignore[arg-type]
    redriving.release()
    thread.join(30)
    assert outcome.get("result") is False, outcome
    sweep = Sweep.objects.get(pk=result.sweep.pk)
    assert sweep.status == SweepStatus.RUNNING
    assert CleanupJob.objects.filter(sweep=sweep).open().count() == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_the_fallback_after_a_failed_shared_transaction_keeps_to_the_slice_deadline(active_policy, monkeypatch):
    from cleanup_ops.execution import runner

    props = estate(active_policy, ["A", "B", "C"], rows=1)
    sweep_trigger(slot=SLOT, now=NOW)

    real = runner.run_group_batch

    def failing(*, jobs, **kwargs):  # type: ignore[no-untyped-def]
        # The shared transaction fails; each job alone (a group of one) does not.
        if len(jobs) > 1:
            raise InvalidInput("which partition?")
        return real(jobs=jobs, **kwargs)

    monkeypatch.setattr(runner, "run_group_batch", failing)
    result = group_run_slice(owner="w", max_seconds=0.0)
    assert result.fell_back
    # Only the first ran alone (so a failing partition is always found); the
    # others wait, pending and due, for the next turn.
    jobs = [job_of(prop) for prop in props.values()]
    assert sorted(j.state for j in jobs) == [JobState.DONE, JobState.PENDING, JobState.PENDING]
    assert all(j.attempt == 0 for j in jobs)


# --- 6. Lease caps under a barrier, and the operation id ---------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lease", ["group", "single"])
def test_workers_released_together_never_hold_more_than_the_portfolio_cap(active_policy, settings, lease):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 2
    props = estate(active_policy, ["A"], rows=1)
    for n in range(7):
        make_records(Property.objects.create(portfolio=props["A"].portfolio, name=f"H{n}"), "lease", 1, ended=OLD)
    sweep_trigger(slot=SLOT, now=utc("2026-08-21T02:05:00Z"))
    ids = list(CleanupJob.objects.order_by("id").values_list("id", flat=True))
    workers = 6
    barrier = threading.Barrier(workers)
    taken: list[object] = []

    def worker(n: int) -> None:
        try:
            barrier.wait(10)
            if lease == "group":
                got = jobs_lease_group(owner=f"w{n}", limit=1)
            else:
                got = job_lease(job_id=ids[n], owner=f"w{n}")
            if got is not None:
                taken.append(got)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    from django.utils import timezone

    holders = CleanupJob.objects.lease_holders_by_portfolio(now=timezone.now())
    assert len(taken) == 2 and holders == {props["A"].portfolio_id: 2}


def test_the_operation_id_is_the_sha256_of_its_documented_fields():
    op = operation_id(
        record_kind="lease",
        property_id=42,
        slot=utc("2026-08-21T02:00:00Z"),
        cutoff=utc("2025-08-21T02:00:00Z"),
        after_id=1000,
        limit=250,
    )
    raw = "retention:lease:42:2026-08-21T02:00:00Z:2025-08-21T02:00:00Z:1000:250"
    assert op == hashlib.sha256(raw.encode()).hexdigest()
    assert op == "d2cef664e4b9cda4df24359ae16c80f91f112139017914e22250b84eaa08ce2c"


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_replay_from_one_cursor_with_another_batch_size_deletes_nothing_twice_and_counts_no_hold(
    active_policy,
):
    props = estate(active_policy, ["A"], rows=10)
    sweep_trigger(slot=SLOT, now=NOW)
    job = job_of(props["A"])
    ref = job_load(job.pk)

    def batch(limit: int) -> None:
        lease = job_lease(job_id=job.pk, owner="w")
        assert lease is not None
        run_batch(job=ref, lease=lease, limit=limit)
        CleanupJob.objects.filter(pk=job.pk).update(state=JobState.PENDING, lease_token=None, lease_expires_at=None)

    batch(4)
    # A redrive from an older cursor, now with batches of 6: a new operation id
    # (the limit is part of it), over rows of which four are gone.
    CleanupJob.objects.filter(pk=job.pk).update(cursor=0)
    batch(6)
    CleanupJob.objects.filter(pk=job.pk).update(cursor=0)
    batch(4)  # the first operation again: replayed from the ledger, not applied
    entries = list(
        LedgerEntry.objects.order_by("id").values_list("after_id", "batch_limit", "candidates", "rows_deleted")
    )
    assert [(after, limit) for after, limit, _, _ in entries] == [(0, 4), (0, 6)]
    assert sum(deleted for *_, deleted in entries) == 10
    assert all(candidates == deleted for _, _, candidates, deleted in entries)  # nothing counted as held
    assert remaining_ids(props["A"], "lease") == set()
    assert LedgerEntry.objects.values("operation_id").distinct().count() == 2
    job.refresh_from_db()
    assert job.rows_held == 0


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_transaction_refused_a_global_token_takes_no_portfolio_token(settings):
    from cleanup_ops.execution.leases import group_tokens
    from cleanup_ops.models import RateBucket
    from cleanup_ops.ratelimit import global_buckets, tokens_acquire

    settings.CLEANUP_RATE_GLOBAL = settings.CLEANUP_RATE_PORTFOLIO = 0.001
    settings.CLEANUP_BURST_GLOBAL = settings.CLEANUP_BURST_PORTFOLIO = 1.0
    assert tokens_acquire(portfolio_id=0, now=NOW.timestamp(), buckets=global_buckets()) == 0.0  # global now empty
    grant = group_tokens({7, 8}, max_wait=60.0)
    # The global token is 1,000 s away: nothing reserved, each portfolio told when.
    assert not grant.reserved and grant.allowed == frozenset()
    assert grant.wait_of(7) == grant.wait_of(8) == pytest.approx(1000.0)
    tokens = dict(RateBucket.objects.values_list("name", "tokens"))
    assert tokens["portfolio:7"] > 0.99 and tokens["portfolio:8"] > 0.99
