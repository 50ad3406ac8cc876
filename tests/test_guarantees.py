"""The guarantees that are structures now, each with the case that broke it.

Every test here failed on the code before the structures existed (the
reviews' reproductions): a held record's file purged through another
record's request; two open jobs for one partition reporting holds that never
existed; a large partition spending other portfolios' rate tokens; one
advisory lock per portfolio exhausting the lock table; a sweep marked drained
beside the job a redrive just created; the fallback after a failed shared
transaction ignoring the slice's deadline; two sweeps admitting one partition
at once; two workers both taking a portfolio's last lease slot. Concurrency
is real: other PostgreSQL connections, and a lock wait is observed in
``pg_stat_activity``, not inferred from elapsed time.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, connections, transaction

from cleanup_ops.admission import sweep_admit
from cleanup_ops.execution.batches import job_load, operation_id, run_batch
from cleanup_ops.execution.leases import job_lease, jobs_lease_group
from cleanup_ops.execution.runner import cleanup_drain, group_run_slice, job_run_slice
from cleanup_ops.health import health_readiness
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    DispositionState,
    DocumentDisposition,
    JobKind,
    JobOutcome,
    JobState,
    LedgerEntry,
    Sweep,
    SweepStatus,
)
from cleanup_ops.recovery.classification import InvalidInput
from cleanup_ops.recovery.operator import (
    PartitionBusy,
    dead_letter_redrive,
    dead_letters_redrive_bulk,
)
from cleanup_ops.schedule import sweep_trigger
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from properties.models import Lease, MaintenanceRecord, Portfolio, Property
from retention.services import legal_hold_place, legal_hold_release

from .conftest import backend_pid, make_records, remaining_ids, utc, wait_until_blocked
from .conftest import one_property_portfolios as estate

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
NEXT_SLOT = utc("2026-08-22T02:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "operator decision for the test"

pytestmark = pytest.mark.postgres


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def job_of(prop: Property) -> CleanupJob:
    return CleanupJob.objects.get(property_id=prop.pk, job_kind="delete")


class Held:
    """Run ``fn`` in a transaction on another connection and keep it open until ``release()``."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn
        self.ready = threading.Event()
        self.go = threading.Event()
        self.pid = 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.ready.wait(30), "the other connection never got ready"
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.pid = backend_pid()
                self.result = self.fn()
                self.ready.set()
                assert self.go.wait(30)
        except BaseException as exc:  # pragma: no cover - re-raised in the test
            self.errors.append(exc)
            self.ready.set()
        finally:
            connections.close_all()

    def release(self) -> None:
        self.go.set()
        self.thread.join(30)
        if self.errors:
            raise self.errors[0]


def in_thread(fn):  # type: ignore[no-untyped-def]
    """Start ``fn`` on a connection of its own; returns (thread, outcome dict)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["pid"] = backend_pid()
            outcome["result"] = fn()
        except BaseException as exc:  # pragma: no cover - asserted by the caller
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


# --- 1. One purge decision per document -------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clock")
class TestOneDecisionPerDocument:
    @pytest.fixture
    def shared(self, portfolio, prop, active_policy, docstore):  # type: ignore[no-untyped-def]
        """A lease and a maintenance record of one property both name ``shared-1``;
        both are past their cutoff and deleted in one shared batch transaction."""
        active_policy(portfolio, "lease", 365)
        active_policy(portfolio, "maintenance_record", 365)
        (lease,) = make_records(prop, "lease", 1, ended=OLD)
        (record,) = make_records(prop, "maintenance_record", 1, ended=OLD)
        Lease.objects.filter(pk=lease).update(document_id="shared-1")
        MaintenanceRecord.objects.filter(pk=record).update(document_id="shared-1")
        docstore.create("shared-1")
        sweep_trigger(slot=SLOT, now=NOW)
        result = group_run_slice(owner="w")
        assert (result.leased, result.transactions, result.rows_deleted) == (2, 1, 2)
        purges = {job.record_kind: job for job in CleanupJob.objects.filter(job_kind=JobKind.PURGE)}
        assert set(purges) == {"lease", "maintenance_record"}
        return purges

    @pytest.mark.parametrize("first", ["maintenance_record", "lease"])
    def test_a_hold_on_one_record_that_named_a_file_keeps_it_whichever_request_purges_first(
        self, shared, portfolio, prop, reviewer, docstore, first
    ):
        legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="maintenance_record",
            placed_by=reviewer,
            reason="audit for the tests",
        )
        second = "lease" if first == "maintenance_record" else "maintenance_record"
        for kind in (first, second):
            assert job_run_slice(job_id=shared[kind].pk).outcome == JobOutcome.PURGE_HELD
        assert "shared-1" in docstore.documents()
        assert docstore.requests() == []
        decision = DocumentDisposition.objects.get(document_id="shared-1")
        assert decision.state == DispositionState.SET_ASIDE

    def test_a_later_request_from_another_scope_never_deletes_a_file_set_aside_under_an_active_hold(
        self, shared, portfolio, prop, reviewer, docstore, clock
    ):
        hold = legal_hold_place(
            portfolio=portfolio,
            property=prop,
            record_kind="maintenance_record",
            placed_by=reviewer,
            reason="audit for the tests",
        )
        for job in shared.values():
            job_run_slice(job_id=job.pk)
        # Another property of the portfolio names the same file; its lease goes next sweep.
        other = Property.objects.create(portfolio=portfolio, name="Annex")
        (late,) = make_records(other, "lease", 1, ended=OLD)
        Lease.objects.filter(pk=late).update(document_id="shared-1")
        clock.move_to(NEXT_SLOT, tick=False)
        sweep_trigger(slot=NEXT_SLOT, now=NEXT_SLOT)
        cleanup_drain()
        assert not Lease.objects.filter(pk=late).exists()
        assert "shared-1" in docstore.documents() and docstore.requests() == []
        # Released: the next sweep's purge decides again, once.
        legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="audit closed")
        third = NEXT_SLOT + timedelta(days=1)
        clock.move_to(third, tick=False)
        sweep_trigger(slot=third, now=third)
        cleanup_drain()
        assert "shared-1" not in docstore.documents()
        assert [r["path"] for r in docstore.requests()] == ["/documents/shared-1"]
        assert DocumentDisposition.objects.get(document_id="shared-1").state == DispositionState.PURGED

    def test_a_document_is_deleted_once_however_many_requests_name_it(self, shared, docstore):
        for job in shared.values():
            assert job_run_slice(job_id=job.pk).outcome == JobOutcome.PURGED
        assert [r["path"] for r in docstore.requests()] == ["/documents/shared-1"]
        assert DocumentDisposition.objects.get(document_id="shared-1").state == DispositionState.PURGED

    def test_a_purge_waits_for_a_hold_being_placed_on_another_record_that_named_the_file(
        self, shared, portfolio, prop, reviewer, docstore
    ):
        # The hold's transaction locks the property row (FOR UPDATE) and stays
        # open; the lease's purge — whose own scope the hold does not name —
        # must wait for it, then see it.
        placing = Held(
            lambda: legal_hold_place(
                portfolio=portfolio,
                property=prop,
                record_kind="maintenance_record",
                placed_by=reviewer,
                reason="x for the tests",
            )
        )
        thread, outcome = in_thread(lambda: job_run_slice(job_id=shared["lease"].pk).outcome)
        while "pid" not in outcome:
            thread.join(0.01)
        wait_until_blocked(int(outcome["pid"]), by=placing.pid)  # type: ignore[arg-type]
        placing.release()
        thread.join(30)
        assert outcome.get("result") == JobOutcome.PURGE_HELD, outcome
        assert "shared-1" in docstore.documents()


# --- 2. One open job per partition ----------------------------------------------


class Partitions:
    """The partitions of a schema: the demo's (a lease per property) or the
    second schema's kind without a property (``tests/schema_b``'s notices:
    one partition per portfolio, ``property_id`` NULL, which the second
    partial unique index guards)."""

    def __init__(self, kind: str, active_policy) -> None:  # type: ignore[no-untyped-def]
        self.kind, self.active_policy = kind, active_policy

    def estate(self, names: list[str]) -> dict[str, Property]:
        if self.kind == "lease":
            return estate(self.active_policy, names)
        from tests.schema_b.models import Notice

        props = {}
        for name in names:
            portfolio = Portfolio.objects.create(name=f"Portfolio {name}", slug=name.lower())
            self.active_policy(portfolio, "notice", 365)
            props[name] = Property.objects.create(portfolio=portfolio, name=f"House {name}")
            Notice.objects.bulk_create([Notice(customer=portfolio, sent_at=OLD) for _ in range(3)])
        return props

    def jobs(self, prop: Property):  # type: ignore[no-untyped-def]
        if self.kind == "lease":
            return CleanupJob.objects.filter(property_id=prop.pk, job_kind="delete")
        return CleanupJob.objects.filter(portfolio_id=prop.portfolio_id, record_kind="notice", job_kind="delete")

    def job(self, prop: Property) -> CleanupJob:
        return self.jobs(prop).get()


@pytest.fixture(params=["lease", "notice"])
def partitions(request, settings, active_policy):  # type: ignore[no-untyped-def]
    if request.param == "lease":
        yield Partitions("lease", active_policy)
        return
    from retention.registry import DEFAULT_RECORD_KINDS, registry_reload

    from .record_shapes import NOTICE

    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, "notice": NOTICE}
    registry_reload()
    yield Partitions("notice", active_policy)
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clock")
class TestOneOpenJobPerPartition:
    def test_the_database_refuses_a_second_open_delete_job_for_a_partition(self, partitions):
        props = partitions.estate(["A"])
        sweep_trigger(slot=SLOT, now=NOW)
        job = partitions.job(props["A"])
        with pytest.raises(IntegrityError), transaction.atomic():
            CleanupJob.objects.create(
                sweep_id=job.sweep_id,
                key="another",
                portfolio_id=job.portfolio_id,
                property_id=job.property_id,
                record_kind=job.record_kind,
                policy_version_id=job.policy_version_id,
                cutoff=job.cutoff,
                available_at=NOW,
            )

    def test_redriving_a_letter_whose_partition_a_later_sweep_admitted_creates_nothing_and_names_the_job(
        self, partitions, operator_user, clock
    ):
        props = partitions.estate(["A"])
        sweep_trigger(slot=SLOT, now=NOW)
        dead = partitions.job(props["A"])
        job_run_slice(job_id=dead.pk, before_batch=_raise(InvalidInput("bad input")))
        letter = DeadLetter.objects.get(job=dead)
        clock.move_to(NEXT_SLOT + timedelta(minutes=1), tick=False)
        later = sweep_trigger(slot=NEXT_SLOT, now=NEXT_SLOT)
        assert later.sweep.jobs_admitted == 1  # a dead job is not open: the partition is admitted again
        fresh = CleanupJob.objects.get(sweep=later.sweep)
        with pytest.raises(PartitionBusy) as info:
            dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
        assert info.value.open_job_id == fresh.pk and str(fresh.pk) in str(info.value)
        bulk = dead_letters_redrive_bulk(actor=operator_user, reason=REASON)
        assert (len(bulk), [(f.letter_id, f.open_job_id) for f in bulk.failed]) == (0, [(letter.pk, fresh.pk)])
        letter.refresh_from_db()
        assert letter.status == DeadLetter.Status.OPEN
        assert CleanupJob.objects.filter(redrive_of=dead).count() == 0
        # The later job drains the partition alone: nothing is reported held.
        cleanup_drain()
        fresh.refresh_from_db()
        assert (fresh.outcome, fresh.rows_deleted, fresh.rows_held) == (JobOutcome.DELETED, 3, 0)
        assert LedgerEntry.objects.filter(candidates__gt=0).exclude(rows_deleted=0).count() == 1
        # Once it has finished, the letter can be redriven (the ledger finds nothing left).
        redrive = dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
        cleanup_drain()
        redrive.refresh_from_db()
        assert (redrive.outcome, redrive.rows_held) == (JobOutcome.NOTHING_ELIGIBLE, 0)

    def test_the_api_and_the_console_say_which_job_holds_the_partition(self, partitions, operator_user, clock):
        from django.test import Client

        props = partitions.estate(["A"])
        sweep_trigger(slot=SLOT, now=NOW)
        dead = partitions.job(props["A"])
        job_run_slice(job_id=dead.pk, before_batch=_raise(InvalidInput("bad input")))
        letter = DeadLetter.objects.get(job=dead)
        sweep_trigger(slot=NEXT_SLOT, now=NEXT_SLOT)
        fresh = CleanupJob.objects.get(sweep__slot=NEXT_SLOT)
        client = Client()
        client.force_login(operator_user)
        api = client.post(
            f"/api/v1/dead-letters/{letter.pk}/redrive/", {"reason": REASON}, content_type="application/json"
        )
        assert api.status_code == 409 and f"open job {fresh.pk}" in api.json()["detail"]
        page = client.post(
            "/console/dead-letters/action/",
            {"operation": "redrive", "letter": [letter.pk], "reason": REASON, "confirm": "yes"},
            follow=True,
        )
        assert f"{letter.pk} (its partition already has open job {fresh.pk})" in page.content.decode()

    def test_two_sweeps_admitted_at_once_admit_a_partition_once(self, partitions):
        props = partitions.estate(["A", "B"])
        earlier = Sweep.objects.create(key="cleanup:2026-08-20T02:00Z", slot=SLOT - timedelta(days=1))
        later = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=SLOT)
        # The stranded sweep's admission (finished by the tick) is in flight,
        # its inserts not committed, while cron admits the next slot.
        first = Held(lambda: sweep_admit(sweep_id=earlier.pk, now=NOW))
        thread, outcome = in_thread(lambda: sweep_admit(sweep_id=later.pk, now=NOW))
        while "pid" not in outcome:
            thread.join(0.01)
        waits = wait_until_blocked(int(outcome["pid"]), by=first.pid)  # type: ignore[arg-type]
        assert ("transactionid", "ShareLock") in waits  # on the unique index entry
        first.release()
        thread.join(30)
        assert "error" not in outcome, outcome
        for prop in props.values():
            assert partitions.jobs(prop).open().count() == 1
        later.refresh_from_db()
        assert (later.jobs_admitted, later.carried_over) == (0, 2)


def _raise(exc: Exception):  # type: ignore[no-untyped-def]
    def hook(job_id: int) -> None:
        raise exc

    return hook


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
    job_run_slice(job_id=job_of(props["A"]).pk, before_batch=_raise(InvalidInput("bad input")))
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

    def failing(**kwargs):  # type: ignore[no-untyped-def]
        raise InvalidInput("which partition?")

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
