"""Batch size as reviewed policy: per (portfolio, record kind), 1-1000 rows,
four-eyes like the retention period, applied from the next batch on.

A change yields new operation ids on purpose (the limit is part of the id), so
a batch replayed from an older cursor after a change is a new operation over
the rows still there: nothing is applied twice and nothing is counted held.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from cleanup_ops.execution.leases import job_lease
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import CleanupJob, JobOutcome, JobState, LedgerEntry
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease
from retention.models import AuditEvent, Membership, PolicyVersion
from retention.selectors import policy_version_active
from retention.services import (
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

from .conftest import make_records, make_user, remaining_ids, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def new_version(policy, manager, reviewer, *, days: int = 365, size: int | None = None) -> PolicyVersion:  # type: ignore[no-untyped-def]
    version = policy_version_submit(
        policy=policy, retention_days=days, batch_size=size, author=manager, reason="r for the tests"
    )
    return policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")


class TestReview:
    def test_a_batch_size_is_submitted_and_approved_by_two_people_and_audited(
        self, portfolio, reviewer, second_reviewer
    ):
        from django.core.exceptions import PermissionDenied

        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        version = policy_version_submit(
            policy=policy, retention_days=365, batch_size=50, author=reviewer, reason="r for the tests"
        )
        assert version.status == PolicyVersion.Status.IN_REVIEW and version.batch_size == 50
        with pytest.raises(PermissionDenied, match="four-eyes"):
            policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
        assert policy_version_active(policy_id=policy.pk) is None
        policy_version_approve(version_id=version.pk, reviewer=second_reviewer, note="approved for the tests")
        assert policy_version_active(policy_id=policy.pk).batch_size == 50
        details = list(
            AuditEvent.objects.filter(object_id=str(version.pk)).order_by("id").values_list("action", "details")
        )
        assert [(action, d["batch_size"]) for action, d in details] == [
            ("policy_version.submitted", 50),
            ("policy_version.approved", 50),
        ]

    def test_a_new_policy_starts_at_cleanup_batch_size_and_a_new_version_keeps_the_active_size(
        self, portfolio, manager, reviewer, settings
    ):
        settings.CLEANUP_BATCH_SIZE = 250
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        assert new_version(policy, manager, reviewer).batch_size == 250
        new_version(policy, manager, reviewer, size=40)
        assert new_version(policy, manager, reviewer, days=400).batch_size == 40

    @pytest.mark.parametrize("bad", [0, 1001, -5, "20", 2.5, True])
    def test_a_batch_size_outside_1_to_1000_is_refused_naming_the_field_and_nothing_is_written(
        self, portfolio, manager, bad
    ):
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        with pytest.raises(ValidationError) as info:
            policy_version_submit(
                policy=policy, retention_days=365, batch_size=bad, author=manager, reason="r for the tests"
            )
        assert "batch_size" in info.value.message_dict
        assert not PolicyVersion.objects.exists() and not AuditEvent.objects.exists()


class TestExecution:
    def test_a_job_runs_with_its_policys_batch_size_and_a_change_applies_from_the_next_batch(
        self, portfolio, prop, manager, reviewer, clock
    ):
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        new_version(policy, manager, reviewer, size=3)
        make_records(prop, "lease", 10, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        job = CleanupJob.objects.get()
        job_run_slice(job_id=job.pk, max_batches=2)
        job.refresh_from_db()
        assert (job.batch_size, job.rows_deleted) == (3, 6)
        new_version(policy, manager, reviewer, size=5)
        job_run_slice(job_id=job.pk)
        job.refresh_from_db()
        assert (job.outcome, job.batch_size, job.rows_deleted, job.rows_held) == (JobOutcome.DELETED, 5, 10, 0)
        limits = list(LedgerEntry.objects.order_by("id").values_list("batch_limit", "candidates", "rows_deleted"))
        assert limits == [(3, 3, 3), (3, 3, 3), (5, 4, 4)]
        assert LedgerEntry.objects.values("operation_id").distinct().count() == 3

    def test_a_redrive_from_an_older_cursor_after_a_change_applies_nothing_twice(
        self, portfolio, prop, manager, reviewer, clock
    ):
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        new_version(policy, manager, reviewer, size=4)
        ids = make_records(prop, "lease", 8, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        job = CleanupJob.objects.get()
        job_run_slice(job_id=job.pk, max_batches=1)  # deletes ids[0:4]
        new_version(policy, manager, reviewer, size=6)
        # Back to the start (a redrive of a letter from before the first batch).
        CleanupJob.objects.filter(pk=job.pk).update(cursor=0)
        cleanup_drain()
        job.refresh_from_db()
        assert remaining_ids(prop, "lease") == set()
        entries = list(LedgerEntry.objects.order_by("id").values_list("after_id", "batch_limit", "rows_deleted"))
        assert entries == [(0, 4, 4), (0, 6, 4)]  # a new operation over the four rows still there
        assert sum(deleted for *_, deleted in entries) == len(ids)
        assert (job.state, job.rows_held) == (JobState.DONE, 0)
        assert job_lease(job_id=job.pk, owner="late") is None


class TestSurfaces:
    def test_the_api_shows_and_takes_a_batch_size_and_refuses_one_out_of_range(
        self, portfolio, manager, reviewer, active_policy
    ):
        active_policy(portfolio, "lease", 365)
        Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        client = Client()
        client.force_login(manager)
        bad = client.post(
            f"/api/v1/policies/{policy.pk}/versions/",
            {"retention_days": 30, "batch_size": 5000, "reason": "smaller batches"},
            content_type="application/json",
        )
        assert bad.status_code == 400 and "batch_size" in bad.json()
        made = client.post(
            f"/api/v1/policies/{policy.pk}/versions/",
            {"retention_days": 30, "batch_size": 200, "reason": "smaller batches"},
            content_type="application/json",
        )
        assert made.status_code == 201 and made.json()["batch_size"] == 200
        assert PolicyVersion.objects.filter(policy=policy).count() == 2

    def test_the_review_page_shows_the_new_size_the_batches_it_means_and_the_measured_rate(
        self, portfolio, prop, manager, reviewer, clock
    ):
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        new_version(policy, manager, reviewer, size=10)
        make_records(prop, "lease", 25, ended=OLD)
        proposed = policy_version_submit(
            policy=policy, retention_days=365, batch_size=7, author=manager, reason="narrower for the tests"
        )
        second = make_user("reviewer-two", "compliance_reviewer")
        client = Client()
        client.force_login(second)
        page = client.get(f"/admin/retention/policyversion/{proposed.pk}/review/")
        assert page.status_code == 200, page.status_code
        html = page.content.decode()
        assert '<td id="batch-size-after">7</td>' in html
        assert '<td id="batches-after">4</td>' in html  # 25 eligible rows in batches of 7
        assert "No measured deletion rate" in html

    def test_the_new_version_form_offers_the_active_size_and_the_proof_shows_the_size_a_job_ran_with(
        self, portfolio, prop, manager, reviewer, clock
    ):
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        new_version(policy, manager, reviewer, size=9)
        Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")
        client = Client()
        client.force_login(manager)
        form = client.get(f"/admin/retention/retentionpolicy/{policy.pk}/new-version/")
        assert 'name="batch_size" value="9"' in form.content.decode()
        make_records(prop, "lease", 3, ended=OLD)
        result = sweep_trigger(slot=SLOT, now=NOW)
        cleanup_drain()
        assert not Lease.objects.exists()
        operator = make_user("operator-x", "operator")
        client.force_login(operator)
        proof = client.get(f"/api/v1/sweeps/{result.sweep.pk}/proof/")
        assert proof.status_code == 200 and proof.json()["partitions"][0]["batch_size"] == 9
