"""Downstream purge: attachments removed from the document store through the outbox.

Every test that purges talks real HTTP to the demo store (``python -m
docstore``) on a free loopback port; the store's own request log (method,
path, key, arrival time, status, replayed) is the witness of what left.

This module holds the core purge path: the outbox a deleting batch writes, and
the purge job sending, retrying, deferring and dead-lettering its DELETEs.
What stops a purge (holds, remaining references, injected ids) is in
``tests/test_downstream_purge_guards.py``; the store, its client and its
settings in ``tests/test_downstream_store_and_settings.py``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from email.utils import format_datetime

import pytest
from django.db import connections, transaction
from django.utils import timezone

from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.execution.batches import job_load, run_batch
from cleanup_ops.execution.leases import job_lease
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    JobKind,
    JobOutcome,
    JobState,
    LedgerEntry,
    PurgeRequest,
    RateBucket,
)
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import dead_letters_redrive_bulk, pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from cleanup_ops.selectors import DeadLetterFilter
from properties.models import Lease, MaintenanceRecord, Portfolio, Property
from retention.models import AuditEvent

from . import downstream_world
from .conftest import WALL_CLOCK, make_records, remaining_ids
from .downstream_world import NOW, OLD, SLOT, attach, delete_job, purge_jobs

REASON = "the document store is healthy again"

pytestmark = pytest.mark.django_db

# The fixtures the downstream modules share (tests/downstream_world.py).
clock = downstream_world.clock
leases_with_files = downstream_world.leases_with_files
purge_job = downstream_world.purge_job


def run_until_dead(job: CleanupJob, clock) -> None:  # type: ignore[no-untyped-def]
    for _ in range(20):
        job.refresh_from_db()
        if job.state == JobState.DEAD:
            return
        clock.move_to(job.available_at, tick=False)
        job_run_slice(job_id=job.pk)
    raise AssertionError("the job never became dead")


class TestOutbox:
    def test_a_batch_writes_one_purge_request_with_the_deleted_rows_documents_in_its_transaction(
        self, leases_with_files, prop
    ):
        _, documents = leases_with_files
        result = job_run_slice(job_id=delete_job().pk, batch_size=3)
        assert result.rows_deleted == 6 and remaining_ids(prop, "lease") == set()
        ledger = list(LedgerEntry.objects.order_by("id"))
        requests = list(PurgeRequest.objects.order_by("id"))
        # Batch 1 deleted ids[0:3] (all with files), batch 2 ids[3:6] (one file).
        assert [r.key for r in requests] == [e.operation_id for e in ledger[:2]]
        assert [r.document_ids for r in requests] == [documents[:3], documents[3:4]]
        jobs = purge_jobs()
        assert [j.key for j in jobs] == [f"purge:{r.key}" for r in requests]
        assert [j.purge_request_id for j in jobs] == [r.pk for r in requests]
        assert all(j.state == JobState.PENDING and j.property_id == prop.pk for j in jobs)

    def test_a_batch_that_rolls_back_takes_its_purge_request_with_it(self, leases_with_files, prop):
        ids, _ = leases_with_files
        job = delete_job()
        lease = job_lease(job_id=job.pk, owner="crashing")
        with pytest.raises(RuntimeError), transaction.atomic():
            assert run_batch(job=job_load(job.pk), lease=lease, limit=10)[0] == 6
            assert PurgeRequest.objects.count() == 1  # written by the batch itself, not after commit
            raise RuntimeError("the worker died before the commit")
        assert remaining_ids(prop, "lease") == set(ids)
        assert not PurgeRequest.objects.exists() and not purge_jobs()

    def test_a_kind_without_attachments_and_a_batch_without_files_write_no_purge(
        self, portfolio, prop, active_policy, clock, row_deletes_only
    ):
        active_policy(portfolio, "tenant_activity", 30)
        active_policy(portfolio, "maintenance_record", 30)
        make_records(prop, "tenant_activity", 3, ended=OLD)
        make_records(prop, "maintenance_record", 3, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        for job in CleanupJob.objects.all():
            assert job_run_slice(job_id=job.pk).outcome == JobOutcome.DELETED
        assert LedgerEntry.objects.count() == 2
        assert not PurgeRequest.objects.exists() and not purge_jobs()

    def test_a_replayed_batch_writes_no_second_purge_request(self, leases_with_files, clock):
        job = delete_job()
        job_run_slice(job_id=job.pk, batch_size=3, max_batches=1)
        # A redrive (or a lost acknowledgement) starts again from cursor 0.
        CleanupJob.objects.filter(pk=job.pk).update(cursor=0)
        assert job_run_slice(job_id=job.pk, batch_size=3).outcome == JobOutcome.DELETED
        assert PurgeRequest.objects.count() == 2 and len(purge_jobs()) == 2

    def test_a_document_id_that_is_not_an_identifier_is_counted_and_never_stored(
        self, portfolio, prop, active_policy, clock
    ):
        active_policy(portfolio, "maintenance_record", 30)
        ids = make_records(prop, "maintenance_record", 2, ended=OLD)
        MaintenanceRecord.objects.filter(pk=ids[0]).update(document_id="http://127.0.0.1:1/x")
        MaintenanceRecord.objects.filter(pk=ids[1]).update(document_id="photo-1")
        sweep_trigger(slot=SLOT, now=NOW)
        job_run_slice(job_id=delete_job().pk)
        request = PurgeRequest.objects.get()
        assert (request.document_ids, request.invalid_ids) == (["photo-1"], 1)


class TestPurge:
    def test_each_document_is_deleted_once_with_its_idempotency_key_and_a_404_counts_as_done(self, purge_job, docstore):
        request = purge_job.purge_request
        gone = request.document_ids[2]
        docstore._admin("POST", "reset")  # one file already gone, and another one that is not ours
        docstore.create("unrelated-file", *[d for d in request.document_ids if d != gone])
        result = job_run_slice(job_id=purge_job.pk)
        assert result.outcome == JobOutcome.PURGED and result.documents_purged == 4
        assert docstore.documents() == {"unrelated-file"}
        log = docstore.requests()
        assert [r["path"] for r in log] == [f"/documents/{d}" for d in request.document_ids]
        assert [r["key"] for r in log] == [f"{request.key}:{d}" for d in request.document_ids]
        assert [r["status"] for r in log] == [204, 204, 404, 204]
        request.refresh_from_db()
        assert (request.documents_purged, request.documents_absent) == (3, 1)
        purge_job.refresh_from_db()
        assert (purge_job.state, purge_job.outcome, purge_job.cursor) == (JobState.DONE, JobOutcome.PURGED, 4)

    @pytest.mark.parametrize("header", ["seconds", "http-date"])
    def test_a_429_is_not_sent_again_before_its_retry_after_instant_and_then_succeeds(
        self, purge_job, docstore, clock, header
    ):
        retry_at = NOW + timedelta(seconds=7)
        value = "7" if header == "seconds" else format_datetime(retry_at, usegmt=True)
        docstore.set_faults(status=429, retry_after=value, count=1)
        result = job_run_slice(job_id=purge_job.pk)
        assert result.error_category == FailureCategory.DOWNSTREAM_THROTTLED
        purge_job.refresh_from_db()
        assert purge_job.state == JobState.PENDING and purge_job.attempt == 1
        assert retry_at <= purge_job.available_at <= retry_at + timedelta(seconds=2)
        assert len(docstore.requests()) == 1

        clock.move_to(purge_job.available_at - timedelta(seconds=1), tick=False)
        assert job_run_slice(job_id=purge_job.pk).leased is False
        assert purge_job.pk not in fair_due_job_ids(now=timezone.now(), limit=10)
        assert len(docstore.requests()) == 1  # nothing re-sent before the instant

        clock.move_to(purge_job.available_at, tick=False)
        assert job_run_slice(job_id=purge_job.pk).outcome == JobOutcome.PURGED
        log = docstore.requests()
        assert [r["status"] for r in log] == [429, 204, 204, 204, 204]
        assert log[0]["key"] == log[1]["key"]  # the retry used the same key
        assert docstore.documents() == set()

    def test_a_429_holds_the_other_workers_purges_until_its_instant_without_burning_their_attempts(
        self, leases_with_files, docstore, clock
    ):
        _, documents = leases_with_files
        docstore.create(*documents)
        job_run_slice(job_id=delete_job().pk, batch_size=2)
        first, second = purge_jobs()
        docstore.set_faults(status=429, retry_after="7", count=1)
        assert job_run_slice(job_id=first.pk).error_category == FailureCategory.DOWNSTREAM_THROTTLED
        deferred = job_run_slice(job_id=second.pk)
        assert deferred.leased and deferred.error_category == "" and 7 <= deferred.deferred_seconds <= 9
        second.refresh_from_db()
        assert (second.state, second.attempt) == (JobState.PENDING, 0)
        assert second.available_at >= NOW + timedelta(seconds=7)
        assert len(docstore.requests()) == 1  # the second worker sent nothing

        clock.move_to(max(first.available_at, second.available_at) + timedelta(seconds=2), tick=False)
        cleanup_drain()
        assert docstore.documents() == set()
        assert [r["status"] for r in docstore.requests()] == [429, 204, 204, 204, 204]

    def test_a_timeout_after_the_store_applied_the_delete_retries_with_the_same_key_and_changes_nothing_twice(
        self, purge_job, docstore, clock, settings
    ):
        settings.DOCSTORE_READ_TIMEOUT = 0.3
        first = purge_job.purge_request.document_ids[0]
        docstore.set_faults(hang_after_apply=1.0, count=1)
        result = job_run_slice(job_id=purge_job.pk)
        assert result.error_category == FailureCategory.TIMEOUT and result.documents_purged == 0
        purge_job.refresh_from_db()
        assert (purge_job.state, purge_job.attempt, purge_job.cursor) == (JobState.PENDING, 1, 0)
        assert first not in docstore.documents()  # the store did apply it
        # A new file that happens to reuse the id: a second application of the
        # old request would delete it.
        docstore.create(first)

        clock.move_to(purge_job.available_at, tick=False)
        assert job_run_slice(job_id=purge_job.pk).outcome == JobOutcome.PURGED
        assert docstore.documents() == {first}
        log = [r for r in docstore.requests() if r["path"] == f"/documents/{first}"]
        assert len(log) == 2 and log[0]["key"] == log[1]["key"]
        assert [r["replayed"] for r in log] == [False, True]
        request = PurgeRequest.objects.get()
        assert (request.documents_purged, request.documents_absent) == (4, 0)

    def test_a_worker_whose_lease_expired_during_the_call_moves_no_cursor_and_the_next_one_sends_nothing_again(
        self, purge_job, docstore, clock, settings
    ):
        # The store's answer is recorded with the call, under the document's
        # lock (its disposition is purged), so the next holder of the job
        # counts the document as purged by this request without a second call.
        first = purge_job.purge_request.document_ids[0]

        def lease_expires_meanwhile(job_id: int) -> None:
            clock.move_to(NOW + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS + 1), tick=False)

        result = job_run_slice(job_id=purge_job.pk, owner="slow", before_batch=lease_expires_meanwhile)
        assert result.lease_lost and result.documents_purged == 0
        purge_job.refresh_from_db()
        assert (purge_job.cursor, purge_job.attempt) == (0, 0)  # fenced: nothing committed
        assert first not in docstore.documents()  # although the store applied it

        assert job_run_slice(job_id=purge_job.pk, owner="rescuer").outcome == JobOutcome.PURGED
        log = [r for r in docstore.requests() if r["path"] == f"/documents/{first}"]
        assert [(r["status"], r["replayed"]) for r in log] == [(204, False)]
        request = PurgeRequest.objects.get()
        assert (request.documents_purged, request.documents_absent) == (4, 0)

    def test_a_500_storm_dead_letters_after_the_budget_and_a_redrive_with_a_reason_finishes_the_purge(
        self, leases_with_files, docstore, clock, settings
    ):
        settings.CLEANUP_MAX_ATTEMPTS = 3
        _, documents = leases_with_files
        docstore.create(*documents)
        job_run_slice(job_id=delete_job().pk, batch_size=2)
        jobs = purge_jobs()
        assert len(jobs) == 2
        docstore.set_faults(status=500)
        for job in jobs:
            run_until_dead(job, clock)
        letters = list(DeadLetter.objects.order_by("id"))
        assert [(d.category, d.attempts, d.job_id) for d in letters] == [
            (FailureCategory.RETRY_BUDGET_EXHAUSTED, 3, job.pk) for job in jobs
        ]
        log = docstore.requests()
        assert len(log) == 6 and {r["status"] for r in log} == {500}
        assert len({r["key"] for r in log}) == 2  # every retry of a document sent the same key
        assert docstore.documents() == set(documents)

        docstore.clear_faults()
        redriven = dead_letters_redrive_bulk(
            actor=None, reason=REASON, letter_filter=DeadLetterFilter(category=FailureCategory.RETRY_BUDGET_EXHAUSTED)
        )
        assert [(j.job_kind, j.purge_request_id, j.redrive_of_id) for j in redriven] == [
            (JobKind.PURGE, job.purge_request_id, job.pk) for job in jobs
        ]
        assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 2
        cleanup_drain()
        assert docstore.documents() == set()
        for job in redriven:
            job.refresh_from_db()
            assert (job.state, job.outcome) == (JobState.DONE, JobOutcome.PURGED)
        assert all(d.status == DeadLetter.Status.REDRIVEN for d in DeadLetter.objects.all())

    def test_the_stores_own_bucket_limits_purges_and_an_empty_one_defers_without_an_attempt(
        self, purge_job, docstore, settings, portfolio
    ):
        settings.DOCSTORE_RATE_GLOBAL = 0.01
        settings.DOCSTORE_BURST_GLOBAL = 2
        settings.DOCSTORE_RATE_PORTFOLIO = 0.01
        settings.DOCSTORE_BURST_PORTFOLIO = 3
        result = job_run_slice(job_id=purge_job.pk)
        assert result.documents_purged == 2 and result.deferred_seconds > 1 and result.error_category == ""
        purge_job.refresh_from_db()
        assert (purge_job.state, purge_job.attempt, purge_job.cursor) == (JobState.PENDING, 0, 2)
        assert len(docstore.requests()) == 2
        names = set(RateBucket.objects.values_list("name", flat=True))
        assert names == {"docstore:global", f"docstore:portfolio:{portfolio.pk}"}  # not the delete buckets

    def test_another_4xx_dead_letters_as_downstream_rejected_without_burning_the_budget(self, purge_job, docstore):
        docstore.set_faults(status=403)
        result = job_run_slice(job_id=purge_job.pk)
        assert result.dead and result.error_category == FailureCategory.DOWNSTREAM_REJECTED
        purge_job.refresh_from_db()
        assert purge_job.attempt == 0
        assert DeadLetter.objects.get().category == FailureCategory.DOWNSTREAM_REJECTED

    def test_a_refused_connection_is_retried_with_backoff(self, purge_job, docstore, settings):
        docstore.stop()  # nothing listens on that loopback port any more
        result = job_run_slice(job_id=purge_job.pk)
        assert result.error_category == FailureCategory.DOWNSTREAM_UNAVAILABLE
        purge_job.refresh_from_db()
        assert (purge_job.state, purge_job.attempt) == (JobState.PENDING, 1)
        assert purge_job.available_at > NOW - timedelta(seconds=1)

    def test_a_paused_portfolio_sends_no_purge(self, purge_job, docstore, portfolio):
        pipeline_pause(actor=None, reason="store maintenance tonight", portfolio_id=portfolio.pk)
        assert job_run_slice(job_id=purge_job.pk).leased is False
        assert docstore.requests() == []

    def test_without_a_configured_store_the_purge_dead_letters_as_policy_or_input(self, purge_job, settings):
        settings.DOCSTORE_URL = ""
        result = job_run_slice(job_id=purge_job.pk)
        assert result.dead and result.error_category == FailureCategory.POLICY_OR_INPUT
        assert DeadLetter.objects.get().error_class == "DocstoreNotConfigured"


@WALL_CLOCK
@pytest.mark.django_db(transaction=True)
def test_four_workers_keep_the_store_under_the_configured_request_rate(docstore, settings, active_policy):
    rate = 10.0
    settings.DOCSTORE_RATE_GLOBAL = rate
    settings.DOCSTORE_BURST_GLOBAL = 1.0
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 4
    settings.CLEANUP_TOKEN_WAIT_SECONDS = 0.5
    portfolio = Portfolio.objects.create(name="Rates", slug="rates")
    prop = Property.objects.create(portfolio=portfolio, name="Tower")
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", 40, ended=OLD)
    documents = attach(Lease, ids)
    docstore.create(*documents)
    sweep_trigger(slot=timezone.now().replace(second=0, microsecond=0))
    job_run_slice(job_id=delete_job().pk, batch_size=5, max_batches=100)
    assert len(purge_jobs()) == 8

    errors: list[BaseException] = []
    deadline = time.monotonic() + 60

    def worker(n: int) -> None:
        try:
            while time.monotonic() < deadline:
                if not CleanupJob.objects.filter(job_kind=JobKind.PURGE, state__in=["pending", "leased"]).exists():
                    return
                due = fair_due_job_ids(now=timezone.now(), limit=4, exclude_enqueued=False)
                if not due:
                    time.sleep(0.05)
                    continue
                job_run_slice(job_id=due[n % len(due)], owner=f"worker-{n}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert docstore.documents() == set()
    assert all(job.outcome == JobOutcome.PURGED for job in purge_jobs())
    times = sorted(r["at"] for r in docstore.requests())
    assert len(times) == 40
    # Burst 1: n requests need at least (n - 1) / rate seconds between the first and the last.
    assert (len(times) - 1) / (times[-1] - times[0]) <= rate * 1.05
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= rate * 1.05 + 1
