from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from properties.models import Lease
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion
from retention.services import legal_hold_place, policy_version_submit, retention_policy_get_or_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def in_review(portfolio, prop, manager, reviewer, active_policy):
    """Active: 1000 days. Proposed: 100 days. Leases aged 50, 500 and 1500 days, one held."""
    active_policy(portfolio, "lease", 1000)
    now = timezone.now()
    leases = [
        Lease.objects.create(
            portfolio=portfolio,
            property=prop,
            unit=str(d),
            tenant_name="T",
            started_on=now.date(),
            ended_at=now - timedelta(days=d),
        )
        for d in (50, 500, 1500, 2000)
    ]
    legal_hold_place(
        portfolio=portfolio, record_kind="lease", record_id=leases[3].pk, placed_by=reviewer, reason="x for the tests"
    )
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    return policy_version_submit(policy=policy, retention_days=100, author=manager, reason="shorten for the tests")


def test_the_review_page_shows_the_change_and_its_impact(client, in_review, second_reviewer):
    client.force_login(second_reviewer)
    response = client.get(reverse("admin:retention_policyversion_review", args=[in_review.pk]))
    assert response.status_code == 200
    ctx = response.context
    assert (ctx["impact"].active_days, ctx["impact"].proposed_days) == (1000, 100)
    assert ctx["impact"].eligible_now == 1  # 1500 days old; the 2000-day one is held
    assert ctx["impact"].eligible_after == 2  # 500 and 1500
    assert ctx["impact"].held_after == 1
    assert b'id="eligible-after">2<' in response.content


def test_a_reviewer_approves_through_the_confirmation_page(client, in_review, second_reviewer):
    client.force_login(second_reviewer)
    url = reverse("admin:retention_policyversion_review", args=[in_review.pk])
    response = client.post(url, {"decision": "approve", "note": "fine, for the tests"})
    assert response.status_code == 302
    in_review.refresh_from_db()
    assert in_review.status == PolicyVersion.Status.APPROVED
    assert AuditEvent.objects.filter(action="policy_version.approved", actor=second_reviewer).count() == 1


def test_the_author_is_refused_on_the_review_page(client, in_review, manager, reviewer):
    manager.groups.add(*reviewer.groups.all())  # the author also holds the reviewer role
    client.force_login(manager)
    url = reverse("admin:retention_policyversion_review", args=[in_review.pk])
    response = client.post(url, {"decision": "approve", "note": ""})
    assert response.status_code == 200
    assert "four-eyes" in response.content.decode()
    in_review.refresh_from_db()
    assert in_review.status == PolicyVersion.Status.IN_REVIEW


def test_a_property_manager_cannot_open_the_review_page(client, portfolio, in_review, manager):
    Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")
    client.force_login(manager)
    response = client.get(reverse("admin:retention_policyversion_review", args=[in_review.pk]))
    assert response.status_code == 403


def test_a_manager_submits_a_new_version_from_the_policy_page(client, portfolio, manager):
    Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="tenant_activity")
    client.force_login(manager)
    url = reverse("admin:retention_retentionpolicy_new_version", args=[policy.pk])
    bad = client.post(url, {"retention_days": "0", "enabled": "on", "reason": "x"})
    assert bad.status_code == 200 and "retention_days" in bad.context["form"].errors
    assert not PolicyVersion.objects.exists()
    response = client.post(url, {"retention_days": "90", "enabled": "on", "reason": "GDPR minimisation"})
    assert response.status_code == 302
    assert PolicyVersion.objects.get().status == PolicyVersion.Status.IN_REVIEW


def test_holds_are_released_with_a_reason_on_their_own_page(client, portfolio, reviewer):
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation")
    client.force_login(reviewer)
    url = reverse("admin:retention_legalhold_release", args=[hold.pk])
    blank = client.post(url, {"reason": "  "})
    assert blank.status_code == 200
    assert LegalHold.objects.get(pk=hold.pk).is_active
    assert client.post(url, {"reason": "case closed"}).status_code == 302
    assert not LegalHold.objects.get(pk=hold.pk).is_active


def test_audit_events_are_read_only_in_the_admin(client, portfolio, reviewer, auditor):
    legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation")
    event = AuditEvent.objects.get()
    client.force_login(auditor)
    assert client.get(reverse("admin:retention_auditevent_changelist")).status_code == 200
    assert (
        client.post(reverse("admin:retention_auditevent_delete", args=[event.pk]), {"post": "yes"}).status_code == 403
    )
    assert AuditEvent.objects.filter(pk=event.pk).exists()
