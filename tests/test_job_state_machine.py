"""The job state machine (``cleanup_ops.lifecycle``) is what the code does.

Every transition the code makes (lease, release, a batch's advance and finish,
a failure's retry and dead letter, an operator's cancel) is tried from every
state a job can be in — pending, leased with a live lease, leased with an
expired one, done, dead — against real PostgreSQL, and the state it leaves the
row in is compared with a plain model built from ``TRANSITIONS`` (plus the two
liveness rules the fence adds). A transition the table refuses must leave the
row untouched.

The finishing outcome is decided once, in Python (``outcome_when_finished``):
every combination of rows deleted and held is run through a real batch.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from cleanup_ops.console_selectors.jobs import JobFilter
from cleanup_ops.execution.batches import job_load, run_batch
from cleanup_ops.execution.leases import JobLease, job_lease, jobs_release
from cleanup_ops.lifecycle import (
    TRANSITIONS,
    JobEvent,
    JobOutcome,
    JobState,
    TransitionRefused,
    next_state,
    outcome_when_finished,
)
from cleanup_ops.models import CleanupJob
from cleanup_ops.recovery.classification import InvalidInput, LeaseLost, classify
from cleanup_ops.recovery.failures import job_fail
from cleanup_ops.recovery.operator import JobAction, jobs_act
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease as LeaseRecord
from retention.services import legal_hold_place

from .conftest import make_records, make_user, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000001")

# The states a row can be in, as the fence sees them.
VARIANTS = ("pending", "leased_live", "leased_expired", "done", "dead")
STATE_OF = {
    "pending": JobState.PENDING,
    "leased_live": JobState.LEASED,
    "leased_expired": JobState.LEASED,
    "done": JobState.DONE,
    "dead": JobState.DEAD,
}


def model_allows(event: JobEvent, variant: str) -> bool:
    """The plain model: the table, plus what liveness adds. A lease takes a
    leased job only once its lease expired; a batch writes only under a live
    lease (the fence); a release and a failure record need only our token."""
    sources, _ = TRANSITIONS[event]
    if STATE_OF[variant] not in sources:
        return False
    if event == JobEvent.LEASE and variant == "leased_live":
        return False
    if event in (JobEvent.ADVANCE, JobEvent.FINISH) and variant == "leased_expired":
        return False
    return True


def put_in(job: CleanupJob, variant: str) -> None:
    now = timezone.now()
    fields: dict[str, object] = {"state": STATE_OF[variant], "available_at": now - timedelta(seconds=1)}
    if variant.startswith("leased"):
        live = variant == "leased_live"
        fields |= {
            "lease_token": TOKEN,
            "lease_owner": "w",
            "lease_expires_at": now + timedelta(seconds=60 if live else -60),
        }
    if variant == "done":
        fields |= {"outcome": JobOutcome.DELETED, "finished_at": now}
    CleanupJob.objects.filter(pk=job.pk).update(**fields)


def apply(event: JobEvent, job: CleanupJob) -> None:
    """Make the code attempt ``event`` on ``job`` the way production does."""
    lease = JobLease(job_id=job.pk, token=TOKEN, owner="w")
    if event == JobEvent.LEASE:
        job_lease(job_id=job.pk, owner="other")
    elif event == JobEvent.RELEASE:
        jobs_release(lease=lease, job_ids=[job.pk])
    elif event in (JobEvent.ADVANCE, JobEvent.FINISH):
        # 5 expired rows: a limit of 2 leaves the job open, 10 finishes it.
        try:
            run_batch(job=job_load(job.pk), lease=lease, limit=2 if event == JobEvent.ADVANCE else 10)
        except LeaseLost:
            pass
    elif event == JobEvent.RETRY:
        job_fail(lease=lease, classification=classify(OperationalError("connection reset"), now=timezone.now()))
    elif event == JobEvent.FAIL:
        job_fail(lease=lease, classification=classify(InvalidInput("bad"), now=timezone.now()))
    else:
        operator = make_user("op", "operator")
        jobs_act(
            action=JobAction.CANCEL,
            actor=operator,
            reason="stopped for the test",
            job_filter=JobFilter(job_ids=(job.pk,)),
        )


@pytest.fixture
def delete_job(active_policy, portfolio, prop, time_machine) -> CleanupJob:  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 5, ended=OLD)
    sweep_trigger(slot=SLOT)
    return CleanupJob.objects.get(job_kind="delete")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("event", list(JobEvent))
def test_every_transition_from_every_state_does_what_the_table_says(delete_job, event, variant):
    put_in(delete_job, variant)
    before = CleanupJob.objects.get(pk=delete_job.pk)
    apply(event, delete_job)
    after = CleanupJob.objects.get(pk=delete_job.pk)
    if model_allows(event, variant):
        assert after.state == TRANSITIONS[event][1], (event, variant)
        assert next_state(event, before.state) == after.state
    else:
        assert (after.state, after.cursor, after.lease_token, after.outcome) == (
            before.state,
            before.cursor,
            before.lease_token,
            before.outcome,
        ), (event, variant)
        if STATE_OF[variant] not in TRANSITIONS[event][0]:
            with pytest.raises(TransitionRefused):
                next_state(event, before.state)


@pytest.mark.parametrize("fixed", ["", JobOutcome.SCOPE_MISSING, JobOutcome.POLICY_WITHDRAWN])
@pytest.mark.parametrize("deleted", [0, 3])
@pytest.mark.parametrize("held", [0, 2])
def test_the_finishing_outcome_is_the_fixed_reason_else_from_the_totals(fixed, deleted, held):
    expected = fixed or ("deleted" if deleted else "held" if held else "nothing_eligible")
    assert outcome_when_finished(fixed=fixed, rows_deleted=deleted, rows_held=held) == expected


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("expired", "held"), [(0, 0), (3, 0), (3, 3), (3, 1)])
def test_a_real_batch_finishes_with_the_outcome_its_totals_give(
    active_policy, portfolio, prop, time_machine, expired, held
):
    time_machine.move_to(NOW, tick=False)
    active_policy(portfolio, "lease", 365)
    ids = make_records(prop, "lease", expired, ended=OLD) if expired else []
    make_records(prop, "lease", 1, ended=NOW - timedelta(days=1))  # young: never a candidate
    if held:
        for record_id in ids[:held]:
            legal_hold_place(
                portfolio=portfolio,
                record_kind="lease",
                record_id=record_id,
                placed_by=make_user(f"rev{record_id}", "compliance_reviewer"),
                reason="litigation",
            )
    sweep_trigger(slot=SLOT)
    job = CleanupJob.objects.filter(job_kind="delete").first()
    if job is None:
        # Nothing past the cutoff: admission creates no job at all.
        assert expired == 0
        return
    lease = job_lease(job_id=job.pk, owner="w")
    assert lease is not None
    deleted, outcome = run_batch(job=job_load(job.pk), lease=lease, limit=10)
    job.refresh_from_db()
    assert job.state == JobState.DONE
    assert outcome == job.outcome == outcome_when_finished(rows_deleted=expired - held, rows_held=held)
    assert (deleted, job.rows_deleted, job.rows_held) == (expired - held, expired - held, held)
    assert LeaseRecord.objects.filter(pk__in=ids).count() == held
