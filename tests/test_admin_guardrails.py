"""Issue 30, items 1, 4, 14 and 15: the admin's edges (a hold across
portfolios, django-q2's write actions for view-only roles, one rule for every
reason, a review that is a deliberate decision with a note)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.models import Failure, OrmQ, Success

from cleanup_ops.recovery.operator import pipeline_pause
from properties.models import Portfolio, Property
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion
from retention.services import (
    legal_hold_place,
    legal_hold_release,
    policy_version_approve,
    policy_version_reject,
    policy_version_submit,
    retention_policy_get_or_create,
)

pytestmark = pytest.mark.django_db

INVISIBLE = ["\u200b", "\u2060", "\ufeff", "\u00ad", "\u3164"]


def client_for(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


# --- Item 1 -------------------------------------------------------------------------


def test_adding_a_hold_whose_property_is_in_another_portfolio_names_the_property_and_writes_nothing(
    portfolio, reviewer
):
    other = Portfolio.objects.create(name="Birch Estates", slug="birch")
    elsewhere = Property.objects.create(portfolio=other, name="Birch Court")
    response = client_for(reviewer).post(
        reverse("admin:retention_legalhold_add"),
        {"portfolio": portfolio.pk, "property": elsewhere.pk, "reason": "litigation pending"},
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["property"]
    assert "Birch Court is not a property of Acme Lettings" in errors["property"][0]
    assert not LegalHold.objects.exists() and not AuditEvent.objects.exists()


def test_adding_a_hold_with_a_reason_too_short_is_a_form_error_not_a_server_error(portfolio, reviewer):
    response = client_for(reviewer).post(
        reverse("admin:retention_legalhold_add"), {"portfolio": portfolio.pk, "reason": "x"}
    )
    assert response.status_code == 200
    assert "visible characters" in response.context["adminform"].form.errors["reason"][0]
    assert not LegalHold.objects.exists()


# --- Item 4 -------------------------------------------------------------------------


@pytest.fixture
def task_records(db: None) -> tuple[Failure, Success]:
    now = timezone.now()
    common = {"func": "cleanup_ops.tasks.run_job", "args": (1,), "kwargs": {}, "started": now, "stopped": now}
    failure = Failure.objects.create(id="f" * 32, name="failed-one", success=False, result="boom", **common)
    success = Success.objects.create(id="s" * 32, name="done-one", success=True, result=None, **common)
    return failure, success


@pytest.mark.parametrize("model", ["failure", "success"])
@pytest.mark.parametrize("select_across", [False, True], ids=["ticked", "select-across"])
def test_an_operator_cannot_resubmit_or_delete_django_q_tasks_from_the_admin(
    operator_user, task_records, model, select_across
):
    client = client_for(operator_user)
    changelist = reverse(f"admin:django_q_{model}_changelist")
    page = client.get(changelist)
    assert page.status_code == 200  # view-only by design…
    assert "resubmit_task" not in page.content.decode()  # …so the write action is not offered
    data = {"action": "resubmit_task", "_selected_action": "1" if select_across else task_records[0].pk, "index": "0"}
    if select_across:
        data["select_across"] = "1"
    for action in ("resubmit_task", "delete_selected"):
        client.post(changelist, {**data, "action": action, "post": "yes"})
    assert Failure.objects.filter(pk=task_records[0].pk).exists()
    assert Success.objects.filter(pk=task_records[1].pk).exists()
    assert not OrmQ.objects.exists()


def test_an_admin_action_that_declares_no_permission_is_refused_to_a_view_only_user(operator_user, task_records):
    from django_q import admin as django_q_admin

    declared = django_q_admin.resubmit_task.allowed_permissions
    del django_q_admin.resubmit_task.allowed_permissions  # as django-q2 ships it
    try:
        response = client_for(operator_user).post(
            reverse("admin:django_q_failure_changelist"),
            {"action": "resubmit_task", "_selected_action": "1", "select_across": "1", "index": "0"},
        )
    finally:
        django_q_admin.resubmit_task.allowed_permissions = declared
    assert response.status_code == 403
    assert Failure.objects.exists() and not OrmQ.objects.exists()


def test_a_superuser_may_still_resubmit_a_failed_task(task_records):
    root = User.objects.create_superuser(username="root", password="pw-for-tests")
    response = client_for(root).post(
        reverse("admin:django_q_failure_changelist"),
        {"action": "resubmit_task", "_selected_action": task_records[0].pk, "index": "0"},
    )
    assert response.status_code == 302
    assert not Failure.objects.exists()


# --- Item 14 ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [*(ch * 10 for ch in INVISIBLE), "ab\u202ecdefghijkl", "      x   ", "x", "a\u0301" * 5],
    ids=["zwsp", "word-joiner", "bom", "soft-hyphen", "hangul-filler", "rtl-override", "spaces", "x", "marks"],
)
def test_every_reason_counts_visible_characters_and_refuses_format_characters(
    portfolio, manager, reviewer, operator_user, reason
):
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="a proper reason")
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation pending")
    attempts = {
        "submit": lambda: policy_version_submit(policy=policy, retention_days=30, author=manager, reason=reason),
        "hold": lambda: legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason=reason),
        "release": lambda: legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason=reason),
        "approve": lambda: policy_version_approve(version_id=version.pk, reviewer=reviewer, note=reason),
        "reject": lambda: policy_version_reject(version_id=version.pk, reviewer=reviewer, note=reason),
        "pause": lambda: pipeline_pause(actor=operator_user, reason=reason),
    }
    events = AuditEvent.objects.count()
    for name, attempt in attempts.items():
        with pytest.raises(ValidationError) as info:
            attempt()
        assert set(info.value.message_dict) <= {"reason", "review_note"}, name
    assert AuditEvent.objects.count() == events
    assert LegalHold.objects.active().count() == 1
    assert PolicyVersion.objects.get(pk=version.pk).status == PolicyVersion.Status.IN_REVIEW


def test_a_reason_of_ten_visible_characters_padded_with_spaces_is_accepted(portfolio, reviewer):
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="  subpoenas!  ")
    assert hold.reason == "subpoenas!"


def test_the_console_refuses_a_reason_of_invisible_characters(operator_user):
    response = client_for(operator_user).post("/console/pause/", {"operation": "pause", "reason": "\u200b" * 12})
    assert response.status_code == 302
    follow = client_for(operator_user).get("/console/pauses/")
    assert follow.status_code == 200
    from cleanup_ops.models import PipelinePause

    assert not PipelinePause.objects.exists()


def test_the_api_refuses_a_hold_reason_of_one_character_naming_the_field(portfolio, reviewer):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(reviewer)
    response = api.post("/api/v1/legal-holds/", {"portfolio": portfolio.pk, "reason": "x"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["reason"]
    assert not LegalHold.objects.exists()


# --- Item 15 ------------------------------------------------------------------------


@pytest.fixture
def in_review(portfolio, manager):
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    return policy_version_submit(policy=policy, retention_days=100, author=manager, reason="shorten to 100 days")


def test_the_review_form_preselects_no_decision_and_requires_a_note(in_review, second_reviewer):
    client = client_for(second_reviewer)
    url = reverse("admin:retention_policyversion_review", args=[in_review.pk])
    page = client.get(url).content.decode()
    assert 'type="radio"' in page and "checked" not in page
    no_choice = client.post(url, {"note": "reviewed the impact, fine"})
    assert no_choice.status_code == 200 and "Choose Approve or Reject." in no_choice.content.decode()
    no_note = client.post(url, {"decision": "approve", "note": ""})
    assert no_note.status_code == 200 and "note" in no_note.context["form"].errors
    assert PolicyVersion.objects.get(pk=in_review.pk).status == PolicyVersion.Status.IN_REVIEW
    assert client.post(url, {"decision": "approve", "note": "reviewed the impact, fine"}).status_code == 302
    assert PolicyVersion.objects.get(pk=in_review.pk).status == PolicyVersion.Status.APPROVED


def test_a_reject_with_a_short_note_names_the_note_as_the_page_does_not_the_slug(in_review, second_reviewer):
    url = reverse("admin:retention_policyversion_review", args=[in_review.pk])
    response = client_for(second_reviewer).post(url, {"decision": "reject", "note": "no"})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == ["note"]
    assert errors["note"][0].startswith("Note ") and "review_note" not in response.content.decode()


def test_the_api_refuses_an_approval_without_a_note_naming_it(in_review, second_reviewer):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(second_reviewer)
    response = api.post(f"/api/v1/policy-versions/{in_review.pk}/approve/", {}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["note"]
    assert PolicyVersion.objects.get(pk=in_review.pk).status == PolicyVersion.Status.IN_REVIEW


# --- Item 12 ------------------------------------------------------------------------


@pytest.fixture
def hold(portfolio, reviewer):  # type: ignore[no-untyped-def]
    return legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation pending")


def test_a_manager_sees_no_release_link_and_a_reviewer_does(portfolio, hold, manager, reviewer):
    Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")  # a customer's manager
    changelist = reverse("admin:retention_legalhold_changelist")
    release = reverse("admin:retention_legalhold_release", args=[hold.pk])
    listed = client_for(manager).get(changelist)
    assert listed.status_code == 200 and list(listed.context["cl"].result_list) == [hold]  # they see the hold…
    assert release not in listed.content.decode()  # …but not an action they cannot take
    assert release in client_for(reviewer).get(changelist).content.decode()
    assert (
        release
        not in client_for(manager).get(reverse("admin:retention_legalhold_change", args=[hold.pk])).content.decode()
    )


def test_a_reviewer_sees_no_submit_link_on_a_policy_and_a_manager_does(portfolio, manager, reviewer):
    Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")  # a customer's manager
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    page = reverse("admin:retention_retentionpolicy_change", args=[policy.pk])
    submit = reverse("admin:retention_retentionpolicy_new_version", args=[policy.pk])
    assert submit not in client_for(reviewer).get(page).content.decode()
    assert submit in client_for(manager).get(page).content.decode()


def test_the_author_holding_the_reviewer_role_sees_no_review_link_for_their_own_version(in_review, manager, reviewer):
    manager.groups.add(*reviewer.groups.all())
    body = client_for(User.objects.get(pk=manager.pk)).get(reverse("admin:retention_policyversion_changelist"))
    text = body.content.decode()
    assert reverse("admin:retention_policyversion_review", args=[in_review.pk]) not in text
    assert "awaiting another reviewer (you wrote it)" in text


def test_a_version_page_names_users_without_links_and_says_enabled_in_words(in_review, second_reviewer):
    page = client_for(second_reviewer).get(reverse("admin:retention_policyversion_change", args=[in_review.pk]))
    text = page.content.decode()
    assert "/admin/auth/user/" not in text and "manager" in text
    assert "enabled: deletes records past their retention period" in text
    assert "Unticked" not in text


def test_a_placed_hold_shows_no_save_and_a_post_changes_nothing_and_writes_no_history(hold, reviewer):
    from django.contrib.admin.models import LogEntry

    client = client_for(reviewer)
    url = reverse("admin:retention_legalhold_change", args=[hold.pk])
    page = client.get(url).content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    response = client.post(url, {"reason": "edited in place"}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert not any("changed successfully" in m for m in shown), shown
    assert not LogEntry.objects.exists()
    assert LegalHold.objects.get(pk=hold.pk).reason == "litigation pending"


def test_a_versions_history_is_its_audit_trail_with_a_link_to_it(in_review, second_reviewer):
    page = client_for(second_reviewer).get(reverse("admin:retention_policyversion_history", args=[in_review.pk]))
    text = page.content.decode()
    assert "added via this admin site" not in text
    assert "policy_version.submitted" in text and "shorten to 100 days" in text
    assert reverse("admin:retention_auditevent_changelist") + "?object_type__exact=policy_version" in text


def test_the_hold_forms_property_autocomplete_narrows_to_the_chosen_portfolio(portfolio, prop, reviewer):
    other = Portfolio.objects.create(name="Birch Estates", slug="birch")
    Property.objects.create(portfolio=other, name="Birch Row")
    client = client_for(reviewer)
    base = "/admin/autocomplete/?app_label=retention&model_name=legalhold&field_name=property&term="
    # No portfolio chosen yet: no property (any would be refused by the form but one portfolio's).
    assert client.get(base).json()["results"] == []
    narrowed = client.get(f"{base}&portfolio={other.pk}").json()["results"]
    assert [r["text"] for r in narrowed] == ["Birch Row"]
    refused = client.get(f"{base}&portfolio=abc")
    assert refused.status_code == 400 and b"portfolio" in refused.content
