"""Tenant isolation in the admin: a member of one customer, in every
customer role, sees nothing of the other customer on any admin page —
changelists, searches, filters, object pages, custom views,
autocomplete — and cannot create a policy or a hold in the other's
portfolio there.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion, RetentionPolicy

from . import tenant_world
from .tenant_world import ROLES, Customer, assert_no_trace, member, other_of

pytestmark = pytest.mark.django_db

world = tenant_world.world  # the fixture: Alder and Birch (tests/tenant_world.py)


def admin_objects(customer: Customer) -> dict[type, int]:
    """One object of each admin-registered tenant model, owned by ``customer``."""
    return {
        Portfolio: customer.pid,
        Property: customer.prop.pk,
        Lease: customer.ids["running_lease"][0],
        MaintenanceRecord: customer.ids["maintenance"][0],
        TenantActivity: customer.ids["activity"][0],
        RetentionPolicy: customer.ids["policy"][0],
        PolicyVersion: customer.ids["version"][0],
        LegalHold: customer.ids["hold"][0],
        AuditEvent: customer.ids["event"][0],
        Membership: customer.ids["membership"][0],
    }


def admin_url(model: type, view: str, *args: Any) -> str:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def test_every_tenant_model_in_the_admin_is_covered_by_the_isolation_test(world):
    registered = {m for m in admin.site._registry if m._meta.app_label in {"properties", "retention"}}
    assert registered == set(admin_objects(world["alder"]))


@pytest.mark.parametrize("key", ["alder", "birch"])
@pytest.mark.parametrize("role", ROLES)
def test_a_member_sees_only_their_customer_on_every_admin_page(world, key, role):
    own, other = world[key], other_of(world, key)
    client = Client()
    client.force_login(member(world, key, role))
    mine, theirs = admin_objects(own), admin_objects(other)

    pages = [reverse("admin:index")]
    for model in mine:
        changelist = admin_url(model, "changelist")
        searched = f"{other.portfolio.name.split()[0]} Tower"
        for query, echo in (
            (f"q={searched}", (searched,)),
            (
                f"portfolio__id__exact={other.pid}",
                (f"portfolio__id__exact={other.pid}", f'value="{other.pid}"'),
            ),
        ):
            response = client.get(f"{changelist}?{query}")
            # 400: a lookup the list does not offer (retention.admin_site), e.g. a portfolio filter on a
            # model without one.
            assert response.status_code in {200, 302, 400, 403}
            assert_no_trace(response.content, other, f"{changelist}?{query}", echo=echo)
            if response.status_code == 200:
                cl = response.context["cl"]
                # No hit at all; an admin without search fields ignores q and lists the member's own.
                if cl.model_admin.search_fields or query.startswith("portfolio"):
                    assert cl.result_count == 0, f"{changelist}?{query}"
        pages += [
            changelist,
            admin_url(model, "add"),
            admin_url(model, "change", mine[model]),
            admin_url(model, "history", mine[model]),
        ]
        # 404 where the role views this model; one that views it nowhere gets the same 403 for every id.
        views_model = member(world, key, role).has_perm(f"{model._meta.app_label}.view_{model._meta.model_name}")
        for view in ("change", "history", "delete"):
            response = client.get(admin_url(model, view, theirs[model]))
            assert response.status_code == (404 if views_model else 403), (model.__name__, view, response.status_code)
            assert_no_trace(response.content, other, f"{model.__name__} {view}")
    pages += [
        reverse("admin:retention_retentionpolicy_new_version", args=[own.ids["policy"][0]]),
        reverse("admin:retention_policyversion_review", args=[own.ids["version"][0]]),
        reverse("admin:retention_legalhold_release", args=[own.ids["hold"][0]]),
        "/admin/autocomplete/?app_label=retention&model_name=legalhold&field_name=property&term=",
        "/admin/autocomplete/?app_label=retention&model_name=legalhold&field_name=property&term=Tower",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code in {200, 302, 403}, (path, response.status_code)
        assert_no_trace(response.content, other, path)
        cl = response.context.get("cl") if response.context else None
        if cl is not None:
            # Every row, and the "N total" count, is the member's own.
            if cl.model is AuditEvent:
                rows, expected = set(cl.queryset.values_list("pk", flat=True)), len(own.ids["event"])
                assert rows == set(own.ids["event"]), path
            else:
                field = cl.model_admin.portfolio_field
                assert set(cl.queryset.values_list(field, flat=True).distinct()) <= {own.pid}, path
                expected = cl.model._default_manager.filter(**{field: own.pid}).count()
            assert cl.full_result_count in {None, expected}, path

    for name, object_id in (
        ("admin:retention_retentionpolicy_new_version", other.ids["policy"][0]),
        ("admin:retention_policyversion_review", other.ids["version"][0]),
        ("admin:retention_legalhold_release", other.ids["hold"][0]),
    ):
        response = client.get(reverse(name, args=[object_id]))
        assert response.status_code == 404, name
        response = client.post(reverse(name, args=[object_id]), {"decision": "approve", "note": "x" * 20})
        assert response.status_code == 404, name


def test_portfolio_filters_list_only_the_members_portfolios(world):
    client = Client()
    client.force_login(member(world, "alder", "property_manager"))
    response = client.get(admin_url(Lease, "changelist"))
    choices = [
        c["display"] for spec in response.context["cl"].filter_specs for c in spec.choices(response.context["cl"])
    ]
    assert "Alder Homes" in choices and "Birch Estates" not in choices
    picker = "/admin/autocomplete/?app_label=retention&model_name=legalhold&field_name=property&term=Tower"
    # The hold's picker offers the chosen portfolio's properties (none before one is chosen) ...
    autocomplete = client.get(f"{picker}&portfolio={world['alder'].pid}").json()
    assert [r["text"] for r in autocomplete["results"]] == ["Alder Tower"]
    # ... and never another customer's, even when that customer's portfolio is sent.
    assert client.get(f"{picker}&portfolio={world['birch'].pid}").json()["results"] == []


# --- Creating in another customer's portfolio is refused ------------------------


NO_INLINES = {"versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}  # the policy page's version inline


def test_a_policy_or_a_hold_in_another_customers_portfolio_is_refused_in_the_admin(world):
    alder, birch = world["alder"], world["birch"]
    client = Client()
    client.force_login(member(world, "alder", "property_manager"))
    before = RetentionPolicy.objects.count()
    response = client.post(
        admin_url(RetentionPolicy, "add"), {"portfolio": birch.pid, "record_kind": "tenant_activity", **NO_INLINES}
    )
    assert response.status_code == 200 and "portfolio" in response.context["adminform"].form.errors
    assert RetentionPolicy.objects.count() == before
    response = client.post(
        admin_url(RetentionPolicy, "add"), {"portfolio": alder.pid, "record_kind": "tenant_activity", **NO_INLINES}
    )
    assert response.status_code == 302
    assert RetentionPolicy.objects.filter(portfolio=alder.portfolio, record_kind="tenant_activity").exists()

    client.force_login(member(world, "alder", "compliance_reviewer"))
    response = client.post(admin_url(LegalHold, "add"), {"portfolio": birch.pid, "reason": "subpoena for the tests"})
    assert response.status_code == 200 and "portfolio" in response.context["adminform"].form.errors
    response = client.post(
        admin_url(LegalHold, "add"),
        {"portfolio": alder.pid, "property": birch.prop.pk, "reason": "subpoena for the tests"},
    )
    assert response.status_code == 200 and "property" in response.context["adminform"].form.errors
    assert LegalHold.objects.filter(portfolio=birch.portfolio).count() == 1
