"""What a worker does with jobs whose rate tokens it will not sleep for: one rule
(``leases.jobs_give_back_for_tokens``), whatever path took the tokens.

Enumerated: every path that takes tokens (a single job's slice, a group's slice,
a purge's slice: its own, the document store's buckets) by both sides of the
rule — a wait the next slice could sleep through gives the job back due now (no
deferral, no broker message for later); a longer one releases it until exactly
when its token will be there. Never an attempt, never a lease kept. The clock is
frozen, so "exactly" is exact; the bucket's one token of burst is spent first, so
the wait is ``1 / rate``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from cleanup_ops.execution.runner import group_run_slice, job_run_slice
from cleanup_ops.models import CleanupJob, JobKind, JobState
from cleanup_ops.ratelimit import BucketConfig, tokens_reserve

from . import downstream_world
from .interference import NOW

clock = downstream_world.clock
leases_with_files = downstream_world.leases_with_files
purge_job = downstream_world.purge_job

pytestmark = pytest.mark.django_db

# (a wait the next slice sleeps through, run with a slice shorter than it), (a
# wait beyond any slice or lease, run with a whole slice).
WAITS = {"within the next slice": (1.0, 0.3), "beyond the next slice": (3600.0, None)}


def _spend_the_burst(name: str, rate: float) -> None:
    bucket = BucketConfig(name, rate=rate, burst=1.0)
    assert tokens_reserve(members=[(None, bucket)], now=NOW.timestamp(), max_wait=0).reserved


def _single(settings, rate: float, max_seconds: float | None) -> CleanupJob:  # type: ignore[no-untyped-def]
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = rate, 1.0
    _spend_the_burst("global", rate)
    job = downstream_world.delete_job()
    job_run_slice(job_id=job.pk, max_seconds=max_seconds)
    return job


def _group(settings, rate: float, max_seconds: float | None) -> CleanupJob:  # type: ignore[no-untyped-def]
    settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = rate, 1.0
    _spend_the_burst("global", rate)
    group_run_slice(owner="w", max_seconds=max_seconds)
    return downstream_world.delete_job()


def _purge(settings, rate: float, max_seconds: float | None) -> CleanupJob:  # type: ignore[no-untyped-def]
    settings.DOCSTORE_RATE_GLOBAL, settings.DOCSTORE_BURST_GLOBAL = rate, 1.0
    _spend_the_burst("docstore:global", rate)
    (job,) = downstream_world.purge_jobs()
    job_run_slice(job_id=job.pk, max_seconds=max_seconds)
    return job


PATHS: dict[str, tuple[Callable[..., CleanupJob], str]] = {
    "a single job's slice": (_single, "leases_with_files"),
    "a group's slice": (_group, "leases_with_files"),
    "a purge's slice": (_purge, "purge_job"),
}


@pytest.mark.parametrize("wait_name", list(WAITS))
@pytest.mark.parametrize("path_name", list(PATHS))
def test_a_job_whose_tokens_it_will_not_sleep_for_goes_back_by_the_one_rule_on_every_path(
    path_name: str, wait_name: str, settings, request: pytest.FixtureRequest
) -> None:  # type: ignore[no-untyped-def]
    run, world = PATHS[path_name]
    request.getfixturevalue(world)
    wait, max_seconds = WAITS[wait_name]
    before = CleanupJob.objects.values("pk", "cursor", "available_at").get(
        job_kind=JobKind.PURGE if world == "purge_job" else JobKind.DELETE, state=JobState.PENDING
    )
    job = run(settings, 1 / wait, max_seconds)
    job.refresh_from_db()
    assert (job.state, job.attempt, job.lease_token, job.cursor) == (JobState.PENDING, 0, None, before["cursor"])
    if wait_name == "within the next slice":
        # Due now (its place kept), no mark for later: the next slice reserves and sleeps.
        assert job.available_at <= NOW
        assert job.enqueued_at is None
    else:
        # Exactly then (to the microsecond the rate's float arithmetic rounds to).
        assert job.available_at.timestamp() == pytest.approx((NOW + timedelta(seconds=wait)).timestamp(), abs=1e-3)
        assert job.enqueued_at is not None  # the broker holds it until then (dispatch.hint_due_at)
