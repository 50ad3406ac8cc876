"""Every endpoint and console view by each role and anonymous → the expected status."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.recovery.classification import DownstreamError
from properties.models import Portfolio
from retention.models import LegalHold, Membership, PolicyVersion, RetentionPolicy
from retention.services import legal_hold_place, policy_version_submit

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

ROLES = ["property_manager", "compliance_reviewer", "operator", "auditor", "anonymous"]
PM, CR, OP, AU, AN = ROLES
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def world(portfolio, prop, active_policy, time_machine, reviewer):
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 3, ended=OLD)
    from cleanup_ops.schedule import sweep_trigger

    sweep_trigger()

    def reject(job_id: int) -> None:
        raise DownstreamError(400)

    job_run_slice(job_id=CleanupJob.objects.get().pk, before_batch=reject)
    author = make_user("author", "property_manager")
    policy = RetentionPolicy.objects.get()
    version = policy_version_submit(policy=policy, retention_days=400, author=author, reason="longer for the tests")
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="subpoena for the tests")
    return {
        "sweep": Sweep.objects.get().pk,
        "job": CleanupJob.objects.get().pk,
        "letter": DeadLetter.objects.get().pk,
        "policy": policy.pk,
        "version": version.pk,
        "hold": hold.pk,
        "portfolio": portfolio.pk,
    }


def ok(*roles: str, status: int = 200, other: int = 403, anon: int = 401) -> dict[str, int]:
    return {role: (status if role in roles else anon if role == AN else other) for role in ROLES}


API_GETS = {
    "/api/v1/sweeps/": ok(OP, AU),
    "/api/v1/sweeps/{sweep}/": ok(OP, AU),
    "/api/v1/sweeps/{sweep}/proof/": ok(OP, AU),
    "/api/v1/jobs/": ok(OP, AU),
    "/api/v1/jobs/{job}/": ok(OP, AU),
    "/api/v1/dead-letters/": ok(OP, AU),
    "/api/v1/dead-letters/{letter}/": ok(OP, AU),
    "/api/v1/policies/": ok(PM, CR, OP, AU),
    "/api/v1/policy-versions/": ok(PM, CR, OP, AU),
    "/api/v1/legal-holds/": ok(PM, CR, OP, AU),
    "/api/v1/audit-events/": ok(PM, CR, OP, AU),
    "/api/v1/metrics/": ok(OP, AU),
    "/api/v1/schema/": ok(PM, CR, OP, AU),
}

# Bodies are chosen so the permitted role gets past the permission check and
# is stopped (or served) by validation, without changing the fixture world.
API_POSTS = {
    ("/api/v1/sweeps/", '{"slot": "bad"}'): ok(OP, status=400),
    ("/api/v1/dead-letters/{letter}/redrive/", '{"reason": "short"}'): ok(OP, status=400),
    ("/api/v1/dead-letters/{letter}/dismiss/", '{"reason": "short"}'): ok(OP, status=400),
    ("/api/v1/policies/{policy}/versions/", '{"retention_days": 0, "reason": "x"}'): ok(PM, status=400),
    ("/api/v1/policy-versions/{version}/reject/", '{"note": ""}'): ok(CR, status=400),
    ("/api/v1/legal-holds/", '{"portfolio": {portfolio}, "reason": ""}'): ok(CR, status=400),
    ("/api/v1/legal-holds/{hold}/release/", '{"reason": ""}'): ok(CR, status=400),
    ("/api/v1/pause/", '{"reason": "short"}'): ok(OP, status=400),
}

# OPTIONS on the POST routes: the read permission of the viewset the route
# belongs to; the pause routes have no read, so one of their own permissions.
API_POST_OPTIONS = {
    "/api/v1/sweeps/": ok(OP, AU),
    "/api/v1/dead-letters/{letter}/redrive/": ok(OP, AU),
    "/api/v1/dead-letters/{letter}/dismiss/": ok(OP, AU),
    "/api/v1/policies/{policy}/versions/": ok(PM, CR, OP, AU),
    "/api/v1/policy-versions/{version}/reject/": ok(PM, CR, OP, AU),
    "/api/v1/legal-holds/": ok(PM, CR, OP, AU),
    "/api/v1/legal-holds/{hold}/release/": ok(PM, CR, OP, AU),
    "/api/v1/pause/": ok(OP),
}

CONSOLE_GETS = {
    # Everyone logged in lands somewhere: the overview, or (a customer's
    # manager or reviewer) a landing page with where their roles lead.
    "/console/": ok(PM, CR, OP, AU, anon=302),
    "/console/search/?q=acme": ok(PM, CR, OP, AU, anon=302),
    "/console/sweeps/{sweep}/": ok(OP, AU, anon=302),
    "/console/sweeps/{sweep}/proof.csv": ok(OP, AU, anon=302),
    "/console/dead-letters/": ok(OP, AU, anon=302),
    "/console/audit/": ok(PM, CR, OP, AU, anon=302),
    "/console/sweeps/": ok(OP, AU, anon=302),
    "/console/jobs/": ok(OP, AU, anon=302),
    "/console/jobs/{job}/": ok(OP, AU, anon=302),
    "/console/dead-letters/{letter}/": ok(OP, AU, anon=302),
    "/console/dead-letters/all-matching/?operation=redrive": ok(OP, anon=302),
    "/console/dead-letters/all-matching/?operation=dismiss": ok(OP, anon=302),
    "/console/jobs/all-matching/?operation=run_now": ok(OP, anon=302),
    "/console/jobs/all-matching/?operation=cancel": ok(OP, anon=302),
    "/console/workers/": ok(OP, AU, anon=302),
    "/console/pauses/": ok(OP, AU, anon=302),
    "/console/portfolios/{portfolio}/": ok(OP, AU, anon=302),
}

CONSOLE_POSTS = [
    (
        "/console/dead-letters/action/",
        {"operation": "redrive", "letter": "{letter}", "reason": ""},
        ok(OP, status=400, anon=302),
    ),
    ("/console/pause/", {"operation": "pause", "reason": "short"}, ok(OP, status=302, anon=302)),
    ("/console/jobs/{job}/action/", {"operation": "run_now", "reason": "short"}, ok(OP, status=400, anon=302)),
]


def user_for(role: str):  # type: ignore[no-untyped-def]
    if role == AN:
        return None
    user = make_user(f"u-{role}", role)
    if role == PM:
        # A property manager is a customer's staff member: the group alone
        # grants no portfolio (retention.scoping), a membership does.
        for portfolio in Portfolio.objects.all():
            Membership.objects.create(user=user, portfolio=portfolio, role=PM)
    return user


def fill(template: str, world: dict[str, int]) -> str:
    for key, value in world.items():
        template = template.replace("{" + key + "}", str(value))
    return template


@pytest.mark.parametrize("role", ROLES)
def test_every_api_endpoint_answers_each_role_as_expected(world, role):
    client = APIClient()
    if (user := user_for(role)) is not None:
        client.force_authenticate(user)
    seen = {}
    for path, expected in API_GETS.items():
        seen[("GET", path)] = (client.get(fill(path, world)).status_code, expected[role])
        # HEAD and OPTIONS are reads: the same role check as GET, never less.
        seen[("HEAD", path)] = (client.head(fill(path, world)).status_code, expected[role])
        seen[("OPTIONS", path)] = (client.options(fill(path, world)).status_code, expected[role])
    for (path, body), expected in API_POSTS.items():
        response = client.post(fill(path, world), fill(body, world), content_type="application/json")
        seen[("POST", path)] = (response.status_code, expected[role])
        # OPTIONS describes the route: it needs the route's read permission,
        # or for a write-only action route, one of the view's own permissions.
        response = client.options(fill(path, world))
        seen[("OPTIONS", path)] = (response.status_code, API_POST_OPTIONS[path][role])
    wrong = {k: v for k, v in seen.items() if v[0] != v[1]}
    assert not wrong, f"{role}: (got, expected) {wrong}"
    # Nothing the matrix sent changed the world.
    assert DeadLetter.objects.get().status == "open" and CleanupJob.objects.count() == 1
    assert PolicyVersion.objects.filter(status="in_review").count() == 1 and LegalHold.objects.count() == 1


@pytest.mark.parametrize("role", ROLES)
def test_every_console_view_answers_each_role_as_expected(world, role):
    client = Client()
    if (user := user_for(role)) is not None:
        client.force_login(user)
    seen = {}
    for path, expected in CONSOLE_GETS.items():
        seen[("GET", path)] = (client.get(fill(path, world)).status_code, expected[role])
    for path, form, expected in CONSOLE_POSTS:
        data = {k: fill(v, world) for k, v in form.items()}
        seen[("POST", path)] = (client.post(fill(path, world), data).status_code, expected[role])
    wrong = {k: v for k, v in seen.items() if v[0] != v[1]}
    assert not wrong, f"{role}: (got, expected) {wrong}"
    assert DeadLetter.objects.get().status == "open"
    assert not CleanupJob.objects.filter(state="pending").exists()


def test_prometheus_metrics_need_an_allowed_address_or_the_token(world, settings):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    response = Client().get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert response.status_code == 200
    assert b'retention_jobs{state="dead"} 1.0' in response.content
    assert b"retention_dead_letters_open 1.0" in response.content


@pytest.mark.parametrize(
    "header",
    [
        "HTTP_X_FORWARDED_FOR",
        "HTTP_FORWARDED",
        "HTTP_X_REAL_IP",
        # What the documented TLS proxy sends (SECURE_PROXY_SSL_HEADER), and nothing else:
        "HTTP_X_FORWARDED_PROTO",
        "HTTP_X_FORWARDED_HOST",
        "HTTP_X_FORWARDED_PORT",
        "HTTP_VIA",
    ],
)
def test_metrics_behind_a_proxy_on_the_same_host_need_the_token_even_from_loopback(world, settings, header):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    proxied = {"REMOTE_ADDR": "127.0.0.1", header: "https" if header.endswith("PROTO") else "203.0.113.9"}
    assert Client().get("/metrics", **proxied).status_code == 403
    assert Client().get("/metrics", **proxied, HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    response = Client().get("/metrics", **proxied, HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert response.status_code == 200
    # Without a token configured, a proxied request has no way in at all.
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", **proxied, HTTP_AUTHORIZATION="Bearer ").status_code == 403


def test_a_non_ascii_authorization_header_on_metrics_is_a_403_not_a_500(world, settings):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    response = Client().get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cr\u00e9t")
    assert response.status_code == 403


def test_metrics_trust_no_address_unless_the_operator_lists_one(world, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_IPS = []
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
