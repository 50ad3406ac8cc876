from __future__ import annotations

import threading

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connections, transaction
from rest_framework.test import APIClient

from properties.models import Portfolio
from retention.models import AuditEvent, ImmutableVersion, PolicyVersion
from retention.selectors import policy_version_active
from retention.services import (
    policy_version_approve,
    policy_version_reject,
    policy_version_submit,
    retention_policy_get_or_create,
)

from .conftest import backend_pid, make_user, wait_until_blocked

pytestmark = pytest.mark.django_db


@pytest.fixture
def policy(portfolio):
    return retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")


def test_submitting_a_version_puts_it_in_review_with_the_next_number_and_an_audit_event(policy, manager):
    first = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="baseline for the tests")
    second = policy_version_submit(policy=policy, retention_days=400, author=manager, reason="longer for the tests")
    assert (first.number, second.number) == (1, 2)
    assert first.status == PolicyVersion.Status.IN_REVIEW
    event = AuditEvent.objects.get(action="policy_version.submitted", object_id=str(second.pk))
    assert event.actor == manager
    assert event.details["retention_days"] == 400


def test_the_author_cannot_approve_their_own_version(policy, reviewer):
    version = policy_version_submit(policy=policy, retention_days=365, author=reviewer, reason="mine for the tests")
    with pytest.raises(PermissionDenied, match="four-eyes"):
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
    version.refresh_from_db()
    assert version.status == PolicyVersion.Status.IN_REVIEW
    assert policy_version_active(policy_id=policy.pk) is None


def test_a_user_without_the_approve_permission_cannot_approve(policy, manager, operator_user):
    version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="baseline for the tests")
    with pytest.raises(PermissionDenied):
        policy_version_approve(version_id=version.pk, reviewer=operator_user, note="approved for the tests")
    assert policy_version_active(policy_id=policy.pk) is None


def test_approval_supersedes_the_previous_active_version_atomically(policy, manager, reviewer):
    v1 = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="baseline for the tests")
    policy_version_approve(version_id=v1.pk, reviewer=reviewer, note="approved for the tests")
    v2 = policy_version_submit(policy=policy, retention_days=500, author=manager, reason="longer for the tests")
    policy_version_approve(version_id=v2.pk, reviewer=reviewer, note="ok for the tests")

    v1.refresh_from_db()
    assert v1.status == PolicyVersion.Status.SUPERSEDED
    assert policy_version_active(policy_id=policy.pk).pk == v2.pk
    event = AuditEvent.objects.get(action="policy_version.approved", object_id=str(v2.pk))
    assert event.details["superseded_version_id"] == v1.pk


def test_the_database_refuses_two_active_versions_for_one_policy(policy, manager, reviewer):
    v1 = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="baseline for the tests")
    policy_version_approve(version_id=v1.pk, reviewer=reviewer, note="approved for the tests")
    v2 = policy_version_submit(policy=policy, retention_days=500, author=manager, reason="longer for the tests")
    with pytest.raises(IntegrityError), transaction.atomic():
        PolicyVersion.objects.filter(pk=v2.pk).update(status=PolicyVersion.Status.APPROVED)


def test_approved_versions_cannot_be_edited_or_deleted(policy, manager, reviewer):
    version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="baseline for the tests")
    policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
    version.refresh_from_db()
    version.retention_days = 1
    with pytest.raises(ImmutableVersion):
        version.save()
    with pytest.raises(ImmutableVersion):
        version.delete()
    version.refresh_from_db()
    assert version.retention_days == 365


def test_rejected_versions_never_become_active(policy, manager, reviewer):
    version = policy_version_submit(policy=policy, retention_days=30, author=manager, reason="short for the tests")
    policy_version_reject(version_id=version.pk, reviewer=reviewer, note="too short for leases")
    with pytest.raises(ValidationError, match="rejected, not in review"):
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
    assert policy_version_active(policy_id=policy.pk) is None
    version.refresh_from_db()
    assert version.status == PolicyVersion.Status.REJECTED
    assert AuditEvent.objects.filter(action="policy_version.rejected", object_id=str(version.pk)).count() == 1


def test_rejecting_needs_a_note(policy, manager, reviewer):
    version = policy_version_submit(policy=policy, retention_days=30, author=manager, reason="short for the tests")
    with pytest.raises(ValidationError) as info:
        policy_version_reject(version_id=version.pk, reviewer=reviewer, note="   ")
    assert "review_note" in info.value.message_dict


@pytest.mark.parametrize("days", [0, -5, 36501, "365", 12.5])
def test_retention_days_out_of_range_is_refused_naming_the_field_and_writes_nothing(policy, manager, days):
    with pytest.raises(ValidationError) as info:
        policy_version_submit(policy=policy, retention_days=days, author=manager, reason="bad for the tests")
    assert "retention_days" in info.value.message_dict
    assert not PolicyVersion.objects.exists()
    assert not AuditEvent.objects.exists()


def test_the_database_check_constraint_also_refuses_out_of_range_days(policy, manager):
    with pytest.raises(IntegrityError), transaction.atomic():
        PolicyVersion.objects.create(
            policy=policy, number=1, retention_days=0, author=manager, reason="x for the tests"
        )


def test_an_unknown_record_kind_is_refused_naming_the_field(portfolio):
    with pytest.raises(ValidationError) as info:
        retention_policy_get_or_create(portfolio=portfolio, record_kind="invoice")
    assert "record_kind" in info.value.message_dict
    assert "invoice" in info.value.message_dict["record_kind"][0]


def test_a_blank_reason_is_refused(policy, manager):
    with pytest.raises(ValidationError) as info:
        policy_version_submit(policy=policy, retention_days=30, author=manager, reason=" ")
    assert "reason" in info.value.message_dict
    assert not PolicyVersion.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("earlier_version", ["active", "none"])
def test_two_approvals_of_one_policy_at_the_same_moment_one_wins_and_the_other_is_a_409(earlier_version):
    """Two reviewers approve two versions at once (two connections): the second
    queues behind the first's transaction and then gets a 409, never a 500."""
    manager = make_user("m", "property_manager")
    first_reviewer = make_user("r1", "compliance_reviewer")
    second_reviewer = make_user("r2", "compliance_reviewer")
    policy = retention_policy_get_or_create(
        portfolio=Portfolio.objects.create(name="Race", slug="race"), record_kind="lease"
    )
    if earlier_version == "active":
        v1 = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="baseline for the tests")
        policy_version_approve(version_id=v1.pk, reviewer=first_reviewer, note="approved for the tests")
    winner = policy_version_submit(policy=policy, retention_days=400, author=manager, reason="longer for the tests")
    loser = policy_version_submit(policy=policy, retention_days=500, author=manager, reason="longer still")

    approved_uncommitted, commit_first = threading.Event(), threading.Event()
    pids: dict[str, int] = {}
    second_started = threading.Event()
    responses: list = []
    errors: list[BaseException] = []

    def approve_and_hold_the_commit() -> None:
        try:
            pids["first"] = backend_pid()
            with transaction.atomic():
                policy_version_approve(version_id=winner.pk, reviewer=first_reviewer, note="approved for the tests")
                approved_uncommitted.set()
                assert commit_first.wait(10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def approve_through_the_api() -> None:
        try:
            assert approved_uncommitted.wait(10)
            pids["second"] = backend_pid()
            second_started.set()
            client = APIClient()
            client.force_authenticate(second_reviewer)
            responses.append(
                client.post(
                    f"/api/v1/policy-versions/{loser.pk}/approve/", {"note": "approved for the tests"}, format="json"
                )
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve_and_hold_the_commit), threading.Thread(target=approve_through_the_api)]
    for thread in threads:
        thread.start()
    try:
        assert second_started.wait(10)
        waits = wait_until_blocked(pids["second"], by=pids["first"])
        assert waits  # pg_locks: the second approval waits for a lock the first one holds
    finally:
        commit_first.set()
        for thread in threads:
            thread.join(20)
    assert errors == []
    (response,) = responses
    assert response.status_code == 409
    assert "approved at the same moment" in response.json()["detail"]
    statuses = dict(PolicyVersion.objects.filter(policy=policy).values_list("pk", "status"))
    assert statuses[winner.pk] == PolicyVersion.Status.APPROVED
    assert statuses[loser.pk] == PolicyVersion.Status.IN_REVIEW  # still there for a fresh review
    assert PolicyVersion.objects.filter(policy=policy, status=PolicyVersion.Status.APPROVED).count() == 1
    approvals = AuditEvent.objects.filter(action="policy_version.approved").values_list("object_id", flat=True)
    assert str(loser.pk) not in set(approvals)


def test_a_conflicting_approval_on_the_admin_review_page_is_shown_on_the_form(
    client, policy, manager, reviewer, second_reviewer, monkeypatch
):
    from django.urls import reverse

    from retention import services

    version = policy_version_submit(policy=policy, retention_days=400, author=manager, reason="longer for the tests")

    def conflict(**kwargs: object) -> None:
        raise services.ConcurrentApproval(version.pk)

    monkeypatch.setattr(services, "_review_once", conflict)
    client.force_login(second_reviewer)
    url = reverse("admin:retention_policyversion_review", args=[version.pk])
    response = client.post(url, {"decision": "approve", "note": "fine, for the tests"})
    assert response.status_code == 200
    assert "approved at the same moment" in response.content.decode()
