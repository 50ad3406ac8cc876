from __future__ import annotations

import hashlib

import pytest
from rest_framework.test import APIClient

from cleanup_ops.api_tokens import api_token_issue
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry, Sweep
from cleanup_ops.schedule import sweep_trigger
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion
from retention.services import policy_version_submit, retention_policy_get_or_create

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

NOW = "2026-08-21T02:05:00Z"
OLD = utc("2020-01-01T00:00:00Z")
REASON = "downstream fixed; trying again"


@pytest.fixture(autouse=True)
def clock(time_machine):
    time_machine.move_to(NOW, tick=False)


def client_for(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_issue(user=user).secret}")
    return client


@pytest.fixture
def estate(portfolio, prop, active_policy):
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 5, ended=OLD)
    return prop


class TestTrigger:
    def test_a_scheduler_token_triggers_a_sweep_once_per_slot(self, estate, operator_user):
        api = client_for(operator_user)
        first = api.post("/api/v1/sweeps/", {"slot": "2026-08-21T02:00Z"}, format="json")
        assert first.status_code == 201
        assert first.json() | {"id": 0} == {
            "id": 0,
            "key": "cleanup:2026-08-21T02:00Z",
            "status": "running",
            "created": True,
            "jobs_admitted": 1,
            "carried_over": 0,
        }
        again = api.post("/api/v1/sweeps/", {"slot": "2026-08-21T02:00Z"}, format="json")
        assert again.status_code == 200 and again.json()["created"] is False
        assert Sweep.objects.count() == 1

    def test_without_a_slot_the_current_one_is_used(self, estate, operator_user):
        response = client_for(operator_user).post("/api/v1/sweeps/", {}, format="json")
        assert response.status_code == 201 and response.json()["key"] == "cleanup:2026-08-21T02:00Z"

    @pytest.mark.parametrize(
        ("slot", "message"),
        [
            ("tomorrow", "expected a UTC minute"),
            ("2026-08-22T02:00Z", "future"),
            ("0001-01-02T00:00Z", "before the earliest slot"),
        ],
    )
    def test_a_malformed_future_or_ancient_slot_is_a_400_with_a_message(self, estate, operator_user, slot, message):
        response = client_for(operator_user).post("/api/v1/sweeps/", {"slot": slot}, format="json")
        assert response.status_code == 400 and message in response.json()["slot"]
        assert not Sweep.objects.exists()

    def test_no_credentials_is_401_and_a_role_without_the_permission_is_403(self, estate, auditor):
        assert APIClient().post("/api/v1/sweeps/", {}, format="json").status_code == 401
        assert client_for(auditor).post("/api/v1/sweeps/", {}, format="json").status_code == 403
        assert not Sweep.objects.exists()


class TestReads:
    def test_sweep_detail_has_jobs_by_state_and_rows_deleted(self, estate, operator_user):
        sweep = sweep_trigger().sweep
        job_run_slice(job_id=CleanupJob.objects.get().pk)
        body = client_for(operator_user).get(f"/api/v1/sweeps/{sweep.pk}/").json()
        assert body["jobs_by_state"] == {"pending": 0, "leased": 0, "done": 1, "dead": 0}
        assert body["rows_deleted"] == 5

    def test_the_proof_digests_can_be_recomputed_from_the_ledger(self, estate, operator_user, settings):
        sweep = sweep_trigger().sweep
        job_run_slice(job_id=CleanupJob.objects.get().pk, batch_size=2)
        proof = client_for(operator_user).get(f"/api/v1/sweeps/{sweep.pk}/proof/").json()
        ops = sorted(LedgerEntry.objects.values_list("operation_id", flat=True))
        job_digest = hashlib.sha256("\n".join(ops).encode()).hexdigest()
        assert proof["partitions"][0]["digest"] == job_digest and proof["partitions"][0]["operations"] == 3
        assert proof["digest"] == hashlib.sha256(job_digest.encode()).hexdigest()
        assert proof["rows_deleted"] == 5
        assert set(proof["partitions"][0]) >= {
            "portfolio_id",
            "property_id",
            "record_kind",
            "policy_version_id",
            "cutoff",
        }
        csv = client_for(operator_user).get(f"/api/v1/sweeps/{sweep.pk}/proof/?export=csv")
        assert csv["Content-Type"] == "text/csv" and job_digest in csv.content.decode()

    @pytest.mark.parametrize("export", ["xml", "csv\r\nSet-Cookie: x=1", "CSV", "json;csv"])
    def test_a_proof_export_in_another_format_is_a_400_naming_the_parameter(self, estate, operator_user, export):
        sweep = sweep_trigger().sweep
        response = client_for(operator_user).get(f"/api/v1/sweeps/{sweep.pk}/proof/", {"export": export})
        assert response.status_code == 400 and "export" in response.json()
        assert "Content-Disposition" not in response

    def test_jobs_filter_by_sweep_state_and_portfolio_and_reject_bad_filters(self, estate, operator_user, portfolio):
        sweep = sweep_trigger().sweep
        api = client_for(operator_user)
        assert api.get(f"/api/v1/jobs/?sweep={sweep.pk}&state=pending&portfolio={portfolio.pk}").json()["count"] == 1
        assert api.get("/api/v1/jobs/?state=done").json()["count"] == 0
        assert api.get("/api/v1/jobs/?state=bogus").status_code == 400
        assert api.get("/api/v1/jobs/?portfolio=abc").status_code == 400

    def test_metrics_returns_the_overview_figures(self, estate, operator_user):
        sweep_trigger()
        body = client_for(operator_user).get("/api/v1/metrics/").json()
        assert body["jobs_by_state"]["pending"] == 1
        assert {"throughput", "retention_debt", "fairness", "dead_letters", "limits"} <= set(body)

    def test_the_openapi_schema_lists_the_endpoints(self, operator_user):
        response = client_for(operator_user).get("/api/v1/schema/?format=json")
        paths = response.json()["paths"]
        assert "/api/v1/sweeps/" in paths and "/api/v1/dead-letters/{id}/redrive/" in paths


class TestDeadLetters:
    @pytest.fixture
    def letter(self, estate):
        from cleanup_ops.recovery.classification import DownstreamError

        sweep_trigger()

        def reject(job_id: int) -> None:
            raise DownstreamError(400)

        job_run_slice(job_id=CleanupJob.objects.get().pk, before_batch=reject)
        return DeadLetter.objects.get()

    def test_redrive_answers_201_with_the_new_job(self, letter, operator_user):
        response = client_for(operator_user).post(
            f"/api/v1/dead-letters/{letter.pk}/redrive/", {"reason": REASON}, format="json"
        )
        assert response.status_code == 201
        assert response.json()["key"] == f"{letter.job.key}:redrive:1"
        assert AuditEvent.objects.filter(action="dead_letter.redriven", actor=operator_user).count() == 1

    @pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "too short"}])
    def test_a_missing_or_short_reason_is_400(self, letter, operator_user, body):
        response = client_for(operator_user).post(f"/api/v1/dead-letters/{letter.pk}/redrive/", body, format="json")
        assert response.status_code == 400 and "reason" in response.json()
        assert CleanupJob.objects.count() == 1

    def test_a_letter_that_is_not_open_is_409(self, letter, operator_user):
        api = client_for(operator_user)
        assert (
            api.post(f"/api/v1/dead-letters/{letter.pk}/dismiss/", {"reason": REASON}, format="json").status_code == 200
        )
        response = api.post(f"/api/v1/dead-letters/{letter.pk}/redrive/", {"reason": REASON}, format="json")
        assert response.status_code == 409 and "dismissed" in response.json()["detail"]

    def test_the_list_filters_by_status_and_category(self, letter, operator_user):
        api = client_for(operator_user)
        assert api.get("/api/v1/dead-letters/?status=open&category=downstream_rejected").json()["count"] == 1
        assert api.get("/api/v1/dead-letters/?status=dismissed").json()["count"] == 0


class TestPoliciesAndHolds:
    def test_a_manager_submits_a_version_and_a_reviewer_approves_it(self, portfolio, manager, reviewer):
        Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        created = client_for(manager).post(
            f"/api/v1/policies/{policy.pk}/versions/",
            {"retention_days": 365, "reason": "baseline for leases"},
            format="json",
        )
        assert created.status_code == 201 and created.json()["status"] == "in_review"
        version_id = created.json()["id"]
        assert (
            client_for(manager)
            .post(f"/api/v1/policy-versions/{version_id}/approve/", {"note": "approved for the tests"}, format="json")
            .status_code
            == 403
        )
        approved = client_for(reviewer).post(
            f"/api/v1/policy-versions/{version_id}/approve/", {"note": "approved for the tests"}, format="json"
        )
        assert approved.status_code == 200 and approved.json()["status"] == "approved"

    def test_the_author_gets_403_even_with_the_reviewer_role(self, portfolio, reviewer):
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        version = policy_version_submit(policy=policy, retention_days=30, author=reviewer, reason="mine for the tests")
        response = client_for(reviewer).post(
            f"/api/v1/policy-versions/{version.pk}/approve/", {"note": "approved for the tests"}, format="json"
        )
        assert response.status_code == 403
        version.refresh_from_db()
        assert version.status == PolicyVersion.Status.IN_REVIEW

    def test_bad_retention_days_is_400_naming_the_field(self, portfolio, manager):
        Membership.objects.create(user=manager, portfolio=portfolio, role="property_manager")
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        response = client_for(manager).post(
            f"/api/v1/policies/{policy.pk}/versions/", {"retention_days": 0, "reason": "x"}, format="json"
        )
        assert response.status_code == 400 and "retention_days" in response.json()
        assert not PolicyVersion.objects.exists()

    def test_holds_are_placed_and_released_with_reasons(self, portfolio, prop, reviewer):
        api = client_for(reviewer)
        placed = api.post(
            "/api/v1/legal-holds/",
            {"portfolio": portfolio.pk, "property": prop.pk, "reason": "subpoena for the tests"},
            format="json",
        )
        assert placed.status_code == 201
        hold_id = placed.json()["id"]
        assert api.post(f"/api/v1/legal-holds/{hold_id}/release/", {"reason": " "}, format="json").status_code == 400
        released = api.post(f"/api/v1/legal-holds/{hold_id}/release/", {"reason": "case closed"}, format="json")
        assert released.status_code == 200 and released.json()["released_at"] is not None
        assert (
            api.post("/api/v1/legal-holds/", {"portfolio": portfolio.pk, "reason": ""}, format="json").status_code
            == 400
        )
        assert LegalHold.objects.count() == 1

    def test_audit_events_are_listed_and_filtered(self, portfolio, prop, reviewer, auditor):
        client_for(reviewer).post(
            "/api/v1/legal-holds/", {"portfolio": portfolio.pk, "reason": "subpoena for the tests"}, format="json"
        )
        body = client_for(auditor).get("/api/v1/audit-events/?action=legal_hold.placed").json()
        assert body["count"] == 1 and body["results"][0]["reason"] == "subpoena for the tests"
