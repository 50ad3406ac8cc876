"""Memberships give a user their customers' portfolios, and nothing else does:
the platform's staff see every customer, a role group alone grants no
portfolio, a grant or a revocation is an audit event and takes effect at
once; ``seed_demo`` gives each demo customer its own staff.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from properties.models import Portfolio
from retention.models import AuditEvent, PolicyVersion
from retention.scoping import portfolios_visible_to, visible_portfolio_ids
from retention.services import membership_grant

from . import tenant_world
from .conftest import make_user
from .tenant_world import member

pytestmark = pytest.mark.django_db

world = tenant_world.world  # the fixture: Alder and Birch (tests/tenant_world.py)


@pytest.mark.parametrize("fixture", ["operator_user", "auditor", "reviewer"])
def test_the_platforms_staff_see_every_customer(world, fixture, request):
    user = request.getfixturevalue(fixture)
    assert visible_portfolio_ids(user) is None
    api = APIClient()
    api.force_authenticate(user)
    holds = api.get("/api/v1/legal-holds/").json()
    assert {h["portfolio"] for h in holds["results"]} == {world["alder"].pid, world["birch"].pid}


def test_a_property_manager_group_without_memberships_sees_no_portfolio(world, manager):
    # Customer staff are members; the group alone (kept for compatibility) grants no portfolio.
    assert visible_portfolio_ids(manager) == frozenset()
    assert not portfolios_visible_to(manager).exists()
    api = APIClient()
    api.force_authenticate(manager)
    assert api.get("/api/v1/policies/").json()["count"] == 0
    assert api.get(f"/api/v1/policies/{world['alder'].ids['policy'][0]}/").status_code == 404


def test_granting_and_revoking_a_membership_are_audit_events_visible_to_that_portfolio(world, operator_user):
    alder = world["alder"]
    newcomer = make_user("newcomer")
    membership = membership_grant(user=newcomer, portfolio=alder.portfolio, role="auditor", granted_by=operator_user)
    assert visible_portfolio_ids(newcomer) == frozenset({alder.pid})
    from retention.services import membership_revoke

    membership_revoke(membership_id=membership.pk, revoked_by=operator_user)
    assert visible_portfolio_ids(User.objects.get(pk=newcomer.pk)) == frozenset()
    events = AuditEvent.objects.filter(object_type="membership", object_id=str(membership.pk)).order_by("id")
    assert [e.action for e in events] == ["membership.granted", "membership.revoked"]
    api = APIClient()
    api.force_authenticate(member(world, "alder", "auditor"))
    seen = {e["id"] for e in api.get("/api/v1/audit-events/?object_type=membership").json()["results"]}
    assert {e.pk for e in events} <= seen


# --- seed_demo --------------------------------------------------------------------


def test_seed_demo_with_two_customers_gives_each_its_own_staff(time_machine):
    from django.core.management import call_command

    time_machine.move_to("2026-08-21T02:00:00Z", tick=False)
    args = ["--portfolios", "3", "--properties-per-portfolio", "1", "--records-per-property", "6", "--customers", "2"]
    call_command("seed_demo", *args, stdout=open("/dev/null", "w"))
    slugs = {
        username: sorted(portfolios_visible_to(User.objects.get(username=username)).values_list("slug", flat=True))
        for username in ("manager-a", "reviewer-a", "auditor-a", "manager-b", "reviewer-b", "auditor-b")
    }
    assert slugs["manager-a"] == slugs["reviewer-a"] == slugs["auditor-a"] == ["portfolio-1", "portfolio-3"]
    assert slugs["manager-b"] == slugs["reviewer-b"] == slugs["auditor-b"] == ["portfolio-2"]
    assert not User.objects.filter(username="manager").exists()
    for user in ("reviewer", "operator", "auditor"):
        assert visible_portfolio_ids(User.objects.get(username=user)) is None
    # Four-eyes within each customer.
    for version in PolicyVersion.objects.select_related("policy__portfolio", "author", "reviewer"):
        letter = "a" if version.policy.portfolio.slug in {"portfolio-1", "portfolio-3"} else "b"
        assert (version.author.username, version.reviewer.username) == (f"manager-{letter}", f"reviewer-{letter}")


def test_seed_demo_with_one_customer_makes_manager_a_member_of_every_portfolio(time_machine):
    from django.core.management import call_command

    time_machine.move_to("2026-08-21T02:00:00Z", tick=False)
    call_command("seed_demo", "--portfolios", "2", "--records-per-property", "3", stdout=open("/dev/null", "w"))
    manager = User.objects.get(username="manager")
    assert visible_portfolio_ids(manager) == set(Portfolio.objects.values_list("id", flat=True))
    assert not manager.groups.exists()


def test_seed_demo_refuses_more_customers_than_portfolios_naming_the_flag():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--customers"):
        call_command("seed_demo", "--portfolios", "2", "--customers", "3", stdout=open("/dev/null", "w"))
    assert not Portfolio.objects.exists()


def test_a_members_scope_is_not_stale_after_a_grant_within_one_request(world):
    user = member(world, "alder", "auditor")
    assert visible_portfolio_ids(user) == frozenset({world["alder"].pid})
    membership_grant(user=user, portfolio=world["birch"].portfolio, role="auditor", granted_by=None)
    assert visible_portfolio_ids(user) == frozenset({world["alder"].pid, world["birch"].pid})
