"""Where a user may do X is where they hold the role that grants X — issue 19, items 1 to 4.

- The browsable API's forms are the actions' own inputs: no select of every
  portfolio, policy or user (item 1).
- Reads follow the permission, not the membership: an auditor of portfolio 1
  who manages portfolio 3 reads portfolio 1's pipeline only; an auditor of a
  who manages b reads nothing of b's pipeline (item 2).
- Free text is bounded and free of control characters, ids are integers
  (item 4). ``/metrics`` and proxies (item 3) are in ``test_permission_matrix.py``.
"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, Portfolio, Property
from retention.inputs import MAX_TEXT_LENGTH
from retention.models import AuditEvent, LegalHold, PolicyVersion, RetentionPolicy
from retention.services import membership_grant, policy_version_submit

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def estate(time_machine, active_policy, operator_user):  # type: ignore[no-untyped-def]
    """Portfolios 1 and 3 (customer a) and 2 (customer b), each with a dead
    letter, a finished job, and a policy with a version in review."""
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    portfolios = {}
    for key in ("p1", "p2", "p3"):
        portfolio = Portfolio.objects.create(name=f"Portfolio {key}", slug=key)
        prop = Property.objects.create(portfolio=portfolio, name=f"{key} house")
        active_policy(portfolio, "lease", 365)
        active_policy(portfolio, "maintenance_record", 365)
        make_records(prop, "lease", 2, ended=OLD)
        make_records(prop, "maintenance_record", 1, ended=OLD)
        portfolios[key] = portfolio
    sweep_trigger()

    def reject(job_id: int) -> None:
        raise DownstreamError(400)

    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=reject if job.record_kind == "maintenance_record" else None)
    author = make_user("author-b")
    membership_grant(user=author, portfolio=portfolios["p2"], role="property_manager", granted_by=None)
    for portfolio in portfolios.values():
        policy = RetentionPolicy.objects.get(portfolio=portfolio, record_kind="lease")
        policy_version_submit(policy=policy, retention_days=400, author=author, reason="longer for the tests")
    return portfolios


def member(name: str, *grants: tuple[Portfolio, str]) -> User:
    user = make_user(name)
    for portfolio, role in grants:
        membership_grant(user=user, portfolio=portfolio, role=role, granted_by=None)
    return User.objects.get(pk=user.pk)


def selects(page: str) -> set[str]:
    return set(re.findall(r'<select[^>]*name="([^"]+)"', page))


def api_for(user: User) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


# --- Item 1: the browsable API's forms ----------------------------------------------


def test_the_approve_form_of_the_browsable_api_lists_no_policy_and_no_user(estate):
    reviewer = member("reviewer-a", (estate["p1"], "compliance_reviewer"))
    version = PolicyVersion.objects.filter(policy__portfolio=estate["p1"], status="in_review").get()
    for extra in ({"HTTP_ACCEPT": "text/html"}, {}):
        url = f"/api/v1/policy-versions/{version.pk}/approve/" + ("" if extra else "?format=api")
        response = api_for(reviewer).get(url, **extra)
        assert response.status_code == 405
        page = response.content.decode()
        assert 'name="note"' in page  # the action's own input
        for leak in ('name="policy"', 'name="author"', 'name="reviewer"', "author-b", "Portfolio p2"):
            assert leak not in page, leak
        assert selects(page) <= {"_content_type"}  # the raw form's media type, nothing else


def test_the_new_version_form_lists_no_portfolio(estate):
    manager = member("manager-a", (estate["p1"], "property_manager"))
    policy = RetentionPolicy.objects.get(portfolio=estate["p1"], record_kind="lease")
    page = api_for(manager).get(f"/api/v1/policies/{policy.pk}/versions/?format=api").content.decode()
    assert 'name="retention_days"' in page and 'name="reason"' in page
    assert 'name="portfolio"' not in page and "Portfolio p2" not in page
    assert selects(page) <= {"_content_type"}


def test_the_redrive_form_lists_no_job_and_no_user(estate, operator_user):
    letter = DeadLetter.objects.filter(portfolio_id=estate["p1"].pk).get()
    page = api_for(operator_user).get(f"/api/v1/dead-letters/{letter.pk}/redrive/?format=api").content.decode()
    assert 'name="reason"' in page
    assert 'name="job"' not in page and 'name="resolved_by"' not in page
    assert selects(page) <= {"_content_type"}


def test_the_hold_form_offers_only_the_portfolios_where_the_user_places_holds(estate):
    user = member("mixed-reviewer", (estate["p1"], "compliance_reviewer"), (estate["p3"], "auditor"))
    page = api_for(user).get("/api/v1/legal-holds/?format=api").content.decode()
    assert "Portfolio p1" in page
    assert "Portfolio p3" not in page and "Portfolio p2" not in page
    assert "p3 house" not in page and "p2 house" not in page


# --- Item 2: reads follow the role ---------------------------------------------------


def test_an_auditor_of_one_portfolio_who_manages_another_reads_the_first_ones_pipeline_only(estate):
    p1, p3 = estate["p1"], estate["p3"]
    user = member("mixed", (p1, "auditor"), (p3, "property_manager"))
    api = api_for(user)
    jobs = api.get("/api/v1/jobs/").json()["results"]
    assert {j["portfolio_id"] for j in jobs} == {p1.pk}
    letters = api.get("/api/v1/dead-letters/").json()["results"]
    assert {letter["portfolio_id"] for letter in letters} == {p1.pk}
    p3_letter = DeadLetter.objects.get(portfolio_id=p3.pk)
    p3_job = CleanupJob.objects.filter(portfolio_id=p3.pk).first()
    assert api.get(f"/api/v1/dead-letters/{p3_letter.pk}/").status_code == 404
    assert api.get(f"/api/v1/jobs/{p3_job.pk}/").status_code == 404
    sweep = p3_job.sweep_id
    assert api.get(f"/api/v1/sweeps/{sweep}/proof/").json()["portfolio_ids"] == [p1.pk]
    metrics = api.get("/api/v1/metrics/").json()
    assert metrics["dead_letters"]["open"] == 1
    # As a manager of p3 they still read its policies.
    assert {p["portfolio"] for p in api.get("/api/v1/policies/").json()["results"]} == {p1.pk, p3.pk}

    console = Client()
    console.force_login(user)
    inbox = console.get("/console/dead-letters/?status=")
    assert [letter.portfolio_id for letter in inbox.context["page"]] == [p1.pk]
    assert console.get(f"/console/dead-letters/{p3_letter.pk}/").status_code == 404
    assert console.get(f"/console/jobs/{p3_job.pk}/").status_code == 404
    assert console.get(f"/console/portfolios/{p3.pk}/").status_code == 404
    assert console.get(f"/console/portfolios/{p1.pk}/").status_code == 200
    assert json.loads(console.get(f"/console/sweeps/{sweep}/proof.json").content)["portfolio_ids"] == [p1.pk]


def test_an_auditor_of_customer_a_who_manages_customer_b_reads_nothing_of_bs_pipeline(estate):
    p1, p2 = estate["p1"], estate["p2"]
    cross = member("cross", (p1, "auditor"), (p2, "property_manager"))
    only_b = member("manager-b", (p2, "property_manager"))
    b_letter = DeadLetter.objects.get(portfolio_id=p2.pk)
    api = api_for(cross)
    assert api.get(f"/api/v1/dead-letters/{b_letter.pk}/").status_code == 404
    assert {row["portfolio_id"] for row in api.get("/api/v1/dead-letters/").json()["results"]} == {p1.pk}
    assert api.get(f"/api/v1/dead-letters/?portfolio={p2.pk}").json()["count"] == 0
    assert p2.pk not in {j["portfolio_id"] for j in api.get("/api/v1/jobs/").json()["results"]}
    # b's own property manager is refused the same URLs outright.
    assert api_for(only_b).get(f"/api/v1/dead-letters/{b_letter.pk}/").status_code == 403
    console = Client()
    console.force_login(cross)
    assert console.get(f"/console/dead-letters/{b_letter.pk}/").status_code == 404


# --- Item 4: free text and ids --------------------------------------------------------


def test_a_two_megabyte_reason_is_refused_everywhere_naming_the_field_and_writes_nothing(estate, operator_user):
    p1 = estate["p1"]
    huge = "x" * 2_000_000
    manager = member("manager-a", (p1, "property_manager"))
    reviewer = member("reviewer-a", (p1, "compliance_reviewer"))
    events = AuditEvent.objects.count()
    console = Client()
    console.force_login(operator_user)
    response = console.post("/console/pause/", {"operation": "pause", "portfolio": p1.pk, "reason": huge})
    assert response.status_code == 400 and "reason" in response.content.decode()[:5000]

    admin_client = Client()
    admin_client.force_login(manager)
    policy = RetentionPolicy.objects.get(portfolio=p1, record_kind="lease")
    response = admin_client.post(
        f"/admin/retention/retentionpolicy/{policy.pk}/new-version/", {"retention_days": 400, "reason": huge}
    )
    assert response.status_code == 200 and "reason" in response.context["form"].errors

    response = api_for(reviewer).post("/api/v1/legal-holds/", {"portfolio": p1.pk, "reason": huge}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["reason"]
    assert AuditEvent.objects.count() == events
    assert not LegalHold.objects.exists()


@pytest.mark.parametrize("reason", ["sub\x00poena", "sub\x07poena", "\x1b[2Jsubpoena"])
def test_a_reason_with_control_characters_is_a_400_naming_it(estate, reason):
    reviewer = member("reviewer-a", (estate["p1"], "compliance_reviewer"))
    response = api_for(reviewer).post(
        "/api/v1/legal-holds/", {"portfolio": estate["p1"].pk, "reason": reason}, format="json"
    )
    assert response.status_code == 400 and list(response.json()) == ["reason"]
    assert not LegalHold.objects.exists()


def test_a_reason_of_the_documented_maximum_is_accepted(estate):
    reviewer = member("reviewer-a", (estate["p1"], "compliance_reviewer"))
    reason = "line one\r\n\tline two " + "x" * (MAX_TEXT_LENGTH - 20)
    response = api_for(reviewer).post(
        "/api/v1/legal-holds/", {"portfolio": estate["p1"].pk, "reason": reason[:MAX_TEXT_LENGTH]}, format="json"
    )
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"portfolio": 1.5}, "portfolio"),
        ({"portfolio": "{p1}"}, "portfolio"),
        ({"portfolio": True}, "portfolio"),
        ({"record_kind": "lease", "record_id": "{lease}"}, "record_id"),
        ({"record_kind": "lease", "record_id": "{lease}.0"}, "record_id"),
        ({"record_kind": "lease", "record_id": 2**63}, "record_id"),
        ({"property": "{prop}.0"}, "property"),
    ],
)
def test_an_id_that_is_not_a_json_integer_is_a_400_naming_it(estate, body, field):
    p1 = estate["p1"]
    prop = Property.objects.get(portfolio=p1)
    lease = Lease.objects.create(portfolio=p1, property=prop, unit="1", tenant_name="T", started_on=OLD.date())
    values = {"p1": p1.pk, "lease": lease.pk, "prop": prop.pk}

    def filled(value: object) -> object:
        if isinstance(value, str):
            text = value.format(**values)
            return float(text) if text.endswith(".0") else text
        return value

    reviewer = member("reviewer-a", (p1, "compliance_reviewer"))
    payload = {"portfolio": p1.pk, "reason": "subpoena for the tests", **{k: filled(v) for k, v in body.items()}}
    response = api_for(reviewer).post("/api/v1/legal-holds/", payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not LegalHold.objects.exists()


def test_a_portfolio_of_1e400_is_a_400_not_a_500(estate):
    reviewer = member("reviewer-a", (estate["p1"], "compliance_reviewer"))
    response = api_for(reviewer).post(
        "/api/v1/legal-holds/",
        '{"portfolio": 1e400, "reason": "subpoena for the tests"}',
        content_type="application/json",
    )
    assert response.status_code == 400 and "portfolio" in response.json()


def test_a_pause_of_portfolio_1_point_5_pauses_nothing(estate, operator_user):
    response = api_for(operator_user).post(
        "/api/v1/pause/", {"portfolio_id": estate["p1"].pk + 0.5, "reason": "incident review"}, format="json"
    )
    assert response.status_code == 400 and "portfolio_id" in response.json()


def test_a_nul_in_any_console_or_admin_parameter_is_a_400_naming_it(estate, operator_user):
    client = Client()
    client.force_login(operator_user)
    response = client.post("/console/pause/", {"operation": "pause", "reason": "incident\x00review"})
    assert response.status_code == 400 and response.content.decode().startswith("reason:")
    response = client.get("/admin/retention/legalhold/?q=%00")
    assert response.status_code == 400 and response.content.decode().startswith("q:")
