"""A Hypothesis state machine over the job life cycle, with a fake clock.

Steps: deliveries (enqueue and duplicate enqueue), leases by competing
workers — of one job, or of several small partitions at once (a group lease
worked in shared transactions) — lease expiry, batch commits, lost
acknowledgements, 429s with Retry-After, timeouts, budget exhaustion, redrive
and pause. After every step
the invariants of docs/architecture.md ("Invariants") are checked against the database.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.execution.batches import job_load, jobs_load, run_batch, run_group_batch
from cleanup_ops.execution.leases import job_lease, job_release, jobs_lease_group, jobs_release
from cleanup_ops.models import CleanupJob, DeadLetter, JobState, LedgerEntry
from cleanup_ops.recovery.classification import DownstreamError, DownstreamTimeout, LeaseLost, classify
from cleanup_ops.recovery.failures import job_fail
from cleanup_ops.recovery.operator import dead_letter_redrive, pipeline_pause, pipeline_resume
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, Portfolio, Property
from retention.services import legal_hold_place

from .conftest import make_records, make_user, utc
from .testenv import examples, steps

START = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
WORKERS = ["w1", "w2", "w3"]


class JobLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        self.clock = time_machine.travel(START, tick=False)
        self.clock.start()
        self.now = START
        portfolio = Portfolio.objects.get(slug="p")
        self.prop = Property.objects.create(portfolio=portfolio, name="B")
        ids = make_records(self.prop, "lease", 12, ended=OLD)
        make_records(self.prop, "lease", 3, ended=START - timedelta(days=10))  # never eligible
        self.eligible = set(ids)
        self.held = {ids[3], ids[7]}
        for record_id in self.held:
            legal_hold_place(
                portfolio=portfolio,
                record_kind="lease",
                record_id=record_id,
                placed_by=self.reviewer,
                reason="h for the tests",
            )
        # Two more small partitions, so group leases have company.
        for name in ("C", "D"):
            small = Property.objects.create(portfolio=portfolio, name=name)
            small_ids = make_records(small, "lease", 2, ended=OLD)
            self.eligible |= set(small_ids)
        self.initial = set(Lease.objects.values_list("id", flat=True))
        sweep_trigger(slot=utc("2026-08-21T02:00:00Z"))
        self.leases: dict[str, object] = {}
        self.groups: dict[str, object] = {}
        self.paused = False

    def teardown(self) -> None:
        self.clock.stop()
        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)

    # --- rules ---------------------------------------------------------------
    @rule(seconds=st.sampled_from([1, 5, 30, 61, 600, 3600]))
    def advance_clock(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)
        self.clock.stop()
        self.clock = time_machine.travel(self.now, tick=False)
        self.clock.start()

    @rule(worker=st.sampled_from(WORKERS), pick=st.integers(min_value=0, max_value=3))
    def deliver(self, worker: str, pick: int) -> None:
        """An (early, duplicate or due) delivery of an open job to a worker."""
        jobs = list(CleanupJob.objects.open().order_by("-id"))
        if not jobs:
            return
        job = jobs[pick % len(jobs)]
        due_before = job.available_at
        lease = job_lease(job_id=job.pk, owner=worker)
        if lease is not None:
            assert self.now >= due_before, "leased before available_at"
            assert not self.paused, "leased while paused"
            self.leases[worker] = lease

    @rule(worker=st.sampled_from(WORKERS), limit=st.sampled_from([1, 3, 5]))
    def commit_batch(self, worker: str, limit: int) -> None:
        lease = self.leases.get(worker)
        if lease is None:
            return
        try:
            run_batch(job=job_load(lease.job_id), lease=lease, limit=limit)
        except LeaseLost:
            self.leases.pop(worker)

    @rule(worker=st.sampled_from(WORKERS), size=st.sampled_from([1, 2, 5]))
    def lease_group(self, worker: str, size: int) -> None:
        """A worker leases several due partitions at once under one token."""
        if worker in self.groups:
            return
        group = jobs_lease_group(owner=worker, limit=size)
        if group is None:
            return
        assert not self.paused, "group leased while paused"
        for job in CleanupJob.objects.filter(pk__in=group.job_ids):
            assert job.available_at <= self.now, "leased before available_at"
        self.groups[worker] = group

    @rule(worker=st.sampled_from(WORKERS), limit=st.sampled_from([1, 3, 5]))
    def commit_group_batch(self, worker: str, limit: int) -> None:
        group = self.groups.get(worker)
        if group is None:
            return
        mine = list(
            CleanupJob.objects.filter(pk__in=group.job_ids, state=JobState.LEASED, lease_token=group.lease.token)
            .order_by("id")
            .values_list("id", flat=True)
        )
        if not mine:
            self.groups.pop(worker)
            return
        jobs = jobs_load(mine)
        try:
            run_group_batch(jobs=[jobs[i] for i in mine], lease=group.lease, limit=limit)
        except LeaseLost:
            self.groups.pop(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def release_group(self, worker: str) -> None:
        group = self.groups.pop(worker, None)
        if group is not None:
            jobs_release(lease=group.lease, job_ids=group.job_ids)

    @rule(worker=st.sampled_from(WORKERS))
    def acknowledge(self, worker: str) -> None:
        lease = self.leases.pop(worker, None)
        if lease is not None:
            job_release(lease=lease)

    @rule(worker=st.sampled_from(WORKERS))
    def lose_acknowledgement(self, worker: str) -> None:
        self.leases.pop(worker, None)  # the worker died: its lease must expire by itself

    @rule(worker=st.sampled_from(WORKERS), failure=st.sampled_from(["429", "429-date", "timeout", "500", "400"]))
    def fail(self, worker: str, failure: str) -> None:
        lease = self.leases.pop(worker, None)
        if lease is None:
            return
        exc = {
            "429": DownstreamError(429, "7"),
            "429-date": DownstreamError(429, (self.now + timedelta(seconds=30)).strftime("%a, %d %b %Y %H:%M:%S GMT")),
            "timeout": DownstreamTimeout(),
            "500": DownstreamError(500),
            "400": DownstreamError(400),
        }[failure]
        classification = classify(exc, now=timezone.now())
        job_fail(lease=lease, classification=classification)
        job = CleanupJob.objects.get(pk=lease.job_id)
        if job.state == JobState.PENDING and classification.retry_after is not None:
            assert job.available_at >= classification.retry_after

    @precondition(lambda self: DeadLetter.objects.filter(status="open").exists())
    @rule()
    def redrive(self) -> None:
        letter = DeadLetter.objects.filter(status="open").first()
        dead_letter_redrive(letter_id=letter.pk, actor=self.operator, reason="operator decided to retry")

    @rule()
    def toggle_pause(self) -> None:
        if self.paused:
            pipeline_resume(actor=self.operator, reason="maintenance finished")
        else:
            pipeline_pause(actor=self.operator, reason="maintenance starting")
        self.paused = not self.paused

    # --- invariants ----------------------------------------------------------
    @invariant()
    def held_and_young_records_are_never_deleted(self) -> None:
        remaining = set(Lease.objects.values_list("id", flat=True))
        assert self.held <= remaining
        assert self.initial - remaining <= self.eligible - self.held

    @invariant()
    def the_ledger_accounts_for_every_deleted_row_exactly_once(self) -> None:
        gone = len(self.initial) - Lease.objects.count()
        entries = list(LedgerEntry.objects.values_list("operation_id", "rows_deleted"))
        assert len({op for op, _ in entries}) == len(entries)
        assert sum(n for _, n in entries) == gone

    @invariant()
    def at_most_one_worker_holds_a_valid_lease_on_each_job(self) -> None:
        now = timezone.now()
        holders: dict[int, int] = {}
        held_by = [(lease.token, [lease.job_id]) for lease in self.leases.values()]
        held_by += [(group.lease.token, group.job_ids) for group in self.groups.values()]
        for token, job_ids in held_by:
            for job_id in CleanupJob.objects.filter(
                pk__in=job_ids, state=JobState.LEASED, lease_token=token, lease_expires_at__gt=now
            ).values_list("id", flat=True):
                holders[job_id] = holders.get(job_id, 0) + 1
        assert all(n <= 1 for n in holders.values())

    @invariant()
    def dead_jobs_hold_no_lease_and_are_never_dispatched(self) -> None:
        dead = list(CleanupJob.objects.filter(state=JobState.DEAD).values_list("id", "lease_token"))
        assert all(token is None for _, token in dead)
        due = set(fair_due_job_ids(now=timezone.now() + timedelta(days=1), limit=50, exclude_enqueued=False))
        assert not due & {job_id for job_id, _ in dead}

    @invariant()
    def every_dead_job_has_exactly_one_letter(self) -> None:
        assert CleanupJob.objects.filter(state=JobState.DEAD).count() == DeadLetter.objects.count()


@pytest.mark.django_db
def test_the_job_life_cycle_keeps_the_invariants_under_any_sequence_of_events():
    assert django_settings.CLEANUP_LEASE_SECONDS == 60
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    manager = make_user("m", "property_manager")
    JobLifecycle.reviewer = make_user("r", "compliance_reviewer")
    JobLifecycle.operator = make_user("o", "operator")
    policy = retention_policy_get_or_create(portfolio=Portfolio.objects.create(name="P", slug="p"), record_kind="lease")
    version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="r for the tests")
    policy_version_approve(version_id=version.pk, reviewer=JobLifecycle.reviewer, note="approved for the tests")
    run_state_machine_as_test(
        JobLifecycle,
        settings=settings(
            max_examples=examples(cost=20),  # 25 runs of 30 steps in ci (tests/testenv.py)
            stateful_step_count=steps(share=0.75),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
