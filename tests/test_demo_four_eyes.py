"""``make demo`` can show four-eyes review (issue 30, item 21): each
customer's lead holds an author role and a reviewer role, may approve a
version another person wrote, and is refused on their own, in the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from properties.models import Portfolio
from retention.models import Membership, PolicyVersion, RetentionPolicy

pytestmark = pytest.mark.django_db

# make demo's DEMO_ARGS, smaller.
ARGS = ["--portfolios", "3", "--properties-per-portfolio", "1", "--records-per-property", "6", "--customers", "2"]


def logged_in(username: str) -> Client:
    client = Client()
    client.force_login(User.objects.get(username=username))
    return client


def submit(client: Client, policy: RetentionPolicy, days: int) -> PolicyVersion:
    url = reverse("admin:retention_retentionpolicy_new_version", args=[policy.pk])
    response = client.post(url, {"retention_days": str(days), "enabled": "on", "reason": "demo: shorter retention"})
    assert response.status_code == 302, response.content.decode()[:500]
    return PolicyVersion.objects.get(policy=policy, retention_days=days)


def test_each_customers_lead_is_an_author_and_a_reviewer_of_that_customer_only(time_machine) -> None:
    time_machine.move_to("2026-08-21T02:00:00Z", tick=False)
    call_command("seed_demo", *ARGS, stdout=open("/dev/null", "w"))
    for letter, slugs in (("a", {"portfolio-1", "portfolio-3"}), ("b", {"portfolio-2"})):
        roles = set(Membership.objects.filter(user__username=f"lead-{letter}").values_list("portfolio__slug", "role"))
        assert roles == {(slug, role) for slug in slugs for role in ("property_manager", "compliance_reviewer")}


def test_the_lead_approves_the_managers_version_and_is_refused_on_their_own(time_machine) -> None:
    time_machine.move_to("2026-08-21T02:00:00Z", tick=False)
    call_command("seed_demo", *ARGS, stdout=open("/dev/null", "w"))
    portfolio = Portfolio.objects.get(slug="portfolio-1")
    lease = RetentionPolicy.objects.get(portfolio=portfolio, record_kind="lease")
    activity = RetentionPolicy.objects.get(portfolio=portfolio, record_kind="tenant_activity")
    lead = logged_in("lead-a")

    managers = submit(logged_in("manager-a"), lease, 700)
    review = reverse("admin:retention_policyversion_review", args=[managers.pk])
    assert lead.post(review, {"decision": "approve", "note": "checked with legal"}).status_code == 302
    managers.refresh_from_db()
    assert managers.status == PolicyVersion.Status.APPROVED and managers.reviewer.username == "lead-a"

    own = submit(lead, activity, 60)
    refused = lead.post(
        reverse("admin:retention_policyversion_review", args=[own.pk]), {"decision": "approve", "note": "mine"}
    )
    assert "four-eyes" in refused.content.decode()
    own.refresh_from_db()
    assert own.status == PolicyVersion.Status.IN_REVIEW
    done = logged_in("reviewer-a").post(
        reverse("admin:retention_policyversion_review", args=[own.pk]), {"decision": "approve", "note": "second pair"}
    )
    assert done.status_code == 302
    own.refresh_from_db()
    assert own.status == PolicyVersion.Status.APPROVED


def test_another_customers_lead_cannot_review_it(time_machine) -> None:
    time_machine.move_to("2026-08-21T02:00:00Z", tick=False)
    call_command("seed_demo", *ARGS, stdout=open("/dev/null", "w"))
    policy = RetentionPolicy.objects.get(portfolio__slug="portfolio-1", record_kind="lease")
    version = submit(logged_in("manager-a"), policy, 700)
    response = logged_in("lead-b").get(reverse("admin:retention_policyversion_review", args=[version.pk]))
    assert response.status_code in {403, 404}
    version.refresh_from_db()
    assert version.status == PolicyVersion.Status.IN_REVIEW
