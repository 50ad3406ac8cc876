"""Every way out of a lease leaves the job's lease columns as ``lifecycle.LEASE_CLEARED``
says, and an advancing batch keeps them: the one definition, written from Python
(release, retry, fail) and rendered into SQL (the purge's finish, a batch's finish).

Enumerated: each transition that leaves ``leased``, from a lease taken the way a
worker takes it, compared column by column with the mapping — a path that clears
the lease with its own list (as four did) and forgets a column fails here, naming
the transition and the column.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction

from cleanup_ops import clock
from cleanup_ops.execution.leases import job_finish, job_lease, job_release, lock_job
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.lifecycle import LEASE_CLEARED, JobOutcome, JobState
from cleanup_ops.models import CleanupJob
from cleanup_ops.schedule import sweep_trigger

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")


def _leased_job(active_policy, portfolio, prop, rows: int = 3) -> CleanupJob:  # type: ignore[no-untyped-def]
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", rows, ended=OLD)
    sweep_trigger()
    return CleanupJob.objects.get(record_kind="lease", property_id=prop.pk)


def _sent_again(job_id: int) -> None:
    """A dispatcher's mark on the leased job (it sends a job whose lease expired)."""
    CleanupJob.objects.filter(pk=job_id).update(enqueued_at=clock.now())


def _release_now(job: CleanupJob) -> None:
    lease = job_lease(job_id=job.pk, owner="test-worker")
    assert lease is not None
    _sent_again(job.pk)
    assert job_release(lease=lease)


def _release_for_later(job: CleanupJob) -> None:
    lease = job_lease(job_id=job.pk, owner="test-worker")
    assert lease is not None
    _sent_again(job.pk)
    assert job_release(lease=lease, available_at=clock.now() + timedelta(minutes=5))


def _retry(job: CleanupJob) -> None:
    assert job_lease(job_id=job.pk, owner="test-worker") is not None
    _sent_again(job.pk)
    job.refresh_from_db()
    job.mark_retry(at=clock.now() + timedelta(minutes=1))


def _fail(job: CleanupJob) -> None:
    assert job_lease(job_id=job.pk, owner="test-worker") is not None
    _sent_again(job.pk)
    job.refresh_from_db()
    job.mark_dead()


def _finish_one(job: CleanupJob) -> None:  # the purge's finish
    lease = job_lease(job_id=job.pk, owner="test-worker")
    assert lease is not None
    _sent_again(job.pk)
    with transaction.atomic(), connection.cursor() as cur:
        lock_job(cur, job_id=job.pk, lease=lease, now=clock.now())
        job_finish(cur, job_id=job.pk, outcome=JobOutcome.PURGED, now=clock.now())


def _batch_finishes(job: CleanupJob) -> None:  # the batch transaction's finish
    job_run_slice(job_id=job.pk, batch_size=1000, before_batch=_sent_again)


EXITS: dict[str, Callable[[CleanupJob], None]] = {
    "release now": _release_now,
    "release for later": _release_for_later,
    "retry": _retry,
    "fail": _fail,
    "purge's finish": _finish_one,
    "batch's finish": _batch_finishes,
}


@pytest.mark.parametrize("exit_name", list(EXITS))
def test_every_way_out_of_a_lease_clears_the_lease_columns_the_lifecycle_names(
    exit_name: str, active_policy, portfolio, prop
) -> None:  # type: ignore[no-untyped-def]
    job = _leased_job(active_policy, portfolio, prop)
    # Each exit is taken with a dispatcher's stale mark on the leased job:
    # leaving the lease forgets it too.
    EXITS[exit_name](job)
    after = CleanupJob.objects.values(*LEASE_CLEARED, "state").get(pk=job.pk)
    assert after["state"] != JobState.LEASED
    expected = dict(LEASE_CLEARED)
    if exit_name == "release for later":
        # Marked again after the release: the broker holds the job until then.
        assert after["enqueued_at"] is not None
        expected["enqueued_at"] = after["enqueued_at"]
    differs = {c: (after[c], v) for c, v in expected.items() if after[c] != v}
    assert not differs, f"{exit_name} left lease columns (found, expected): {differs}"


def test_a_batch_that_advances_keeps_its_lease_and_renews_it(active_policy, portfolio, prop) -> None:  # type: ignore[no-untyped-def]
    job = _leased_job(active_policy, portfolio, prop, rows=3)
    seen: list[dict[str, object]] = []

    def between_batches(job_id: int) -> None:
        seen.append(CleanupJob.objects.values(*LEASE_CLEARED, "state").get(pk=job_id))

    job_run_slice(job_id=job.pk, batch_size=1, before_batch=between_batches)
    assert len(seen) >= 3
    first, second = seen[0], seen[1]
    # After one batch advanced: the same lease, renewed, still leased.
    assert second["state"] == JobState.LEASED
    assert second["lease_token"] == first["lease_token"] is not None
    assert second["lease_owner"] == first["lease_owner"] != ""
    assert second["lease_expires_at"] >= first["lease_expires_at"]  # type: ignore[operator]
    final = CleanupJob.objects.values(*LEASE_CLEARED).get(pk=job.pk)
    assert final == LEASE_CLEARED
