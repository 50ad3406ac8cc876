"""One open job per partition, a guarantee that is a structure now, with the
cases that broke it: two open jobs for one partition reporting holds that
never existed; two sweeps admitting one partition at once. Each runs on the
demo's leases and on a kind without a property (``tests/schema_b``).
Concurrency is real: the first admission is held open on another PostgreSQL
connection (``tests/interference.py``), and the second's wait on the index
entry is read from ``pg_locks``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction

from cleanup_ops.admission import sweep_admit
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobOutcome, LedgerEntry, Sweep
from cleanup_ops.recovery.classification import InvalidInput
from cleanup_ops.recovery.operator import PartitionBusy, dead_letter_redrive, dead_letters_redrive_bulk
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property

from . import interference
from .conftest import one_property_portfolios as estate
from .conftest import wait_until_blocked
from .interference import NEXT_SLOT, NOW, OLD, REASON, SLOT, Held, in_thread, raising

clock = interference.clock


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
        job_run_slice(job_id=dead.pk, before_batch=raising(InvalidInput("bad input")))
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
        job_run_slice(job_id=dead.pk, before_batch=raising(InvalidInput("bad input")))
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
