"""Four-eyes within a customer: a customer's reviewer approves their own
managers' versions, never their own and never another customer's; the
platform's reviewer reviews any customer's.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from rest_framework.test import APIClient

from retention.models import PolicyVersion
from retention.services import membership_grant, policy_version_approve, policy_version_submit

from . import tenant_world
from .tenant_world import member

pytestmark = pytest.mark.django_db

world = tenant_world.world  # the fixture: Alder and Birch (tests/tenant_world.py)


def test_a_customers_reviewer_approves_their_managers_version_but_never_their_own(world):
    alder = world["alder"]
    api = APIClient()
    version = alder.ids["version"][0]
    api.force_authenticate(member(world, "alder", "property_manager"))
    assert (
        api.post(
            f"/api/v1/policy-versions/{version}/approve/", {"note": "approved for the tests"}, format="json"
        ).status_code
        == 403
    )
    api.force_authenticate(member(world, "alder", "compliance_reviewer"))
    assert (
        api.post(
            f"/api/v1/policy-versions/{version}/approve/", {"note": "approved for the tests"}, format="json"
        ).status_code
        == 200
    )
    assert PolicyVersion.objects.get(pk=version).status == "approved"
    own = policy_version_submit(
        policy=PolicyVersion.objects.get(pk=version).policy,
        retention_days=700,
        author=member(world, "alder", "compliance_reviewer"),
        reason="mine for the tests",
    )
    response = api.post(f"/api/v1/policy-versions/{own.pk}/approve/", {"note": "approved for the tests"}, format="json")
    assert response.status_code == 403 and "four-eyes" in response.json()["detail"]


def test_a_reviewer_of_one_customer_who_audits_another_cannot_review_there(world):
    birch = world["birch"]
    alder_reviewer = member(world, "alder", "compliance_reviewer")
    membership_grant(user=alder_reviewer, portfolio=birch.portfolio, role="auditor", granted_by=None)
    api = APIClient()
    api.force_authenticate(User.objects.get(pk=alder_reviewer.pk))
    version = birch.ids["version"][0]
    assert api.get(f"/api/v1/policy-versions/{version}/").status_code == 200  # an auditor there: visible
    response = api.post(
        f"/api/v1/policy-versions/{version}/approve/", {"note": "approved for the tests"}, format="json"
    )
    assert response.status_code == 403
    with pytest.raises(PermissionDenied):
        policy_version_approve(
            version_id=version, reviewer=User.objects.get(pk=alder_reviewer.pk), note="approved for the tests"
        )
    assert PolicyVersion.objects.get(pk=version).status == "in_review"


def test_a_platform_reviewer_reviews_any_customers_version(world, second_reviewer):
    api = APIClient()
    api.force_authenticate(second_reviewer)
    for key in ("alder", "birch"):
        version = world[key].ids["version"][0]
        assert (
            api.post(
                f"/api/v1/policy-versions/{version}/approve/", {"note": "approved for the tests"}, format="json"
            ).status_code
            == 200
        )
