"""Attachments in Django storages: a kind whose files are in ``STORAGES[alias]``
(S3 through django-storages' ``S3Storage``, against moto's server over real
HTTP; the file system in a temporary directory) is purged through the same
protocol as the HTTP document store: one decision per document under its
lock, holds and living references re-read after the locks, ``DeleteObjects``
for a batch of keys, S3's ``SlowDown`` as a rate signal with backoff, and a
key that cannot be purged named, with its record and kind, in a dead letter.

Between the product and moto sits ``harness.s3.S3Proxy``, a loopback proxy
that counts the S3 operations it forwards and can answer ``503 SlowDown``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import storages

from cleanup_ops.console_selectors.letters import documents_affected
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    DeletedAttachment,
    DispositionState,
    DocumentDisposition,
    JobKind,
    JobOutcome,
    JobState,
    PurgeRequest,
)
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.schedule import sweep_trigger
from harness.s3 import S3Proxy, S3Server, s3_client, storage_options
from properties.models import Property
from retention.checks import check_kind
from retention.registry import DEFAULT_RECORD_KINDS, get_spec, registry_reload
from retention.services import legal_hold_place
from tests.schema_b.models import SignedContract

from .conftest import utc

pytestmark = pytest.mark.django_db

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2026-01-10T12:00:00Z")  # signed long before the 30-day cutoff
YOUNG = utc("2026-08-15T12:00:00Z")
CONTRACT = {
    "model": "schema_b.SignedContract",
    "label": "Signed contract",
    "timestamp": "signed_at",
    "portfolio": "customer",
    "property": "building",
    "attachment": {"field": "pdf", "storage": "contracts"},
}
# 600 characters, 1,200 bytes of UTF-8: fits the field, not an S3 key.
TOO_LONG = "contracts/" + "é" * 600 + ".pdf"


@pytest.fixture(scope="module")
def moto():  # type: ignore[no-untyped-def]
    with S3Server() as server:
        yield server


@pytest.fixture
def s3(moto, request):  # type: ignore[no-untyped-def]
    """A fresh bucket behind a counting proxy."""
    bucket = f"contracts-{abs(hash(request.node.name)) % 10**8}"
    s3_client(moto.endpoint).create_bucket(Bucket=bucket)
    with S3Proxy(moto.endpoint) as proxy:
        proxy.bucket = bucket  # type: ignore[attr-defined]
        yield proxy


def bucket_keys(s3) -> set[str]:  # type: ignore[no-untyped-def]
    client = s3_client(s3.upstream.geturl())
    return {o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])}


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def contracts_kind(settings, storage: dict) -> None:  # type: ignore[type-arg]
    settings.STORAGES = {**settings.STORAGES, "contracts": storage}
    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, "signed_contract": CONTRACT}
    registry_reload()


@pytest.fixture
def on_s3(settings, s3):  # type: ignore[no-untyped-def]
    contracts_kind(
        settings,
        {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": storage_options(s3.endpoint, s3.bucket)},
    )
    yield s3
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


@pytest.fixture
def on_disk(settings, tmp_path):  # type: ignore[no-untyped-def]
    root = tmp_path / "contracts"
    root.mkdir()
    contracts_kind(
        settings,
        {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(root)}},
    )
    yield root
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


def contract(prop: Property, signed_at, name: str = "", *, upload: bool = True) -> int:  # type: ignore[no-untyped-def]
    """A contract record; its file saved through the storage under ``name`` when given."""
    if name and upload:
        saved = storages["contracts"].save(name, ContentFile(b"%PDF-1.7 signed"))
        assert saved == name
    return SignedContract.objects.create(customer_id=prop.portfolio_id, building=prop, signed_at=signed_at, pdf=name).pk


def the_purge_request() -> PurgeRequest:
    return PurgeRequest.objects.get(record_kind="signed_contract")


def the_purge_job() -> CleanupJob:
    return CleanupJob.objects.get(job_kind=JobKind.PURGE, record_kind="signed_contract")


@pytest.mark.usefixtures("clock")
class TestS3:
    def test_a_sweep_and_drain_remove_the_deleted_contracts_files_from_the_bucket_in_one_delete_objects_call(
        self, on_s3, portfolio, prop, active_policy, reviewer
    ):
        active_policy(portfolio, "signed_contract", 30)
        gone = ["contracts/2024/05/a.pdf", "contracts/2024/05/b c.pdf", "scans/2023/x+y=z.pdf"]
        for name in gone:
            contract(prop, OLD, name)
        held = contract(prop, OLD, "contracts/2024/06/held.pdf")
        contract(prop, YOUNG, "contracts/2026/08/young.pdf")
        contract(prop, OLD, "shared/master.pdf")  # expired, but a living record names the same file
        contract(prop, YOUNG, "shared/master.pdf", upload=False)
        contract(prop, OLD)  # expired, no file
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="signed_contract",
            record_id=held,
            placed_by=reviewer,
            reason="a claim over this contract",
        )
        on_s3.reset()

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        assert bucket_keys(on_s3) == {"contracts/2024/06/held.pdf", "contracts/2026/08/young.pdf", "shared/master.pdf"}
        assert on_s3.calls["DeleteObjects"] == 1 and on_s3.keys_per_delete_objects == [3]
        assert on_s3.calls["DeleteObject"] == 0
        request = the_purge_request()
        assert request.store == "contracts"
        assert (request.documents_purged, request.documents_referenced, request.invalid_ids) == (3, 1, 0)
        # Keys kept exactly, under the storage's alias.
        assert set(request.document_ids) == {f"contracts:{name}" for name in [*gone, "shared/master.pdf"]}
        assert DocumentDisposition.objects.get(document_id="contracts:contracts/2024/05/a.pdf").state == "purged"
        assert the_purge_job().outcome == JobOutcome.PURGED

    def test_a_hold_placed_after_the_batch_sets_the_file_aside_and_one_the_bucket_no_longer_has_is_absent(
        self, on_s3, portfolio, prop, active_policy, reviewer
    ):
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/kept.pdf")
        contract(prop, OLD, "contracts/lost.pdf")
        sweep_trigger(slot=SLOT, now=NOW)
        delete = CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract")
        assert job_run_slice(job_id=delete.pk).outcome == JobOutcome.DELETED
        # A record-level hold cannot name a deleted record: the kind's, on the property.
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="signed_contract",
            placed_by=reviewer,
            reason="a claim raised after the deletion",
        )
        s3_client(on_s3.upstream.geturl()).delete_object(Bucket=on_s3.bucket, Key="contracts/lost.pdf")
        on_s3.reset()

        cleanup_drain()

        assert bucket_keys(on_s3) == {"contracts/kept.pdf"}
        assert on_s3.calls["DeleteObjects"] == 0 and on_s3.calls["HeadObject"] == 2
        request = the_purge_request()
        assert (request.documents_held, request.documents_absent, request.held_document_ids) == (
            1,
            1,
            ["contracts:contracts/kept.pdf"],
        )
        states = dict(DocumentDisposition.objects.values_list("document_id", "state"))
        assert states == {
            "contracts:contracts/kept.pdf": DispositionState.SET_ASIDE,
            "contracts:contracts/lost.pdf": DispositionState.PURGED,
        }
        assert the_purge_job().outcome == JobOutcome.PURGE_HELD

    def test_a_key_that_cannot_be_purged_becomes_a_dead_letter_naming_the_kind_and_the_record(
        self, on_s3, portfolio, prop, active_policy
    ):
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/fine.pdf")
        too_long = contract(prop, OLD, TOO_LONG, upload=False)
        blank = contract(prop, OLD, "   ", upload=False)
        on_s3.reset()

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        assert bucket_keys(on_s3) == set()  # the purgeable one went
        assert on_s3.keys_per_delete_objects == [1]  # the others were never sent
        request = the_purge_request()
        assert request.document_ids == ["contracts:contracts/fine.pdf"]
        assert sorted((e["record_id"], e["problem"]) for e in request.unpurgeable) == sorted(
            [(too_long, "too_long"), (blank, "empty")]
        )
        assert not DeletedAttachment.objects.filter(record_id__in=[too_long, blank]).exists()
        letter = DeadLetter.objects.get(job__purge_request=request)
        assert (letter.category, letter.error_class, letter.record_kind) == (
            FailureCategory.POLICY_OR_INPUT,
            "UnpurgeableDocuments",
            "signed_contract",
        )
        affected = documents_affected(letter.job)
        assert (affected.purged, sorted(affected.unpurgeable_records)) == (1, sorted([too_long, blank]))
        # The key itself is in no letter, log field or count: only the record ids.
        assert TOO_LONG not in str(request.unpurgeable)

    def test_slow_down_is_a_rate_signal_the_purge_backs_off_from_and_then_finishes(
        self, on_s3, portfolio, prop, active_policy, clock
    ):
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/2024/a.pdf")
        contract(prop, OLD, "contracts/2024/b.pdf")
        sweep_trigger(slot=SLOT, now=NOW)
        delete = CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract")
        job_run_slice(job_id=delete.pk)
        on_s3.reset()
        on_s3.fail("DeleteObjects", times=2)

        job = the_purge_job()
        for attempt in (1, 2):
            job_run_slice(job_id=job.pk)
            job.refresh_from_db()
            assert (job.state, job.attempt, job.last_error_category) == (
                JobState.PENDING,
                attempt,
                FailureCategory.DOWNSTREAM_THROTTLED,
            )
            assert job.available_at > NOW  # backoff, not an immediate retry
            assert bucket_keys(on_s3) == {"contracts/2024/a.pdf", "contracts/2024/b.pdf"}
            clock.move_to(job.available_at + timedelta(seconds=1), tick=False)
        job_run_slice(job_id=job.pk)

        job.refresh_from_db()
        assert (job.state, job.outcome) == (JobState.DONE, JobOutcome.PURGED)
        assert bucket_keys(on_s3) == set()
        # Each attempt is one call: botocore retried nothing on its own.
        assert on_s3.calls["DeleteObjects"] == 3
        assert the_purge_request().documents_purged == 2

    def test_a_key_the_bucket_refuses_in_the_delete_objects_answer_names_its_record_and_the_others_go(
        self, on_s3, portfolio, prop, active_policy
    ):
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/a.pdf")
        locked = contract(prop, OLD, "contracts/locked.pdf")
        contract(prop, OLD, "contracts/c.pdf")
        on_s3.reset()
        on_s3.fail_key("contracts/locked.pdf", code="AccessDenied")

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        assert bucket_keys(on_s3) == {"contracts/locked.pdf"}
        assert on_s3.keys_per_delete_objects == [3]
        request = the_purge_request()
        assert (request.documents_purged, request.unpurgeable) == (
            2,
            [{"record_id": locked, "problem": "refused:AccessDenied"}],
        )
        assert DocumentDisposition.objects.get(document_id="contracts:contracts/locked.pdf").state == "pending"
        letter = DeadLetter.objects.get(job__purge_request=request)
        assert (letter.category, letter.record_kind) == (FailureCategory.POLICY_OR_INPUT, "signed_contract")
        assert documents_affected(letter.job).unpurgeable_records == (locked,)

    def test_a_per_key_slow_down_records_the_keys_before_it_and_retries_only_what_is_left(
        self, on_s3, portfolio, prop, active_policy, clock
    ):
        active_policy(portfolio, "signed_contract", 30)
        for name in ("contracts/a.pdf", "contracts/b.pdf", "contracts/c.pdf"):
            contract(prop, OLD, name)
        sweep_trigger(slot=SLOT, now=NOW)
        job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract").pk)
        request = the_purge_request()
        second = request.document_ids[1].split(":", 1)[1]
        on_s3.reset()
        on_s3.fail_key(second, code="SlowDown")

        job = the_purge_job()
        job_run_slice(job_id=job.pk)
        job.refresh_from_db()
        assert (job.state, job.cursor, job.last_error_category) == (
            JobState.PENDING,
            1,
            FailureCategory.DOWNSTREAM_THROTTLED,
        )
        assert bucket_keys(on_s3) == {second}  # the call deleted the others; only the first is past the cursor
        clock.move_to(job.available_at + timedelta(seconds=1), tick=False)
        job_run_slice(job_id=job.pk)

        job.refresh_from_db()
        assert (job.state, job.outcome) == (JobState.DONE, JobOutcome.PURGED)
        assert bucket_keys(on_s3) == set()
        # The retry sent only the key left; the third was found purged by this request.
        assert on_s3.keys_per_delete_objects == [3, 1]
        request.refresh_from_db()
        assert (request.documents_purged, request.documents_absent) == (3, 0)

    def test_a_call_that_timed_out_after_s3_applied_it_is_recorded_from_what_s3_has(
        self, on_s3, portfolio, prop, active_policy, settings
    ):
        settings.STORAGE_PURGE_READ_TIMEOUT = 0.5
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/a.pdf")
        contract(prop, OLD, "contracts/b.pdf")
        sweep_trigger(slot=SLOT, now=NOW)
        job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract").pk)
        on_s3.reset()
        on_s3.answer_late("DeleteObjects", seconds=2.0)

        job = the_purge_job()
        job_run_slice(job_id=job.pk)

        job.refresh_from_db()
        # The client gave up at its read timeout, asked S3 (HEAD) and found both gone.
        assert (job.state, job.outcome, job.attempt) == (JobState.DONE, JobOutcome.PURGED, 0)
        assert (on_s3.calls["DeleteObjects"], on_s3.calls["HeadObject"]) == (1, 2)
        assert the_purge_request().documents_purged == 2

    def test_per_file_mode_sends_one_call_per_file(self, on_s3, portfolio, prop, active_policy, settings):
        settings.STORAGE_PURGE_BATCH_SIZE = 1
        active_policy(portfolio, "signed_contract", 30)
        for i in range(4):
            contract(prop, OLD, f"contracts/{i}.pdf")
        on_s3.reset()

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        assert bucket_keys(on_s3) == set()
        assert on_s3.keys_per_delete_objects == [1, 1, 1, 1]
        assert the_purge_request().documents_purged == 4


@pytest.mark.usefixtures("clock")
class TestFileSystem:
    def test_the_file_system_storage_loses_the_deleted_records_files_and_keeps_the_held_and_living_ones(
        self, on_disk, portfolio, prop, active_policy, reviewer
    ):
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/2024/05/a.pdf")
        held = contract(prop, OLD, "contracts/2024/05/held.pdf")
        contract(prop, YOUNG, "contracts/2026/young.pdf")
        traversal = contract(prop, OLD, "../outside.pdf", upload=False)
        (on_disk.parent / "outside.pdf").write_bytes(b"not the storage's")
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="signed_contract",
            record_id=held,
            placed_by=reviewer,
            reason="a claim over this contract",
        )

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        files = {str(p.relative_to(on_disk)) for p in on_disk.rglob("*.pdf")}
        assert files == {"contracts/2024/05/held.pdf", "contracts/2026/young.pdf"}
        assert (on_disk.parent / "outside.pdf").exists()  # refused by the storage, never touched
        request = the_purge_request()
        assert (request.documents_purged, request.unpurgeable) == (
            1,
            [{"record_id": traversal, "problem": "refused_by_storage"}],
        )
        letter = DeadLetter.objects.get(job__purge_request=request)
        assert (letter.category, letter.record_kind) == (FailureCategory.POLICY_OR_INPUT, "signed_contract")

    def test_a_file_already_gone_from_the_disk_counts_as_absent(self, on_disk, portfolio, prop, active_policy):
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, "contracts/gone.pdf")
        (on_disk / "contracts" / "gone.pdf").unlink()

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        request = the_purge_request()
        assert (request.documents_purged, request.documents_absent) == (0, 1)
        assert the_purge_job().outcome == JobOutcome.PURGED


class TestChecks:
    def test_a_storage_alias_that_is_not_in_storages_is_refused_naming_the_setting_the_kind_and_the_alias(self):
        entry = {**CONTRACT, "attachment": {"field": "pdf", "storage": "archive"}}
        (problem,) = check_kind("signed_contract", entry)
        assert problem.id == "retention.E007"
        assert "RETENTION_RECORD_KINDS['signed_contract']['attachment']" in problem.msg
        assert "'archive'" in problem.msg and "STORAGES" in problem.msg

    def test_a_storage_backed_kind_takes_a_file_field_and_refuses_a_missing_one(self, settings):
        settings.STORAGES = {**settings.STORAGES, "contracts": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
        assert check_kind("signed_contract", CONTRACT) == []
        (problem,) = check_kind(
            "signed_contract", {**CONTRACT, "attachment": {"field": "scan", "storage": "contracts"}}
        )
        assert "SignedContract has no field 'scan'" in problem.msg

    def test_without_storage_a_file_field_is_still_refused_for_the_http_store(self):
        (problem,) = check_kind("signed_contract", {**CONTRACT, "attachment": {"field": "pdf"}})
        assert "not a CharField" in problem.msg

    def test_the_registry_reads_the_storage_alias(self, settings):
        settings.STORAGES = {**settings.STORAGES, "contracts": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
        settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, "signed_contract": CONTRACT}
        registry_reload()
        try:
            assert get_spec("signed_contract").attachment_storage == "contracts"
            assert get_spec("lease").attachment_storage is None
        finally:
            del settings.RETENTION_RECORD_KINDS
            registry_reload()


def test_the_reference_guard_takes_the_storage_documents_reference_when_a_record_starts_naming_a_key(
    on_disk, portfolio, prop
):
    from cleanup_ops.downstream.guard import guards_install

    assert "signed_contract" in guards_install()
    DocumentDisposition.objects.create(document_id="contracts:contracts/reused.pdf", state=DispositionState.PURGED)

    contract(prop, YOUNG, "contracts/reused.pdf", upload=False)

    # The key was named again: its (alias-qualified) decision starts afresh.
    assert DocumentDisposition.objects.get(document_id="contracts:contracts/reused.pdf").state == "pending"
    assert not DocumentDisposition.objects.filter(document_id="contracts/reused.pdf").exists()


@pytest.mark.django_db(transaction=True)
def test_a_hold_placed_while_a_delete_objects_is_in_flight_waits_for_it_and_keeps_the_rest(
    on_s3, active_policy, settings
):
    """S3 cannot refuse a late call: the decision's locks are held across a
    bounded one instead, so the hold queues behind them and the next batch is
    decided under it."""
    from django.utils import timezone

    from properties.models import Portfolio

    from .conftest import hold_placed_during_a_purge_call, make_user

    settings.STORAGE_PURGE_BATCH_SIZE = 2
    portfolio = Portfolio.objects.create(name="Race", slug="race")
    prop = Property.objects.create(portfolio=portfolio, name="Tower")
    active_policy(portfolio, "signed_contract", 30)
    names = [f"contracts/race/{i}.pdf" for i in range(4)]
    for name in names:
        contract(prop, OLD, name)
    sweep_trigger(slot=timezone.now().replace(second=0, microsecond=0))
    job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract").pk)
    job = the_purge_job()
    first_batch = {ref.split(":", 1)[1] for ref in the_purge_request().document_ids[:2]}
    reviewer = make_user("race-reviewer", "compliance_reviewer")
    on_s3.reset()
    on_s3.answer_late("DeleteObjects", seconds=3.0)  # applied by moto, answered late (within the read timeout)

    def two_keys_sent() -> None:
        assert on_s3.keys_per_delete_objects == [2]

    hold_placed_during_a_purge_call(
        job_id=job.pk,
        prop=prop,
        reviewer=reviewer,
        call_sent=lambda: on_s3.calls["DeleteObjects"],
        check_call=two_keys_sent,
    )
    # The batch in flight went before the hold; the rest is set aside under it.
    assert job_run_slice(job_id=job.pk, owner="next").outcome == JobOutcome.PURGE_HELD
    request = the_purge_request()
    assert (request.documents_purged, request.documents_held) == (2, 2)
    assert bucket_keys(on_s3) == set(names) - first_batch


@pytest.mark.django_db(transaction=True)
def test_a_purge_whose_session_ended_while_it_stalled_before_the_call_sends_nothing_and_decides_again(
    on_s3, active_policy, settings
):
    """The fence S3 cannot check: the decision's last statement runs on its
    own session right before the call, so a worker whose session (and locks)
    ended while it stalled sends nothing, and the next decision sees the hold
    that committed meanwhile."""
    from django.utils import timezone

    from properties.models import Portfolio

    from .conftest import make_user
    from .interleaving import CheckpointHold, InThread, poll, raw_connection

    settings.CLEANUP_CHECKPOINTS = frozenset({"purge.before_store_call"})
    portfolio = Portfolio.objects.create(name="Stall", slug="stall")
    prop = Property.objects.create(portfolio=portfolio, name="Tower")
    active_policy(portfolio, "signed_contract", 30)
    names = {"contracts/stall/a.pdf", "contracts/stall/b.pdf"}
    for name in sorted(names):
        contract(prop, OLD, name)
    sweep_trigger(slot=timezone.now().replace(second=0, microsecond=0))
    job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract").pk)
    job = the_purge_job()
    reviewer = make_user("stall-reviewer", "compliance_reviewer")
    on_s3.reset()

    hold = CheckpointHold("purge.before_store_call")
    worker = InThread(lambda: job_run_slice(job_id=job.pk, owner="stalled"), name="stalled")
    try:
        pid = hold.wait_for_worker(worker)
        observer = raw_connection()
        try:
            observer.execute("SELECT pg_terminate_backend(%s)", [pid])
            poll(
                lambda: not observer.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
                what="the stalled worker's backend to end",
            )
        finally:
            observer.close()
        legal_hold_place(portfolio=portfolio, property=prop, placed_by=reviewer, reason="placed during the stall")
    finally:
        hold.release()
        worker.join()
    settings.CLEANUP_CHECKPOINTS = frozenset()

    assert on_s3.calls["DeleteObjects"] == 0 and bucket_keys(on_s3) == names
    job.refresh_from_db()
    assert job.state == JobState.PENDING  # the failed attempt is retried (a transient database error)
    job.available_at = timezone.now()
    job.save(update_fields=["available_at"])
    assert job_run_slice(job_id=job.pk, owner="next").outcome == JobOutcome.PURGE_HELD
    assert on_s3.calls["DeleteObjects"] == 0 and bucket_keys(on_s3) == names
    assert the_purge_request().documents_held == 2


# --- Two spellings of one file (issue 37) ------------------------------------
# A record may spell its key other than the storage's own name of the file
# (``contracts//lease-17.pdf``: S3's clean_name and the file system's path()
# both make it ``contracts/lease-17.pdf``). Every check of the purge must
# compare the name the storage will act on, or the purge of one spelling
# deletes the file another spelling's record still names or a hold keeps.

CANONICAL = "contracts/lease-17.pdf"
DOUBLED = "contracts//lease-17.pdf"


@pytest.fixture(params=["s3", "file_system"])
def backend(request):  # type: ignore[no-untyped-def]
    """Either storage, and a test of whether it still has a file of a name."""
    if request.param == "s3":
        proxy = request.getfixturevalue("on_s3")
        return lambda name: name in bucket_keys(proxy)
    root = request.getfixturevalue("on_disk")
    return lambda name: (root / name).is_file()


def guard_install() -> None:
    """As the application's owner would: ``cleanup_reference_guard --install``."""
    from io import StringIO

    from django.core.management import call_command

    call_command("cleanup_reference_guard", "--install", stdout=StringIO())


@pytest.mark.usefixtures("clock")
class TestKeySpellings:
    def test_a_deleted_record_spelling_the_key_with_a_double_slash_leaves_the_file_a_living_held_record_names(
        self, backend, portfolio, prop, active_policy, reviewer
    ):
        active_policy(portfolio, "signed_contract", 30)
        guard_install()
        contract(prop, OLD, DOUBLED, upload=False)  # expired
        living = contract(prop, YOUNG, CANONICAL)  # living, and held
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="signed_contract",
            record_id=living,
            placed_by=reviewer,
            reason="a claim over the living contract",
        )

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        assert backend(CANONICAL), "the purge of the doubled spelling deleted the living record's file"
        request = the_purge_request()
        assert (request.documents_purged, request.documents_referenced) == (0, 1)
        # The request names the file as the storage does.
        assert request.document_ids == [f"contracts:{CANONICAL}"]

    def test_a_deleted_record_naming_the_key_leaves_the_file_a_living_record_spells_with_a_double_slash(
        self, backend, portfolio, prop, active_policy, reviewer
    ):
        active_policy(portfolio, "signed_contract", 30)
        guard_install()
        contract(prop, OLD, CANONICAL)  # expired
        living = contract(prop, YOUNG, DOUBLED, upload=False)  # living, held, the other spelling
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="signed_contract",
            record_id=living,
            placed_by=reviewer,
            reason="a claim over the living contract",
        )

        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()

        assert backend(CANONICAL), "the purge deleted the file a living record spells with a double slash"
        assert the_purge_request().documents_referenced == 1

    def test_a_hold_on_a_deleted_record_of_one_spelling_keeps_the_file_from_the_purge_of_the_other_spelling(
        self, backend, portfolio, prop, active_policy, reviewer
    ):
        """Two deleted records, in two properties, name one file by two
        spellings; a hold on one property after the deletion keeps the file
        from both purges: one document, one decision, one disposition row."""
        other = Property.objects.create(portfolio=portfolio, name="Dock Street")
        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, CANONICAL)
        contract(other, OLD, DOUBLED, upload=False)
        sweep_trigger(slot=SLOT, now=NOW)
        for delete in CleanupJob.objects.filter(job_kind=JobKind.DELETE, record_kind="signed_contract"):
            assert job_run_slice(job_id=delete.pk).outcome == JobOutcome.DELETED
        # Held where the canonical spelling was deleted; the other property's purge must see it.
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="signed_contract",
            placed_by=reviewer,
            reason="a claim raised after the deletion",
        )

        cleanup_drain()

        assert backend(CANONICAL), "the purge of the other spelling deleted a file a hold keeps"
        requests = PurgeRequest.objects.filter(record_kind="signed_contract")
        assert sorted(r.documents_held for r in requests) == [1, 1]
        assert {tuple(r.document_ids) for r in requests} == {(f"contracts:{CANONICAL}",)}
        assert list(DocumentDisposition.objects.values_list("document_id", "state")) == [
            (f"contracts:{CANONICAL}", DispositionState.SET_ASIDE)
        ]
        assert set(DeletedAttachment.objects.values_list("document_id", flat=True)) == {f"contracts:{CANONICAL}"}

    def test_rows_spelled_before_the_guard_are_warned_about_and_install_records_them(
        self, backend, portfolio, prop, active_policy
    ):
        from cleanup_ops.checks import check_document_spellings
        from cleanup_ops.models import DocumentSpelling

        active_policy(portfolio, "signed_contract", 30)
        contract(prop, OLD, CANONICAL)
        contract(prop, YOUNG, DOUBLED, upload=False)  # written before the guard: its spelling unrecorded
        unguarded, warning = check_document_spellings(databases=["default"])
        assert (unguarded.id, warning.id) == ("cleanup_ops.W011", "cleanup_ops.W010")
        assert "'signed_contract'" in unguarded.msg
        assert "'signed_contract'" in warning.msg and "1 key" in warning.msg
        assert DOUBLED not in warning.msg  # identifiers only, never a key

        guard_install()

        assert check_document_spellings(databases=["default"]) == []
        assert list(DocumentSpelling.objects.values_list("document_id", "spelling")) == [
            (f"contracts:{CANONICAL}", DOUBLED)
        ]
        sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()
        assert backend(CANONICAL)
        assert the_purge_request().documents_referenced == 1

    def test_the_guard_takes_the_canonical_decision_row_for_any_spelling(self, on_disk, portfolio, prop):
        guard_install()
        DocumentDisposition.objects.create(document_id=f"contracts:{CANONICAL}", state=DispositionState.PURGED)

        contract(prop, YOUNG, "contracts/./x/../lease-17.pdf", upload=False)

        assert DocumentDisposition.objects.get(document_id=f"contracts:{CANONICAL}").state == "pending"
        assert list(DocumentDisposition.objects.values_list("document_id", flat=True)) == [f"contracts:{CANONICAL}"]


@pytest.mark.usefixtures("clock")
def test_references_written_before_the_canonical_names_are_rewritten_by_the_migration(
    on_s3, portfolio, prop, active_policy
):
    """Rows of a purge written by the code before issue 37 (the key as the
    record spelled it): migration 0021 rewrites them, merging the object's
    decision rows, so the purge still in flight finds the living record."""
    import importlib

    from django.apps import apps

    from cleanup_ops.models import DocumentSpelling

    migration = importlib.import_module("cleanup_ops.migrations.0021_canonical_document_refs")
    active_policy(portfolio, "signed_contract", 30)
    contract(prop, OLD, DOUBLED, upload=False)
    contract(prop, YOUNG, CANONICAL)  # living
    sweep_trigger(slot=SLOT, now=NOW)
    job_run_slice(job_id=CleanupJob.objects.get(job_kind=JobKind.DELETE, record_kind="signed_contract").pk)
    # As the old code wrote them: the doubled spelling, and a decision row of each spelling.
    old = f"contracts:{DOUBLED}"
    PurgeRequest.objects.update(document_ids=[old])
    DeletedAttachment.objects.update(document_id=old)
    DocumentDisposition.objects.update(document_id=old, state=DispositionState.PENDING)
    DocumentDisposition.objects.create(document_id=f"contracts:{CANONICAL}", state=DispositionState.SET_ASIDE)
    assert not DocumentSpelling.objects.exists()

    migration.canonicalise(apps, None)

    assert the_purge_request().document_ids == [f"contracts:{CANONICAL}"]
    assert set(DeletedAttachment.objects.values_list("document_id", flat=True)) == {f"contracts:{CANONICAL}"}
    assert list(DocumentDisposition.objects.values_list("document_id", "state")) == [
        (f"contracts:{CANONICAL}", DispositionState.SET_ASIDE)
    ]
    cleanup_drain()
    assert CANONICAL in bucket_keys(on_s3)
    assert the_purge_request().documents_referenced == 1
