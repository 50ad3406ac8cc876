"""Tenant isolation through the API: a member of one customer, in every
customer role, never gets an id, a count or a name of the other customer
from any API route; the other's objects answer 404, and the other's
portfolio is refused where a member would create in it.

Lists are also checked by id and portfolio reference, and the figures
(metrics, sweep, proof) against the same selectors scoped to the member's
portfolio.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from cleanup_ops.console_selectors.overview import overview
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.proof import sweep_proof
from retention.models import LegalHold, PolicyVersion

from . import tenant_world
from .tenant_world import ROLES, assert_no_trace, member, other_of

pytestmark = pytest.mark.django_db

world = tenant_world.world  # the fixture: Alder and Birch (tests/tenant_world.py)


def as_json(data: Any) -> Any:
    """``data`` as the API renders it (decimals, datetimes)."""
    return json.loads(JSONRenderer().render(data))


def portfolio_refs(data: Any) -> set[int]:
    """Every portfolio id a JSON document names (``portfolio``, ``portfolio_id``, ``portfolio_ids``)."""
    found: set[int] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if key in {"portfolio", "portfolio_id"} and isinstance(value, int):
                found.add(value)
            elif key == "portfolio_ids" and isinstance(value, list):
                found.update(v for v in value if isinstance(v, int))
            else:
                found |= portfolio_refs(value)
    elif isinstance(data, list):
        for item in data:
            found |= portfolio_refs(item)
    return found


# --- API ----------------------------------------------------------------------

API_LISTS = {
    "/api/v1/jobs/": "job",
    "/api/v1/dead-letters/": "letter",  # every status (an empty ?status= is a 400)
    "/api/v1/policies/": "policy",
    "/api/v1/policy-versions/": "version",
    "/api/v1/legal-holds/": "hold",
    "/api/v1/audit-events/": "event",
}
API_DETAILS = {
    "job": "/api/v1/jobs/{}/",
    "letter": "/api/v1/dead-letters/{}/",
    "policy": "/api/v1/policies/{}/",
    "version": "/api/v1/policy-versions/{}/",
    "hold": "/api/v1/legal-holds/{}/",
    "event": "/api/v1/audit-events/{}/",
}
API_READ_PERMS = {
    "job": "cleanup_ops.view_cleanupjob",
    "letter": "cleanup_ops.view_deadletter",
    "policy": "retention.view_retentionpolicy",
    "version": "retention.view_policyversion",
    "hold": "retention.view_legalhold",
    "event": "retention.view_auditevent",
}
API_ACTIONS = [
    ("/api/v1/policies/{policy}/versions/", {"retention_days": 500, "reason": "mine now, for the tests"}),
    ("/api/v1/policy-versions/{version}/approve/", {"note": "approved for the tests"}),
    ("/api/v1/policy-versions/{version}/reject/", {"note": "no, for the tests"}),
    ("/api/v1/legal-holds/{hold}/release/", {"reason": "case closed"}),
    ("/api/v1/dead-letters/{letter}/redrive/", {"reason": "retrying after the fix"}),
    ("/api/v1/dead-letters/{letter}/dismiss/", {"reason": "not needed any more"}),
]


@pytest.mark.parametrize("key", ["alder", "birch"])
@pytest.mark.parametrize("role", ROLES)
def test_a_member_sees_only_their_customer_through_every_api_route(world, key, role):
    own, other = world[key], other_of(world, key)
    api = APIClient()
    api.force_authenticate(member(world, key, role))

    for path, kind in API_LISTS.items():
        response = api.get(path)
        assert response.status_code in {200, 403}, path
        assert_no_trace(response.content, other, path)
        if response.status_code == 200:
            body = response.json()
            assert {row["id"] for row in body["results"]} <= set(own.ids[kind]), path
            assert body["count"] == len(body["results"]) <= len(own.ids[kind]), path
            assert portfolio_refs(body) <= {own.pid}, path

    # The browsable API's forms offer only the member's portfolios and properties.
    response = api.get("/api/v1/legal-holds/", HTTP_ACCEPT="text/html")
    assert response.status_code in {200, 403}
    assert_no_trace(response.content, other, "browsable /api/v1/legal-holds/")

    # Filtering by the other customer's portfolio finds nothing, not a 403 that confirms it.
    for path in ("/api/v1/jobs/?portfolio={}", "/api/v1/dead-letters/?portfolio={}"):
        response = api.get(path.format(other.pid))
        assert response.status_code in {200, 403}
        if response.status_code == 200:
            assert response.json()["count"] == 0

    user = member(world, key, role)
    for kind, template in API_DETAILS.items():
        # 404 where the role reads this kind (the object is looked up first);
        # a role that reads it nowhere gets the same 403 for every id.
        expected = 404 if user.has_perm(API_READ_PERMS[kind]) else 403
        for object_id in other.ids[kind]:
            response = api.get(template.format(object_id))
            assert response.status_code == expected, (template, kind)
            assert_no_trace(response.content, other, template)
        response = api.get(template.format(own.ids[kind][0]))
        assert response.status_code in {200, 403}, template
        assert_no_trace(response.content, other, template)

    for template, body in API_ACTIONS:
        path = template.format(**{k: other.ids[k][0] for k in ("policy", "version", "hold", "letter")})
        response = api.post(path, body, format="json")
        kind = next(k for k in ("policy", "version", "hold", "letter") if "{" + k + "}" in template)
        assert response.status_code == (404 if user.has_perm(API_READ_PERMS[kind]) else 403), (
            path,
            response.status_code,
        )
        assert_no_trace(response.content, other, path)

    for path in ("/api/v1/sweeps/", "/api/v1/metrics/", "/api/v1/schema/"):
        response = api.get(path)
        assert response.status_code in {200, 403}, path
        assert_no_trace(response.content, other, path)
        if response.status_code == 200 and path != "/api/v1/schema/":
            assert portfolio_refs(response.json()) <= {own.pid}, path

    # Nothing the member sent changed the other customer.
    assert PolicyVersion.objects.filter(policy__portfolio=other.portfolio, status="in_review").count() == 1
    assert LegalHold.objects.get(pk=other.ids["hold"][0]).is_active
    assert DeadLetter.objects.get(pk=other.ids["letter"][0]).status == "open"


@pytest.mark.parametrize("key", ["alder", "birch"])
def test_a_customer_auditor_gets_their_own_figures_from_sweeps_proofs_and_metrics(world, key):
    own, other = world[key], other_of(world, key)
    api = APIClient()
    api.force_authenticate(member(world, key, "auditor"))
    sweep = Sweep.objects.get()
    scope = frozenset({own.pid})
    own_jobs = CleanupJob.objects.filter(sweep=sweep, portfolio_id=own.pid)

    listed = api.get("/api/v1/sweeps/").json()["results"]
    assert [s["id"] for s in listed] == [sweep.pk]
    assert listed[0]["jobs_admitted"] == own_jobs.count() < sweep.jobs_admitted
    assert listed[0]["carried_over"] is None
    assert listed[0]["status"] == "drained_with_dead_letters"

    detail = api.get(f"/api/v1/sweeps/{sweep.pk}/").json()
    assert sum(detail["jobs_by_state"].values()) == own_jobs.count()
    assert detail["rows_deleted"] == sum(j.rows_deleted for j in own_jobs) == 3

    proof = api.get(f"/api/v1/sweeps/{sweep.pk}/proof/").json()
    assert proof.pop("signature")["key_id"] == "test-2026"
    assert proof == as_json(sweep_proof(sweep=sweep, portfolio_ids=scope))
    assert proof["portfolio_ids"] == [own.pid] and proof["jobs"] == own_jobs.count()
    assert {row["portfolio_id"] for row in proof["partitions"]} == {own.pid}
    assert proof["digest"] != sweep_proof(sweep=sweep)["digest"]
    csv = api.get(f"/api/v1/sweeps/{sweep.pk}/proof/?export=csv")
    assert csv.status_code == 200
    assert_no_trace(csv.content, other, "proof csv")

    metrics = api.get("/api/v1/metrics/").json()
    expected = as_json(overview(portfolio_ids=scope))
    assert {k: v for k, v in metrics.items() if k != "generated_at"} == {
        k: v for k, v in expected.items() if k != "generated_at"
    }
    everyone = overview()
    assert metrics["dead_letters"]["open"] == 1 < everyone["dead_letters"]["open"]
    assert sum(metrics["jobs_by_state"].values()) < sum(everyone["jobs_by_state"].values())
    assert [p["portfolio_id"] for p in metrics["pauses"]] == [own.pid]
    assert [f["portfolio_id"] for f in metrics["fairness"]] == [own.pid]


# --- Creating in another customer's portfolio is refused ------------------------


def test_a_hold_in_another_customers_portfolio_is_a_400_naming_the_field(world):
    alder, birch = world["alder"], world["birch"]
    api = APIClient()
    api.force_authenticate(member(world, "alder", "compliance_reviewer"))
    response = api.post(
        "/api/v1/legal-holds/", {"portfolio": birch.pid, "reason": "subpoena for the tests"}, format="json"
    )
    assert response.status_code == 400 and list(response.json()) == ["portfolio"]
    missing = api.post("/api/v1/legal-holds/", {"portfolio": 999999, "reason": "subpoena for the tests"}, format="json")
    # The same answer as for a portfolio that does not exist (with its own id echoed).
    assert response.json()["portfolio"][0].replace(str(birch.pid), "N") == missing.json()["portfolio"][0].replace(
        "999999", "N"
    )
    response = api.post(
        "/api/v1/legal-holds/",
        {"portfolio": alder.pid, "property": birch.prop.pk, "reason": "subpoena for the tests"},
        format="json",
    )
    assert response.status_code == 400 and list(response.json()) == ["property"]
    assert not LegalHold.objects.filter(portfolio=birch.portfolio).exclude(pk__in=birch.ids["hold"]).exists()
    # A manager of Alder holds no hold permission there: the portfolio is not one of their choices either.
    api.force_authenticate(member(world, "alder", "property_manager"))
    assert api.post("/api/v1/legal-holds/", {"portfolio": alder.pid, "reason": "x"}, format="json").status_code == 403
