"""Downstream purge: attachments removed from the document store through the outbox.

Every test that purges talks real HTTP to the demo store (``python -m
docstore``) on a free loopback port; the store's own request log (method,
path, key, arrival time, status, replayed) is the witness of what left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from email.utils import format_datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
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
from retention.services import legal_hold_place, legal_hold_release

from .conftest import (
    backend_pid,
    hold_placed_during_a_purge_call,
    make_records,
    make_user,
    remaining_ids,
    utc,
    wait_until_blocked,
)

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "the document store is healthy again"
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def attach(model, ids: list[int], prefix: str = "doc") -> list[str]:  # type: ignore[no-untyped-def]
    """Give rows ``ids`` of ``model`` the document ids ``<prefix>-<id>``."""
    for record_id in ids:
        model.objects.filter(pk=record_id).update(document_id=f"{prefix}-{record_id}")
    return [f"{prefix}-{record_id}" for record_id in ids]


def delete_job() -> CleanupJob:
    return CleanupJob.objects.get(job_kind=JobKind.DELETE)


def purge_jobs() -> list[CleanupJob]:
    return list(CleanupJob.objects.filter(job_kind=JobKind.PURGE).order_by("id"))


@pytest.fixture
def leases_with_files(portfolio, prop, active_policy, clock):  # type: ignore[no-untyped-def]
    """Six expired leases, four of them with a file; the sweep is admitted."""
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", 6, ended=OLD)
    documents = attach(Lease, ids[:4])
    sweep_trigger(slot=SLOT, now=NOW)
    return ids, documents


@pytest.fixture
def purge_job(leases_with_files, docstore):  # type: ignore[no-untyped-def]
    """The records are deleted; one purge job for their four files waits."""
    _, documents = leases_with_files
    docstore.create(*documents)
    assert job_run_slice(job_id=delete_job().pk).outcome == JobOutcome.DELETED
    (job,) = purge_jobs()
    return job


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
        self, portfolio, prop, active_policy, clock
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


class TestHoldsAndInjection:
    def test_a_hold_placed_after_admission_leaves_the_records_and_their_files_untouched(
        self, leases_with_files, docstore, prop, portfolio, reviewer
    ):
        ids, documents = leases_with_files
        docstore.create(*documents)
        legal_hold_place(portfolio=portfolio, property=prop, placed_by=reviewer, reason="litigation over the building")
        cleanup_drain()
        assert delete_job().outcome == JobOutcome.HELD
        assert remaining_ids(prop, "lease") == set(ids)
        assert not PurgeRequest.objects.exists() and not purge_jobs()
        assert docstore.documents() == set(documents)
        assert docstore.requests() == []

    def test_a_record_carrying_a_url_or_a_path_is_never_fetched(
        self, portfolio, prop, active_policy, clock, docstore, silent_listener
    ):
        port, seen = silent_listener
        active_policy(portfolio, "lease", 365)
        ids = make_records(prop, "lease", 4, ended=OLD)
        injected = [f"http://127.0.0.1:{port}/steal", "../_admin/reset", "%2e%2e%2f_admin"]
        for record_id, value in zip(ids, [*injected, "signed-lease-1"], strict=True):
            Lease.objects.filter(pk=record_id).update(document_id=value)
        docstore.create("signed-lease-1")
        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()
        request = PurgeRequest.objects.get()
        assert (request.document_ids, request.invalid_ids) == (["signed-lease-1"], 3)
        assert all(value not in json.dumps(request.document_ids) for value in injected)
        (job,) = purge_jobs()
        assert job.state == JobState.DEAD
        assert DeadLetter.objects.get(job=job).category == FailureCategory.POLICY_OR_INPUT
        assert [r["path"] for r in docstore.requests()] == ["/documents/signed-lease-1"]
        assert docstore.requests("POST") == [] and docstore.requests("GET") == []
        time.sleep(0.2)
        assert seen == []

    def test_a_payload_carrying_a_url_is_rejected_before_any_request(
        self, purge_job, docstore, silent_listener, settings
    ):
        port, seen = silent_listener
        PurgeRequest.objects.filter(pk=purge_job.purge_request_id).update(
            document_ids=[f"http://127.0.0.1:{port}/x", f"//127.0.0.1:{port}/y", "a/../../b"]
        )
        result = job_run_slice(job_id=purge_job.pk)
        assert result.dead and result.error_category == FailureCategory.POLICY_OR_INPUT
        assert docstore.requests() == []
        time.sleep(0.2)
        assert seen == []

    def test_a_redirect_from_the_store_is_not_followed(self, purge_job, docstore, silent_listener):
        port, seen = silent_listener
        docstore.set_faults(redirect=f"http://127.0.0.1:{port}/elsewhere")
        result = job_run_slice(job_id=purge_job.pk)
        assert result.dead and result.error_category == FailureCategory.DOWNSTREAM_REJECTED
        assert [r["status"] for r in docstore.requests()] == [307]
        time.sleep(0.2)
        assert seen == []


class TestHoldsAndReferencesAtPurgeTime:
    """Each document is checked right before its DELETE: holds over the deleted
    records' scope, and remaining records naming the same document."""

    def test_a_document_a_remaining_record_of_any_kind_still_names_is_skipped_counted_and_never_deleted(
        self, leases_with_files, docstore, prop, portfolio
    ):
        _, documents = leases_with_files
        docstore.create(*documents)
        # A lease that is not expired shares one file; an open work order (another kind) another.
        common = {"portfolio": portfolio, "property": prop}
        Lease.objects.create(**common, unit="9", tenant_name="T", started_on=NOW.date(), document_id=documents[1])
        MaintenanceRecord.objects.create(**common, summary="s", opened_at=NOW, document_id=documents[2])
        assert job_run_slice(job_id=delete_job().pk).outcome == JobOutcome.DELETED
        (job,) = purge_jobs()
        result = job_run_slice(job_id=job.pk)
        assert result.outcome == JobOutcome.PURGED and result.documents_purged == 2
        assert docstore.documents() == {documents[1], documents[2]}
        assert [r["path"] for r in docstore.requests()] == [f"/documents/{d}" for d in (documents[0], documents[3])]
        request = PurgeRequest.objects.get()
        assert (request.documents_purged, request.documents_referenced, request.documents_held) == (2, 2, 0)

    def test_a_hold_placed_after_the_batch_sets_the_files_aside_until_a_sweep_after_its_release(
        self, purge_job, docstore, prop, portfolio, reviewer, operator_user, clock
    ):
        request = purge_job.purge_request
        documents = list(request.document_ids)
        hold = legal_hold_place(portfolio=portfolio, property=prop, placed_by=reviewer, reason="litigation, late")
        result = job_run_slice(job_id=purge_job.pk)
        assert result.outcome == JobOutcome.PURGE_HELD and result.documents_purged == 0
        assert docstore.requests() == [] and docstore.documents() == set(documents)
        request.refresh_from_db()
        assert (request.documents_held, request.held_document_ids, request.documents_purged) == (4, documents, 0)
        purge_job.refresh_from_db()
        assert (purge_job.state, purge_job.outcome) == (JobState.DONE, JobOutcome.PURGE_HELD)
        first_sweep = purge_job.sweep
        first_sweep.refresh_from_db()
        assert first_sweep.status == first_sweep.Status.DRAINED

        # The sweep report and the proof show the files set aside.
        from django.test import Client

        client = Client()
        client.force_login(operator_user)
        page = client.get(f"/console/sweeps/{first_sweep.pk}/").content.decode()
        table = page[page.index('data-testid="attachments"') :]
        cells = [cell.split("</td>")[0] for cell in table.split('<td class="num">')[1:7]]
        assert cells == ["0", "0", "4", "4", "0", "0"]  # purged, gone, set aside, awaiting release, referenced, invalid
        assert "Attachments set aside under a legal hold" in page  # the purge job's outcome
        proof = client.get(f"/console/sweeps/{first_sweep.pk}/proof.json").json()
        assert proof["attachments"]["documents_set_aside_under_hold"] == 4
        assert proof["attachments"]["documents_awaiting_hold_release"] == 4
        assert JobOutcome.PURGE_HELD in {row["outcome"] for row in proof["partitions"]}
        csv = client.get(f"/console/sweeps/{first_sweep.pk}/proof.csv").content.decode()
        assert "documents_set_aside_under_hold 4 documents_awaiting_hold_release 4" in csv
        assert not any(d in json.dumps(proof) + csv for d in documents)  # counts only, never a document id

        # A later sweep while the hold is active hands nothing on.
        clock.move_to(utc("2026-08-22T02:05:00Z"), tick=False)
        assert sweep_trigger(slot=utc("2026-08-22T02:00:00Z")).purges_requeued == 0
        assert len(purge_jobs()) == 1

        legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="the case settled")
        clock.move_to(utc("2026-08-23T02:05:00Z"), tick=False)
        later = sweep_trigger(slot=utc("2026-08-23T02:00:00Z"))
        assert later.purges_requeued == 1 and later.sweep.status == later.sweep.Status.RUNNING
        _, again = purge_jobs()
        assert again.sweep_id == later.sweep.pk
        retry = again.purge_request
        assert (retry.origin_id, retry.document_ids, retry.key != request.key) == (request.pk, documents, True)
        request.refresh_from_db()
        assert request.held_document_ids == [] and request.documents_held == 4  # the history stays

        cleanup_drain()
        assert docstore.documents() == set()
        assert [r["key"] for r in docstore.requests()] == [f"{retry.key}:{d}" for d in documents]
        again.refresh_from_db()
        assert again.outcome == JobOutcome.PURGED
        later.sweep.refresh_from_db()
        assert later.sweep.status == later.sweep.Status.DRAINED
        proof = client.get(f"/console/sweeps/{later.sweep.pk}/proof.json").json()
        assert proof["attachments"]["documents_purged"] == 4
        assert proof["attachments"]["documents_set_aside_under_hold"] == 0
        # Handed on once: a further sweep finds nothing waiting.
        clock.move_to(utc("2026-08-24T02:05:00Z"), tick=False)
        assert sweep_trigger(slot=utc("2026-08-24T02:00:00Z")).purges_requeued == 0

    @pytest.mark.parametrize("scope", ["portfolio", "kind"])
    def test_a_portfolio_or_record_kind_hold_placed_after_the_batch_sets_the_files_aside_too(
        self, purge_job, docstore, portfolio, reviewer, scope
    ):
        narrowing = {"record_kind": "lease"} if scope == "kind" else {}
        legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="regulator inquiry", **narrowing)
        assert job_run_slice(job_id=purge_job.pk).outcome == JobOutcome.PURGE_HELD
        assert docstore.requests() == []

    def test_a_hold_elsewhere_or_on_another_kind_does_not_stop_the_purge(
        self, purge_job, docstore, portfolio, reviewer, prop
    ):
        other = Property.objects.create(portfolio=portfolio, name="Annex")
        legal_hold_place(portfolio=portfolio, property=other, placed_by=reviewer, reason="another building")
        legal_hold_place(
            portfolio=portfolio, record_kind="maintenance_record", placed_by=reviewer, reason="claims for the tests"
        )
        elsewhere = Portfolio.objects.create(name="Elsewhere", slug="elsewhere")
        legal_hold_place(portfolio=elsewhere, placed_by=reviewer, reason="another customer")
        assert job_run_slice(job_id=purge_job.pk).outcome == JobOutcome.PURGED
        assert docstore.documents() == set()

    def test_a_record_hold_cannot_name_a_deleted_record_and_one_written_anyway_keeps_that_records_file(
        self, purge_job, docstore, portfolio, prop, reviewer, leases_with_files
    ):
        from django.core.exceptions import ValidationError

        from retention.models import LegalHold

        ids, _ = leases_with_files
        with pytest.raises(ValidationError) as info:
            legal_hold_place(
                portfolio=portfolio, record_kind="lease", record_id=ids[0], placed_by=reviewer, reason="x for the tests"
            )
        assert "record_id" in info.value.message_dict
        # A hold on a record that still exists (elsewhere) does not stop this purge…
        survivor = make_records(prop, "lease", 1, ended=NOW)[0]
        legal_hold_place(
            portfolio=portfolio, record_kind="lease", record_id=survivor, placed_by=reviewer, reason="y for the tests"
        )
        # …but one written by other means (before the check existed) on a deleted record does.
        LegalHold.objects.create(
            portfolio=portfolio,
            record_kind="lease",
            record_id=ids[0],
            reason="legacy for the tests",
            placed_by=reviewer,
            placed_at=NOW,
        )
        assert job_run_slice(job_id=purge_job.pk).outcome == JobOutcome.PURGE_HELD
        # The outbox knows which record named which file: only the held record's stays.
        assert docstore.documents() == {f"doc-{ids[0]}"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
class TestPurgeAndHoldRace:
    """The purge's check takes the scope lock a batch takes; on PostgreSQL it holds it across the call."""

    @pytest.fixture
    def world(self, docstore, active_policy, time_machine):  # type: ignore[no-untyped-def]
        portfolio = Portfolio.objects.create(name="Race", slug="race")
        prop = Property.objects.create(portfolio=portfolio, name="Tower")
        active_policy(portfolio, "lease", 365)
        documents = attach(Lease, make_records(prop, "lease", 4, ended=OLD))
        docstore.create(*documents)
        sweep_trigger(slot=timezone.now().replace(second=0, microsecond=0))
        assert job_run_slice(job_id=delete_job().pk).outcome == JobOutcome.DELETED
        (job,) = purge_jobs()
        reviewer = make_user("race-reviewer", "compliance_reviewer")
        return job, prop, reviewer, documents

    def test_a_purge_waits_for_a_hold_being_placed_and_then_sets_the_files_aside(self, world, docstore):
        job, prop, reviewer, documents = world
        hold_open, commit_hold, purge_started = threading.Event(), threading.Event(), threading.Event()
        pids: dict[str, int] = {}
        results: list = []
        errors: list[BaseException] = []

        def place_hold_and_wait() -> None:
            try:
                pids["hold"] = backend_pid()
                with transaction.atomic():
                    legal_hold_place(
                        portfolio=prop.portfolio, property=prop, placed_by=reviewer, reason="late for the tests"
                    )
                    hold_open.set()
                    assert commit_hold.wait(20)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        def purge() -> None:
            try:
                pids["purge"] = backend_pid()
                purge_started.set()
                results.append(job_run_slice(job_id=job.pk, owner="purger"))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        holder = threading.Thread(target=place_hold_and_wait)
        holder.start()
        purger = None
        try:
            assert hold_open.wait(10)
            purger = threading.Thread(target=purge)
            purger.start()
            assert purge_started.wait(10)
            assert wait_until_blocked(pids["purge"], by=pids["hold"]) == [("transactionid", "ShareLock")]
        finally:
            commit_hold.set()
            holder.join(20)
            if purger is not None:
                purger.join(30)
        assert errors == []
        assert results[0].outcome == JobOutcome.PURGE_HELD
        assert docstore.requests() == [] and docstore.documents() == set(documents)

    def test_a_hold_placed_while_a_delete_is_in_flight_waits_for_it_and_keeps_the_rest(self, world, docstore):
        job, prop, reviewer, documents = world
        docstore.set_faults(hang_after_apply=3.0, count=1)  # the first DELETE is applied, then answered late

        def one_delete_sent() -> None:
            assert [r["path"] for r in docstore.requests()] == [f"/documents/{documents[0]}"]

        # The store logs the DELETE when it applies it, before its late answer.
        hold_placed_during_a_purge_call(
            job_id=job.pk, prop=prop, reviewer=reviewer, call_sent=docstore.requests, check_call=one_delete_sent
        )
        # The document in flight went before the hold; the rest wait for its release.
        assert job_run_slice(job_id=job.pk, owner="next").outcome == JobOutcome.PURGE_HELD
        request = PurgeRequest.objects.get()
        assert (request.documents_purged, request.documents_held, request.held_document_ids) == (1, 3, documents[1:])
        assert docstore.documents() == set(documents[1:])


@pytest.mark.postgres
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


class TestStoreAndSettings:
    def test_the_store_answers_429_with_retry_after_from_its_own_rate_limit(self, docstore_factory):
        from cleanup_ops.downstream.client import DocstoreClient
        from cleanup_ops.recovery.classification import DownstreamError

        store = docstore_factory("--rate", "1", "--burst", "1")
        store.create("a", "b")
        with DocstoreClient() as client:
            assert client.delete_document("a", idempotency_key="k-a") == "deleted"
            with pytest.raises(DownstreamError) as raised:
                client.delete_document("b", idempotency_key="k-b")
        assert raised.value.status == 429 and raised.value.retry_after == "1"
        assert [r["status"] for r in store.requests()] == [204, 429]

    def test_an_invalid_document_id_never_becomes_a_request(self, docstore):
        from cleanup_ops.downstream.client import DocstoreClient, InvalidDocumentId

        with DocstoreClient() as client:
            for bad in ["", "x" * 65, "../x", "a b", "http://127.0.0.1/", "a%2Fb", "a\nb"]:
                with pytest.raises(InvalidDocumentId):
                    client.delete_document(bad, idempotency_key="k")
        assert docstore.requests() == []

    @pytest.mark.parametrize(
        ("name", "value", "fragment"),
        [
            ("DOCSTORE_URL", "ftp://127.0.0.1/", "scheme 'ftp'"),
            ("DOCSTORE_URL", "http://docs.example.com/", "host 'docs.example.com'"),
            ("DOCSTORE_URL", "http://user:pw@127.0.0.1/", "credentials"),
            ("DOCSTORE_URL", "http://127.0.0.1:99999/", "not a valid URL"),
            ("DOCSTORE_URL", "http://127.0.0.1:8765/?next=http://x", "query"),
            ("DOCSTORE_READ_TIMEOUT", "120", "CLEANUP_LEASE_SECONDS"),
            ("DOCSTORE_RATE_GLOBAL", "fast", "expected a number"),
        ],
    )
    def test_a_bad_store_setting_stops_start_up_naming_the_variable(self, name, value, fragment):
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DEBUG"}}
        env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "x" * 50, name: value})
        done = subprocess.run(
            [sys.executable, "-c", "import django; django.setup(); print('started')"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0 and "started" not in done.stdout
        assert f"{name}: " in done.stderr and fragment in done.stderr

    def test_a_url_changed_at_run_time_is_checked_against_the_allowlist_again(self, settings):
        from cleanup_ops.downstream.client import DocstoreClient, DocstoreNotConfigured

        settings.DOCSTORE_URL = "http://203.0.113.7:8765"
        with pytest.raises(DocstoreNotConfigured, match="DOCSTORE_ALLOWED_HOSTS"):
            DocstoreClient()

    def test_seed_attachments_uploads_files_and_cleanup_drain_reports_the_purges(
        self, portfolio, prop, active_policy, clock, docstore
    ):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 10, ended=OLD)
        out = StringIO()
        call_command("seed_attachments", "--fraction", "1", "--seed", "1", stdout=out)
        assert "Uploaded 10 attachments" in out.getvalue()
        assert docstore.documents() == set(Lease.objects.values_list("document_id", flat=True))
        sweep_trigger(slot=SLOT, now=NOW)
        out = StringIO()
        call_command("cleanup_drain", "--json", stdout=out)
        summary = json.loads(out.getvalue().strip().splitlines()[-1])
        assert summary["purges"]["documents_purged"] == 10
        assert summary["purges"]["purge_jobs_by_state"]["done"] == 1
        assert summary["jobs_by_outcome"]["purged"] == 1
        assert docstore.documents() == set()

    def test_seed_attachments_rejects_a_bad_fraction_naming_the_flag(self, docstore):
        from django.core.management.base import CommandError

        with pytest.raises(CommandError, match="--fraction"):
            call_command("seed_attachments", "--fraction", "2")
        assert not Lease.objects.exclude(document_id=None).exists()
