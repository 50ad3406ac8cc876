"""Downstream purge: what a purge must not delete or fetch.

A hold placed after admission or after the batch, a remaining record naming
the same document, and a URL or path where a document id belongs — each
checked right before the DELETE, and on PostgreSQL a hold placed while a
purge is deciding or calling. Separate from ``tests/test_downstream_purge.py``
(the core purge path), whose world it shares (``tests/downstream_world.py``).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connections, transaction
from django.utils import timezone

from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import DeadLetter, JobOutcome, JobState, PurgeRequest
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, MaintenanceRecord, Portfolio, Property
from retention.services import legal_hold_place, legal_hold_release

from . import downstream_world
from .conftest import (
    backend_pid,
    hold_placed_during_a_purge_call,
    make_records,
    make_user,
    remaining_ids,
    utc,
    wait_until_blocked,
)
from .downstream_world import NOW, OLD, SLOT, attach, delete_job, purge_jobs

pytestmark = pytest.mark.django_db

# The fixtures the downstream modules share (tests/downstream_world.py).
clock = downstream_world.clock
leases_with_files = downstream_world.leases_with_files
purge_job = downstream_world.purge_job


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
        client.force_login(operator_user)  # two days on: the first login timed out idle (SessionIdleTimeout)
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
