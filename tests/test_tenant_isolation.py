"""Tenant isolation: two customers, every customer role, every admin page,
API route and console view. A member of one customer never gets an id, a
count or a name of the other; the other's objects answer 404.

Each customer's names carry a marker ("Alder", "Birch") and its portfolio,
property and records have distinctive ids, so a leak anywhere in a response
body — a filter choice, a search hit, a tenant name, an actor's username, a
pause reason — is a substring match. Lists are also checked by id and
portfolio reference, and the figures (metrics, sweep, proof) against the same
selectors scoped to the member's portfolio.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.test import Client
from django.urls import reverse
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from cleanup_ops.console_selectors.overview import overview
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry, PipelinePause, Sweep
from cleanup_ops.proof import sweep_proof
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion, RetentionPolicy
from retention.scoping import portfolios_visible_to, visible_portfolio_ids
from retention.services import (
    legal_hold_place,
    membership_grant,
    policy_version_approve,
    policy_version_submit,
)

from .conftest import make_user, utc

pytestmark = pytest.mark.django_db

ROLES = ["property_manager", "compliance_reviewer", "auditor"]
OLD = utc("2020-01-01T00:00:00Z")


@dataclass
class Customer:
    marker: str  # in every name of this customer, lower-cased for matching
    portfolio: Portfolio
    prop: Property
    staff: dict[str, User]
    ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.portfolio.pk

    def distinctive_ids(self) -> list[str]:
        """Ids chosen far from anything else in the test database."""
        return [str(self.pid), str(self.prop.pk), *(str(i) for i in self.ids["records"])]


def reject(job_id: int) -> None:
    raise DownstreamError(400)


def build_customer(name: str, *, base_id: int, active_policy: Any) -> Customer:
    marker = name.split()[0].lower()
    portfolio = Portfolio.objects.create(id=base_id, name=name, slug=marker)
    prop = Property.objects.create(id=base_id + 1, portfolio=portfolio, name=f"{name.split()[0]} Tower")
    staff = {role: make_user(f"{marker}-{role}") for role in ROLES}
    for role, user in staff.items():
        membership_grant(user=user, portfolio=portfolio, role=role, granted_by=None)
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    common = {"portfolio_id": portfolio.pk, "property_id": prop.pk}
    leases = [
        Lease(id=base_id + 100 + i, **common, unit=f"{i}A", tenant_name=f"{name} tenant {i}", started_on=OLD.date())
        for i in range(3)
    ]
    for lease in leases:
        lease.ended_at = OLD  # expired: the sweep deletes these three
    # Still running: outlives the sweep, for the pages and checks that need a lease.
    leases.append(Lease(id=base_id + 103, **common, unit="9Z", tenant_name=f"{name} tenant 9", started_on=OLD.date()))
    Lease.objects.bulk_create(leases)
    MaintenanceRecord.objects.bulk_create(
        [
            MaintenanceRecord(id=base_id + 200 + i, **common, summary=f"{name} boiler", opened_at=OLD, closed_at=OLD)
            for i in range(2)
        ]
    )
    TenantActivity.objects.create(
        id=base_id + 300, **common, activity_type="login", details=f"{name} portal", occurred_at=OLD
    )
    customer = Customer(marker=marker, portfolio=portfolio, prop=prop, staff=staff)
    customer.ids.update(
        records=[*range(base_id + 100, base_id + 104), base_id + 200, base_id + 201, base_id + 300],
        running_lease=[base_id + 103],
        maintenance=[base_id + 200, base_id + 201],
        activity=[base_id + 300],
    )
    return customer


@pytest.fixture
def world(time_machine, operator_user, active_policy):  # type: ignore[no-untyped-def]
    """Customers Alder and Birch, each with its staff, policies, a version in
    review, a hold, a finished lease job (ledger rows), a dead letter, and a
    pause of its portfolio; the platform's staff see both."""
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    customers = {
        "alder": build_customer(
            "Alder Homes",
            base_id=730001,
            active_policy=active_policy,
        ),
        "birch": build_customer(
            "Birch Estates",
            base_id=840001,
            active_policy=active_policy,
        ),
    }
    sweep_trigger()
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=reject if job.record_kind == "maintenance_record" else None)
    for customer in customers.values():
        name = customer.portfolio.name
        policy = RetentionPolicy.objects.get(portfolio=customer.portfolio, record_kind="lease")
        version = policy_version_submit(
            policy=policy, retention_days=400, author=customer.staff["property_manager"], reason=f"{name} wants longer"
        )
        hold = legal_hold_place(
            portfolio=customer.portfolio,
            record_kind="tenant_activity",
            placed_by=customer.staff["compliance_reviewer"],
            reason=f"{name} litigation",
        )
        pipeline_pause(actor=operator_user, portfolio_id=customer.pid, reason=f"{name} incident review")
        customer.ids.update(
            policy=list(RetentionPolicy.objects.filter(portfolio=customer.portfolio).values_list("id", flat=True)),
            # The version in review first: the actions below use it.
            version=[
                version.pk,
                *PolicyVersion.objects.filter(policy__portfolio=customer.portfolio)
                .exclude(pk=version.pk)
                .values_list("id", flat=True),
            ],
            hold=[hold.pk],
            job=list(CleanupJob.objects.filter(portfolio_id=customer.pid).values_list("id", flat=True)),
            letter=list(DeadLetter.objects.filter(portfolio_id=customer.pid).values_list("id", flat=True)),
            event=list(
                AuditEvent.objects.filter(
                    Q(details__portfolio_id=customer.pid) | Q(object_type="portfolio", object_id=str(customer.pid))
                ).values_list("id", flat=True)
            ),
            membership=list(Membership.objects.filter(portfolio=customer.portfolio).values_list("id", flat=True)),
        )
    assert all(c.ids["letter"] and c.ids["job"] and c.ids["event"] for c in customers.values())
    assert LedgerEntry.objects.filter(portfolio_id=customers["birch"].pid).exists()
    return customers


def other_of(world: dict[str, Customer], key: str) -> Customer:
    return world["birch" if key == "alder" else "alder"]


def member(world: dict[str, Customer], key: str, role: str) -> User:
    return User.objects.get(username=f"{key}-{role}")  # fresh: no cached scope


def assert_no_trace(body: bytes | str, other: Customer, where: str, *, echo: tuple[str, ...] = ()) -> None:
    """``echo``: what the request itself sent (a search term, a filter value),
    which a page may show back in a form or a link, however encoded; removed
    before looking for anything else."""
    text = body.decode() if isinstance(body, bytes) else body
    for sent in echo:
        words = [re.escape(w) for w in re.split(r"[ =]", sent)]
        text = re.sub(r"(?:\s|\+|%2B|%20|=|%3D)*".join(words), "", text, flags=re.IGNORECASE)
    assert other.marker not in text.lower(), f"{where}: mentions {other.marker!r}"
    for value in other.distinctive_ids():
        assert value not in text, f"{where}: contains {other.marker}'s id {value}"


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
    "/api/v1/dead-letters/?status=": "letter",
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


# --- Console ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["alder", "birch"])
@pytest.mark.parametrize("role", ROLES)
def test_a_member_sees_only_their_customer_in_every_console_view(world, key, role):
    own, other = world[key], other_of(world, key)
    client = Client()
    user = member(world, key, role)
    client.force_login(user)
    sweep = Sweep.objects.get().pk
    pages = [
        "/console/",
        "/console/sweeps/",
        f"/console/sweeps/{sweep}/",
        f"/console/sweeps/{sweep}/proof.csv",
        f"/console/sweeps/{sweep}/proof.json",
        "/console/jobs/",
        f"/console/jobs/{own.ids['job'][0]}/",
        "/console/dead-letters/?status=",
        f"/console/dead-letters/{own.ids['letter'][0]}/",
        "/console/dead-letters/all-matching/?operation=dismiss",
        "/console/workers/",
        "/console/pauses/",
        f"/console/portfolios/{own.pid}/",
        "/console/audit/",
        f"/console/audit/?actor={other.staff['compliance_reviewer'].pk}",
        "/console/search/?q=2026",
        f"/console/search/?q={other.ids['job'][0]}",
        "/console/jobs/?q=2026",
        "/console/dead-letters/?status=&q=2026",
        "/console/jobs/all-matching/?operation=cancel",
        "/console/dead-letters/by-cause/",
        "/console/jobs/?sort=attempts&last=yes",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code in {200, 403}, path
        assert_no_trace(response.content, other, path)
    reaches_console = role == "auditor"
    # The other customer's objects: 404 for a role that reaches the console,
    # and the same 403 as every console page for one that does not.
    for path in (
        f"/console/jobs/{other.ids['job'][0]}/",
        f"/console/dead-letters/{other.ids['letter'][0]}/",
        f"/console/portfolios/{other.pid}/",
    ):
        response = client.get(path)
        assert response.status_code == (404 if reaches_console else 403), path
        assert_no_trace(response.content, other, path)
    # Filtering the audit log by the other customer's staff by name shows nothing but the name typed in.
    name = other.staff["compliance_reviewer"].username
    response = client.get(f"/console/audit/?actor={name}")
    assert_no_trace(response.content, other, "audit by name", echo=(f'value="{name}"',))
    if response.status_code == 200:
        assert not list(response.context["page"])
    # Filtering by the other customer's portfolio shows nothing but the filter typed in.
    response = client.get(f"/console/dead-letters/?portfolio={other.pid}&status=")
    assert_no_trace(response.content, other, "inbox", echo=(f'value="{other.pid}"', f"portfolio={other.pid}"))
    if response.status_code == 200:
        assert not list(response.context["page"])
    # The letters by cause, narrowed to the other customer's portfolio: nothing but the filter typed in.
    response = client.get(f"/console/dead-letters/by-cause/?portfolio={other.pid}")
    assert_no_trace(response.content, other, "by cause", echo=(f"portfolio={other.pid}",))
    if response.status_code == 200:
        assert response.context["groups"] == []
    # Every role lands at /console/: the overview, or a landing page of where its roles lead.
    landing = client.get("/console/")
    assert landing.status_code == 200
    assert (b'data-testid="landing"' in landing.content) == (not reaches_console)
    assert_no_trace(landing.content, other, "landing")
    assert client.get("/console/audit/").status_code == 200  # every role reads its audit trail

    audit = client.get("/console/audit/")
    assert {e.pk for e in audit.context["page"]} == set(own.ids["event"])
    if reaches_console:
        inbox = client.get("/console/dead-letters/?status=")
        assert [letter.pk for letter in inbox.context["page"]] == own.ids["letter"]
        overview_page = client.get("/console/")
        assert overview_page.context["f"]["dead_letters"]["open"] == 1
        assert [p["portfolio_id"] for p in overview_page.context["f"]["pauses"]] == [own.pid]

    # The other customer's letter cannot be acted on from the console either.
    response = client.post(
        "/console/dead-letters/action/",
        {"operation": "dismiss", "letter": other.ids["letter"][0], "reason": "not needed any more", "confirm": "yes"},
    )
    assert response.status_code == 403
    response = client.post(
        "/console/dead-letters/all-matching/",
        {"operation": "dismiss", "portfolio": other.pid, "reason": "not needed any more", "confirm": "yes"},
    )
    assert response.status_code in {302, 403}
    response = client.post(
        "/console/pause/", {"operation": "resume", "portfolio": other.pid, "reason": "incident is over now"}
    )
    # Nor can the other customer's jobs be run now or cancelled.
    for operation in ("run_now", "cancel"):
        response = client.post(
            f"/console/jobs/{other.ids['job'][0]}/action/", {"operation": operation, "reason": "not needed any more"}
        )
        assert response.status_code in {403, 404}
        response = client.post(
            "/console/jobs/selected/",
            {"operation": operation, "job": other.ids["job"], "reason": "not needed any more"},
        )
        assert response.status_code == 403
    if reaches_console:
        groups = client.get("/console/dead-letters/by-cause/")
        assert sum(g["n"] for g in groups.context["groups"]) == 1  # their own open letter only
    assert not AuditEvent.objects.filter(object_type="job").exists()
    assert DeadLetter.objects.get(pk=other.ids["letter"][0]).status == "open"
    assert PipelinePause.objects.active().filter(portfolio_id=other.pid).exists()


def test_every_console_route_is_covered_by_the_isolation_test():
    from cleanup_ops import console_urls as urls

    covered = {
        "overview", "sweeps", "sweep", "sweep_proof", "jobs", "job", "dead_letters", "dead_letter",
        "dead_letter_action", "dead_letters_bulk", "workers", "pauses", "portfolio", "audit", "pause",
        "job_action", "jobs_bulk", "search", "dead_letter_groups", "jobs_selected",
    }  # fmt: skip
    assert {p.name for p in urls.urlpatterns} == covered


def test_a_global_pause_shows_to_a_customer_without_the_operators_reason(world, operator_user):
    pipeline_pause(actor=operator_user, reason="Birch Estates asked us to stop everything")
    client = Client()
    client.force_login(member(world, "alder", "auditor"))
    page = client.get("/console/")
    assert page.context["f"]["paused"] is True
    assert_no_trace(page.content, world["birch"], "/console/")
    api = APIClient()
    api.force_authenticate(member(world, "alder", "auditor"))
    assert_no_trace(api.get("/api/v1/metrics/").content, world["birch"], "/api/v1/metrics/")


# --- Admin --------------------------------------------------------------------


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
    autocomplete = client.get(
        "/admin/autocomplete/?app_label=retention&model_name=legalhold&field_name=property&term=Tower"
    ).json()
    assert [r["text"] for r in autocomplete["results"]] == ["Alder Tower"]


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


# --- Four-eyes within a customer --------------------------------------------------


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


# --- The database keeps a record's portfolio its property's ---------------------


@pytest.mark.postgres
def test_postgres_rejects_a_record_whose_portfolio_is_not_its_propertys(world):
    alder, birch = world["alder"], world["birch"]
    for model, extra in (
        (Lease, {"unit": "9", "tenant_name": "T", "started_on": OLD.date()}),
        (MaintenanceRecord, {"summary": "s", "opened_at": OLD}),
        (TenantActivity, {"activity_type": "login", "occurred_at": OLD}),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            model.objects.create(portfolio_id=birch.pid, property_id=alder.prop.pk, **extra)
    with pytest.raises(IntegrityError), transaction.atomic():
        Lease.objects.filter(pk=alder.ids["running_lease"][0]).update(portfolio_id=birch.pid)
    with pytest.raises(IntegrityError), transaction.atomic():
        Property.objects.filter(pk=alder.prop.pk).update(portfolio_id=birch.pid)  # it still has records
    Lease.objects.create(
        portfolio_id=alder.pid, property_id=alder.prop.pk, unit="9", tenant_name="T", started_on=OLD.date()
    )


@pytest.mark.postgres
def test_the_migration_refuses_existing_mismatched_rows_and_counts_them(world):
    import importlib

    migration = importlib.import_module("properties.migrations.0003_record_portfolio_matches_property")
    with connection.cursor() as cursor:
        # Django's own keys are deferred: settle them so the table may be altered.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "ALTER TABLE properties_maintenancerecord"
            " DROP CONSTRAINT properties_maintenancerecord_property_portfolio_fk"
        )
        cursor.execute(
            "UPDATE properties_maintenancerecord SET portfolio_id = %s WHERE id IN (%s, %s)",
            [world["birch"].pid, *world["alder"].ids["maintenance"]],
        )

    class Editor:
        connection = connection

    with pytest.raises(RuntimeError, match=r"properties_maintenancerecord: 2 row\(s\)"):
        migration.check_existing_rows(None, Editor())


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
