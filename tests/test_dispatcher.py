from __future__ import annotations

from datetime import timedelta

import pytest
from django_q.models import OrmQ

from cleanup_ops.dispatch import dispatch_due_jobs, fair_due_job_ids
from cleanup_ops.models import CleanupJob, JobState, Sweep
from properties.models import Portfolio

from .conftest import utc

NOW = utc("2026-08-21T02:05:00Z")


@pytest.fixture
def make_jobs(portfolio, active_policy):
    version = active_policy(portfolio, "lease", 365)
    sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=utc("2026-08-21T02:00:00Z"))
    counter = iter(range(1, 10_000))

    def make(portfolio_id: int, count: int, **fields) -> list[int]:
        ids = []
        for _ in range(count):
            n = next(counter)
            job = CleanupJob.objects.create(
                sweep=sweep,
                key=f"{sweep.key}:{portfolio_id}:{n}:lease",
                portfolio_id=portfolio_id,
                property_id=n,
                record_kind="lease",
                policy_version=version,
                cutoff=NOW - timedelta(days=365),
                available_at=fields.pop("available_at", NOW - timedelta(seconds=60 - n)),
                **fields,
            )
            ids.append(job.pk)
        return ids

    return make


@pytest.fixture
def broker(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False, "workers": 2}
    settings.CLEANUP_DISPATCH_WINDOW = 0


@pytest.mark.django_db
def test_due_jobs_are_picked_round_robin_across_portfolios(make_jobs, settings):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 10
    big = make_jobs(1, 6)
    medium = make_jobs(2, 2)
    small = make_jobs(3, 1)
    assert fair_due_job_ids(now=NOW, limit=6) == [big[0], medium[0], small[0], big[1], medium[1], big[2]]


@pytest.mark.django_db
def test_jobs_not_yet_due_or_finished_or_validly_leased_are_not_picked(make_jobs):
    due = make_jobs(1, 1)
    make_jobs(1, 1, available_at=NOW + timedelta(seconds=1))
    make_jobs(2, 1, state=JobState.DONE)
    make_jobs(2, 1, state=JobState.DEAD)
    make_jobs(3, 1, state=JobState.LEASED, lease_expires_at=NOW + timedelta(seconds=30))
    rescued = make_jobs(3, 1, state=JobState.LEASED, lease_expires_at=NOW - timedelta(seconds=1))
    assert set(fair_due_job_ids(now=NOW, limit=10)) == {due[0], rescued[0]}


@pytest.mark.django_db(transaction=True)
def test_the_dispatcher_fills_the_broker_window_only_and_does_not_resend_waiting_messages(
    make_jobs, broker, time_machine, settings
):
    # Caps out of the way: this is about the window (sent-but-unleased jobs
    # also take a portfolio's slots; see the test below).
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 10
    time_machine.move_to(NOW, tick=False)
    make_jobs(1, 5)
    make_jobs(2, 5)
    assert dispatch_due_jobs(now=NOW) == 4  # window = 2 x 2 workers
    assert OrmQ.objects.count() == 4
    assert dispatch_due_jobs(now=NOW) == 0  # the window is full
    OrmQ.objects.all().delete()  # workers fetched and ran them (but never leased: say they crashed)
    assert dispatch_due_jobs(now=NOW) == 4  # four *other* jobs: enqueued ones are not re-sent yet
    assert CleanupJob.objects.filter(enqueued_at__isnull=False).count() == 8
    OrmQ.objects.all().delete()
    later = NOW + timedelta(seconds=61)
    time_machine.move_to(later, tick=False)
    assert dispatch_due_jobs(now=later) == 4  # lost messages are re-sent after the redelivery window


@pytest.mark.django_db(transaction=True)
def test_jobs_sent_but_not_yet_leased_take_their_portfolios_slots(make_jobs, broker, settings):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 2
    settings.CLEANUP_DISPATCH_WINDOW = 10
    make_jobs(1, 5)
    assert dispatch_due_jobs(now=NOW) == 2  # the portfolio's two slots
    OrmQ.objects.all().delete()  # fetched, not leased yet (or lost)
    assert fair_due_job_ids(now=NOW, limit=10) == []  # no third message for the portfolio
    assert len(fair_due_job_ids(now=NOW + timedelta(seconds=61), limit=10)) == 2  # lost ones count no more


@pytest.mark.django_db(transaction=True)
def test_the_dispatched_order_alternates_portfolios(make_jobs, broker, settings):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 10
    Portfolio.objects.create(name="Other", slug="other")
    big = make_jobs(1, 6)
    small = make_jobs(2, 1)
    dispatch_due_jobs(now=NOW)
    sent = [int(task["args"][0]) for task in _payloads()]
    assert sent == [big[0], small[0], big[1], big[2]]


def _payloads() -> list[dict]:
    from django_q.signing import SignedPackage

    return [SignedPackage.loads(m.payload) for m in OrmQ.objects.order_by("id")]


@pytest.mark.django_db
def test_a_portfolio_gets_no_more_jobs_than_its_free_lease_slots(make_jobs, settings):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 2
    make_jobs(1, 1, state=JobState.LEASED, lease_expires_at=NOW + timedelta(seconds=30))
    big = make_jobs(1, 5)
    small = make_jobs(2, 3)
    assert fair_due_job_ids(now=NOW, limit=10) == [big[0], small[0], small[1]]


@pytest.mark.django_db
def test_paused_portfolios_and_a_global_pause_are_not_dispatched(make_jobs, operator_user, portfolio):
    from cleanup_ops.recovery.operator import pipeline_pause, pipeline_resume

    first = make_jobs(portfolio.pk, 1)
    second = make_jobs(portfolio.pk + 1, 1)
    pipeline_pause(actor=operator_user, reason="maintenance window", portfolio_id=portfolio.pk)
    assert fair_due_job_ids(now=NOW, limit=10) == second
    pipeline_pause(actor=operator_user, reason="database upgrade")
    assert fair_due_job_ids(now=NOW, limit=10) == []
    pipeline_resume(actor=operator_user, reason="upgrade finished")
    pipeline_resume(actor=operator_user, reason="window over", portfolio_id=portfolio.pk)
    assert set(fair_due_job_ids(now=NOW, limit=10)) == {first[0], second[0]}
