"""The API's operator actions (issue 30, item 18): run now and cancel a job,
bulk decisions on dead letters, and a policy version's impact preview —
through the console's services, permission-scoped like the rest of the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from cleanup_ops.api_tokens import api_token_issue
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobState
from cleanup_ops.recovery.classification import DownstreamError, FailureCategory
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent, Membership, PolicyVersion, RetentionPolicy
from retention.services import policy_version_submit

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store is back, running it now"
MISSING = 987654321


def client_for(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_issue(user=user).secret}")
    return client


@pytest.fixture
def two_customers(portfolio, active_policy, time_machine):  # type: ignore[no-untyped-def]
    """Acme: two lease partitions; Birch (another customer): one. Every job pending."""
    time_machine.move_to(NOW, tick=False)
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    for owner, names in ((portfolio, ("Harbour House", "Quay Court")), (birch, ("Birch Row",))):
        active_policy(owner, "lease", 365)
        for name in names:
            make_records(Property.objects.create(portfolio=owner, name=name), "lease", 2, ended=OLD)
    sweep_trigger()
    CleanupJob.objects.update(available_at=NOW + timedelta(hours=1))
    return {"acme": portfolio, "birch": birch}


def birch_auditor(birch: Portfolio):  # type: ignore[no-untyped-def]
    user = make_user("birch-auditor")
    Membership.objects.create(user=user, portfolio=birch, role="auditor")
    return user


class TestJobActions:
    def test_run_now_makes_a_pending_job_due_with_a_reason_and_an_audit_event(self, two_customers, operator_user):
        job = CleanupJob.objects.filter(portfolio_id=two_customers["acme"].pk).first()
        response = client_for(operator_user).post(f"/api/v1/jobs/{job.pk}/run-now/", {"reason": REASON}, "json")
        assert response.status_code == 200, response.content
        assert response.json()["job"]["id"] == job.pk and response.json()["dead_letter"] is None
        job.refresh_from_db()
        assert job.available_at == NOW
        event = AuditEvent.objects.get(action="job.run_now")
        assert (event.object_id, event.reason, event.actor_id) == (str(job.pk), REASON, operator_user.pk)

    def test_cancel_stops_a_pending_job_as_a_cancelled_dead_letter(self, two_customers, operator_user):
        job = CleanupJob.objects.first()
        response = client_for(operator_user).post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": REASON}, "json")
        assert response.status_code == 200, response.content
        letter = DeadLetter.objects.get(job=job)
        assert response.json()["dead_letter"] == letter.pk and letter.category == FailureCategory.CANCELLED
        assert response.json()["job"]["state"] == JobState.DEAD
        assert AuditEvent.objects.filter(action="job.cancelled", object_id=str(job.pk), reason=REASON).exists()

    def test_a_short_reason_is_a_400_naming_it_and_a_job_no_longer_pending_is_a_409(self, two_customers, operator_user):
        job = CleanupJob.objects.first()
        client = client_for(operator_user)
        short = client.post(f"/api/v1/jobs/{job.pk}/run-now/", {"reason": "soon"}, "json")
        assert short.status_code == 400 and "reason" in short.json()
        assert client.post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": REASON}, "json").status_code == 200
        again = client.post(f"/api/v1/jobs/{job.pk}/run-now/", {"reason": REASON}, "json")
        assert again.status_code == 409 and "not pending" in again.json()["detail"]
        assert AuditEvent.objects.filter(action="job.run_now").count() == 0

    def test_another_customers_job_answers_like_a_missing_one_and_a_role_without_the_action_is_refused(
        self, two_customers, operator_user
    ):
        auditor = birch_auditor(two_customers["birch"])
        acme_job = CleanupJob.objects.filter(portfolio_id=two_customers["acme"].pk).first()
        birch_job = CleanupJob.objects.get(portfolio_id=two_customers["birch"].pk)
        client = client_for(auditor)
        theirs = client.post(f"/api/v1/jobs/{acme_job.pk}/run-now/", {"reason": REASON}, "json")
        missing = client.post(f"/api/v1/jobs/{MISSING}/run-now/", {"reason": REASON}, "json")
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json() == missing.json()
        own = client.post(f"/api/v1/jobs/{birch_job.pk}/cancel/", {"reason": REASON}, "json")
        assert own.status_code == 403
        assert CleanupJob.objects.filter(state=JobState.PENDING).count() == 3


def letters(two_customers) -> list[DeadLetter]:  # type: ignore[no-untyped-def]
    CleanupJob.objects.update(available_at=NOW)

    def refuse(job_id: int) -> None:
        raise DownstreamError(400)

    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=refuse)
    return list(DeadLetter.objects.order_by("id"))


class TestBulkLetterDecisions:
    def test_letters_named_by_id_are_decided_with_one_audit_event_each_and_unknown_ids_are_reported(
        self, two_customers, operator_user
    ):
        first, second, _ = letters(two_customers)
        body = {
            "operation": "dismiss",
            "reason": "documents kept by the customer",
            "letter_ids": [first.pk, second.pk, MISSING],
        }
        response = client_for(operator_user).post("/api/v1/dead-letters/bulk/", body, "json")
        assert response.status_code == 200, response.content
        assert response.json() == {
            "decided": [first.pk, second.pk],
            "jobs": [],
            "failed": [],
            "not_open": [],
            "not_found": [MISSING],
        }
        events = AuditEvent.objects.filter(action="dead_letter.dismissed")
        assert sorted(events.values_list("object_id", flat=True)) == sorted([str(first.pk), str(second.pk)])
        again = client_for(operator_user).post("/api/v1/dead-letters/bulk/", body, "json")
        assert again.json()["decided"] == [] and again.json()["not_open"] == [first.pk, second.pk]

    def test_a_filter_decides_only_if_it_still_matches_the_number_the_caller_saw(self, two_customers, operator_user):
        letters(two_customers)
        acme = two_customers["acme"].pk
        client = client_for(operator_user)
        query = {"portfolio": str(acme), "http_status": "400"}
        seen = client.get("/api/v1/dead-letters/", {**query, "status": "open"}).json()["seen"]
        body = {"operation": "redrive", "reason": REASON, "filter": query, "seen": seen}
        assert client.post("/api/v1/dead-letters/bulk/", body, "json").status_code == 400  # expected is required
        stale = client.post("/api/v1/dead-letters/bulk/", {**body, "expected": 3}, "json")
        assert stale.status_code == 409 and DeadLetter.objects.open().count() == 3
        done = client.post("/api/v1/dead-letters/bulk/", {**body, "expected": 2}, "json")
        assert done.status_code == 200, done.content
        assert len(done.json()["decided"]) == 2 and len(done.json()["jobs"]) == 2
        assert set(DeadLetter.objects.open().values_list("portfolio_id", flat=True)) == {two_customers["birch"].pk}

    def test_bad_input_names_the_field_and_a_role_without_the_decision_is_refused(self, two_customers, operator_user):
        (letter, *_) = letters(two_customers)
        client = client_for(operator_user)
        bad = client.post(
            "/api/v1/dead-letters/bulk/", {"operation": "burn", "reason": REASON, "letter_ids": [1]}, "json"
        )
        assert bad.status_code == 400 and "operation" in bad.json()
        ids = client.post(
            "/api/v1/dead-letters/bulk/", {"operation": "dismiss", "reason": REASON, "letter_ids": ["x"]}, "json"
        )
        assert ids.status_code == 400 and "letter_ids" in ids.json()
        short = client.post(
            "/api/v1/dead-letters/bulk/", {"operation": "dismiss", "reason": "no", "letter_ids": [letter.pk]}, "json"
        )
        assert short.status_code == 400 and "reason" in short.json()
        auditor = birch_auditor(two_customers["birch"])
        refused = client_for(auditor).post(
            "/api/v1/dead-letters/bulk/", {"operation": "dismiss", "reason": REASON, "letter_ids": [letter.pk]}, "json"
        )
        assert refused.status_code == 403
        assert DeadLetter.objects.open().count() == 3


class TestImpactPreview:
    def test_a_version_in_review_shows_what_approving_it_would_change_in_its_portfolio_only(
        self, two_customers, manager
    ):
        acme, birch = two_customers["acme"], two_customers["birch"]
        policy = RetentionPolicy.objects.get(portfolio=acme, record_kind="lease")
        version = policy_version_submit(policy=policy, retention_days=10_000, author=manager, reason="keep far longer")
        reviewer = make_user("acme-reader")
        Membership.objects.create(user=reviewer, portfolio=acme, role="compliance_reviewer")
        response = client_for(reviewer).get(f"/api/v1/policy-versions/{version.pk}/impact/")
        assert response.status_code == 200, response.content
        impact = response.json()
        assert (impact["active_days"], impact["proposed_days"]) == (365, 10_000)
        assert (impact["expired_now"], impact["eligible_now"]) == (4, 4)  # Acme's 4 leases, not Birch's 2
        assert impact["eligible_after"] == 0
        birch_version = PolicyVersion.objects.filter(policy__portfolio=birch).first()
        theirs = client_for(reviewer).get(f"/api/v1/policy-versions/{birch_version.pk}/impact/")
        missing = client_for(reviewer).get(f"/api/v1/policy-versions/{MISSING}/impact/")
        assert theirs.status_code == missing.status_code == 404 and theirs.json() == missing.json()
