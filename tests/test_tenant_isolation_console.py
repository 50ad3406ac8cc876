"""Tenant isolation in the console: a member of one customer, in every
customer role, sees nothing of the other customer in any console view,
and cannot act on the other's letters, jobs or pauses.
"""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from cleanup_ops.models import DeadLetter, PipelinePause, Sweep
from cleanup_ops.recovery.operator import pipeline_pause
from retention.models import AuditEvent

from . import tenant_world
from .tenant_world import ROLES, assert_no_trace, member, other_of

pytestmark = pytest.mark.django_db

world = tenant_world.world  # the fixture: Alder and Birch (tests/tenant_world.py)


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
        "/console/jobs/export.csv",
        "/console/dead-letters/export.csv?status=",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code in {200, 403}, path
        body = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
        assert_no_trace(body, other, path)
    # The cluster and limit decisions are the pipeline's, not a customer's: no member may make one.
    for path in ("/console/workers/control/", "/console/workers/limits/"):
        assert client.post(path, {"reason": "a member trying the operators' tools"}).status_code == 403, path
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
    # The filter typed in comes back in the form, the links and its own token ("portfolio: <id>").
    echo = (f'value="{other.pid}"', f"portfolio={other.pid}", f"portfolio: {other.pid}")
    assert_no_trace(response.content, other, "inbox", echo=echo)
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
        "job_action", "jobs_bulk", "search", "dead_letter_groups", "jobs_selected", "jobs_export",
        "dead_letters_export", "cluster_control", "limit_change",
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
