"""Bad input to the console and the admin: never a server error, never a write.

Hypothesis (fixed seed, bounded examples) fills every filter, form field and
id parameter of the console's pages and forms and of every admin changelist
(its filters, its date hierarchy, search, ordering, paging, and lookups it
does not offer) with hostile values — control characters, NUL, 5000-digit
numbers, floats, ``1e400``, superscript digits, unbalanced regular
expressions, out-of-range dates, over-long text — and checks that nothing
answers 5xx and nothing in the database changed. Forms that would write
when every field is valid always get at least one hostile field, so any
write is a bug. (The API is fuzzed from its schema by
``test_api_schemathesis.py``.)

The named cases of issue 19 (item 5) are regression tests below: each
answers 4xx with a message naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.utils import DatabaseError
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, PipelinePause, Sweep
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, Portfolio, Property
from retention.admin_site import changelist_lookups
from retention.models import AuditEvent, LegalHold, PolicyVersion, RetentionPolicy
from retention.services import (
    legal_hold_place,
    membership_grant,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

from .conftest import make_records, utc
from .testenv import examples

OLD = utc("2020-01-01T00:00:00Z")
# Per form or query: each example is a request through the whole stack (25 in ci).
EXAMPLES = examples(cost=20)

pytestmark = pytest.mark.django_db

HOSTILE_WORDS = [
    "",
    "0",
    "-1",
    "1.5",
    "755.0",
    "1e400",
    "inf",
    "NaN",
    "²",
    "٣",
    "9" * 20,
    "9" * 5000,
    "(a",
    "[",
    "%",
    "'; --",
    "\x00",
    "a\x00b",
    "\x1b[31m",
    "2026-13-45",
    "99999",
    "true",
    "null",
    "x" * 3000,
]
hostile = st.one_of(
    st.sampled_from(HOSTILE_WORDS),
    st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
# A value that is bad for every field: none of them takes it.
always_bad = st.sampled_from(["\x00", "a\x00b", "9" * 5000, "x\x07" * 1500, "\x1b[2J"])


def run(fn: Any, strategy: st.SearchStrategy[Any]) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(strategy)
    def check(value: Any) -> None:
        fn(value)

    check()


def params_for(names: list[str], *, bad: list[str] | None = None) -> st.SearchStrategy[dict[str, str]]:
    """Some of ``names`` with hostile values; with ``bad``, at least one of
    those gets a value no field accepts."""
    base = st.dictionaries(st.sampled_from(names), hostile, max_size=len(names))
    if not bad:
        return base
    return st.tuples(base, st.sampled_from(bad), always_bad).map(lambda t: {**t[0], t[1]: t[2]})


# --- The world --------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    with time_machine.travel("2026-08-21T02:05:00Z", tick=False), django_db_blocker.unblock():
        with transaction.atomic():
            yield build()
            transaction.set_rollback(True)


def build() -> dict[str, Any]:
    root = User.objects.create_superuser(username="root", password="pw-for-tests")
    operator = User.objects.create_user(username="op", password="pw-for-tests", is_staff=True)
    operator.groups.add(Group.objects.get(name="operator"))
    manager = User.objects.create_user(username="pm", password="pw-for-tests", is_staff=True)
    reviewer = User.objects.create_user(username="cr", password="pw-for-tests", is_staff=True)
    portfolio = Portfolio.objects.create(name="Acme", slug="acme")
    prop = Property.objects.create(portfolio=portfolio, name="Harbour House")
    membership_grant(user=manager, portfolio=portfolio, role="property_manager", granted_by=None)
    membership_grant(user=reviewer, portfolio=portfolio, role="compliance_reviewer", granted_by=None)
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="first for the tests")
    policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
    make_records(prop, "lease", 3, ended=OLD)
    sweep_trigger()

    def reject(job_id: int) -> None:
        raise DownstreamError(400)

    job_run_slice(job_id=CleanupJob.objects.get().pk, before_batch=reject)
    in_review = policy_version_submit(policy=policy, retention_days=400, author=manager, reason="longer for the tests")
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="subpoena for the tests")
    return {
        "root": root,
        "operator": operator,
        "portfolio": portfolio,
        "prop": prop,
        "policy": policy,
        "version": in_review,
        "hold": hold,
        "letter": DeadLetter.objects.get(),
        "job": CleanupJob.objects.get(),
        "sweep": Sweep.objects.get(),
    }


def snapshot() -> tuple[Any, ...]:
    """Rows per table, the highest id, and the states a decision changes."""
    counts = []
    for model in apps.get_models():
        if model._meta.db_table in {"django_session"}:
            continue
        qs = model._default_manager.all()
        counts.append((model._meta.label, qs.count()))
    return (
        tuple(counts),
        tuple(DeadLetter.objects.values_list("status", flat=True)),
        tuple(PolicyVersion.objects.order_by("pk").values_list("status", flat=True)),
        LegalHold.objects.active().count(),
        PipelinePause.objects.active().count(),
    )


def client_for(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def expect_no_server_error(response: Any, where: str) -> None:
    assert response.status_code < 500, f"{where}: {response.status_code}"


# --- The console --------------------------------------------------------------------

CONSOLE_GET = {
    "/console/": ["hours"],
    "/console/sweeps/": ["page"],
    "/console/jobs/": ["sweep", "state", "portfolio", "kind", "category", "job_kind", "before"],
    "/console/dead-letters/": ["status", "category", "portfolio", "sweep", "older_than_hours", "page"],
    "/console/audit/": ["action", "object_type", "object_id", "actor", "page"],
    "/console/dead-letters/all-matching/": [
        "operation",
        "status",
        "category",
        "portfolio",
        "sweep",
        "older_than_hours",
        "reason",
    ],
}
CONSOLE_IDS = [
    "/console/sweeps/{}/",
    "/console/sweeps/{}/proof.csv",
    "/console/jobs/{}/",
    "/console/dead-letters/{}/",
    "/console/portfolios/{}/",
]


def test_no_console_filter_answers_a_server_error_or_writes(world):
    client = client_for(world["operator"])
    before = snapshot()
    for path, names in CONSOLE_GET.items():
        run(lambda params, path=path: expect_no_server_error(client.get(path, params), f"GET {path} {params!r}"),
            params_for(names))  # fmt: skip
    for template in CONSOLE_IDS:
        run(
            lambda value, template=template: expect_no_server_error(
                client.get(template.format(value)), f"GET {template} {value!r}"
            ),
            hostile.filter(lambda v: "/" not in v and "?" not in v and "#" not in v),
        )
    assert snapshot() == before


CONSOLE_POST = {
    # path: (fields, fields of which one is made bad, fixed fields)
    "/console/dead-letters/action/": (["operation", "letter", "reason", "confirm", "next"], ["letter", "reason"], {}),
    "/console/dead-letters/all-matching/": (
        ["operation", "category", "portfolio", "sweep", "older_than_hours", "reason", "confirm", "expected"],
        ["reason", "portfolio", "sweep", "older_than_hours", "expected"],
        {},
    ),
    "/console/pause/": (["operation", "portfolio", "reason", "next"], ["portfolio", "reason"], {}),
}


def test_no_console_form_answers_a_server_error_or_writes(world):
    client = client_for(world["operator"])
    before = snapshot()
    for path, (names, bad, fixed) in CONSOLE_POST.items():
        run(
            lambda params, path=path, fixed=fixed: expect_no_server_error(
                client.post(path, {**fixed, **params}), f"POST {path} {params!r}"
            ),
            params_for(names, bad=bad),
        )
    assert snapshot() == before


# --- The admin ----------------------------------------------------------------------


def changelist_params(model: type, model_admin: Any, request: Any) -> list[str]:
    """The lookups the list offers, plus lookups Django would apply on any own
    field (regex, year, contains, in) and the changelist's own parameters."""
    names = list(changelist_lookups(model_admin, request))
    for field in model._meta.concrete_fields[:6]:
        names += [f"{field.name}__regex", f"{field.name}__year", f"{field.attname}__in", f"{field.name}__gt"]
    return [*names, "q", "o", "p", "all", "_to_field"]


def test_no_admin_changelist_answers_a_server_error_or_writes(world, rf):
    client = client_for(world["root"])
    before = snapshot()
    request = rf.get("/")
    request.user = world["root"]
    for model, model_admin in admin.site._registry.items():
        path = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        names = changelist_params(model, model_admin, request)
        run(lambda params, path=path: expect_no_server_error(client.get(path, params), f"GET {path} {params!r}"),
            params_for(names))  # fmt: skip
    assert snapshot() == before


def test_no_admin_id_or_form_answers_a_server_error_or_writes(world):
    client = client_for(world["root"])
    before = snapshot()
    ids = hostile.filter(lambda v: v and not set(v) & set("/?#%") and v not in {".", ".."})
    for model in admin.site._registry:
        opts = model._meta
        for view in ("change", "history", "delete"):
            run(
                lambda value, name=f"admin:{opts.app_label}_{opts.model_name}_{view}": expect_no_server_error(
                    client.get(reverse(name, args=[value])), f"GET {name} {value!r}"
                ),
                ids,
            )
    forms = {
        reverse("admin:retention_retentionpolicy_new_version", args=[world["policy"].pk]): (
            ["retention_days", "enabled", "reason"],
            ["retention_days", "reason"],
        ),
        reverse("admin:retention_policyversion_review", args=[world["version"].pk]): (["decision", "note"], ["note"]),
        reverse("admin:retention_legalhold_release", args=[world["hold"].pk]): (["reason"], ["reason"]),
        reverse("admin:retention_legalhold_add"): (
            ["portfolio", "property", "record_kind", "record_id", "reason"],
            ["portfolio", "property", "record_id", "reason"],
        ),
        reverse("admin:retention_retentionpolicy_add"): (["portfolio", "record_kind"], ["portfolio"]),
        reverse("admin:retention_membership_add"): (["user", "portfolio", "role"], ["user", "portfolio"]),
    }
    inline = {"versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    for path, (names, bad) in forms.items():
        run(lambda params, path=path: expect_no_server_error(client.get(path, params), f"GET {path} {params!r}"),
            params_for(names))  # fmt: skip
        run(
            lambda params, path=path: expect_no_server_error(
                client.post(path, {**inline, **params}), f"POST {path} {params!r}"
            ),
            params_for(names, bad=bad),
        )
    assert snapshot() == before


# --- Regression: issue 19, item 5 -----------------------------------------------------


def assert_refused_naming(response: Any, field: str) -> None:
    assert 400 <= response.status_code < 500, response.status_code
    assert field in response.content.decode("utf-8", "replace"), response.content[:300]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/console/dead-letters/?older_than_hours=200000000", "older_than_hours"),
        ("/console/dead-letters/all-matching/?operation=dismiss&older_than_hours=200000000", "older_than_hours"),
        ("/console/audit/?action=a%00b", "action"),
        ("/console/audit/?object_type=%00", "object_type"),
        ("/console/audit/?object_id=1%00", "object_id"),
        ("/console/jobs/?before=%C2%B2", "before"),
    ],
)
def test_a_console_filter_out_of_range_or_with_nul_is_a_400_naming_it(world, path, field):
    client = client_for(world["operator"])
    before = snapshot()
    assert_refused_naming(client.get(path), field)
    assert snapshot() == before


@pytest.mark.parametrize("letter", ["²", "9" * 5000, "1.5", "-3"])
def test_a_dead_letter_action_with_a_letter_that_is_not_an_id_is_a_400_naming_it(world, letter):
    client = client_for(world["operator"])
    before = snapshot()
    response = client.post(
        "/console/dead-letters/action/",
        {"operation": "dismiss", "letter": [str(world["letter"].pk), letter], "reason": "long enough reason"},
    )
    assert_refused_naming(response, "letter")
    assert snapshot() == before


def test_the_api_refuses_an_age_filter_beyond_a_century_naming_it(world):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(world["operator"])
    response = api.get("/api/v1/dead-letters/?older_than_hours=200000000")
    assert response.status_code == 400 and "older_than_hours" in response.json()


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_legal_hold_form_with_a_property_that_is_not_an_id_is_no_server_error(world, method):
    client = client_for(world["root"])
    before = snapshot()
    path = reverse("admin:retention_legalhold_add")
    data = {"portfolio": world["portfolio"].pk, "property": "abc", "reason": "subpoena for the tests"}
    response = getattr(client, method)(path, data)
    assert response.status_code == 200
    if method == "post":
        assert "property" in response.context["adminform"].form.errors
    assert snapshot() == before


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("created_at__year=" + "9" * 20, "created_at__year"),
        ("created_at__year=9999", "created_at__year"),
        ("q=a%00b", "q"),
        ("unit__regex=(a", "unit__regex"),
        ("ended_at__year=99999", "ended_at__year"),
    ],
)
def test_an_admin_changelist_lookup_it_does_not_offer_or_a_bad_value_is_a_400_naming_it(world, query, field):
    model = "lease" if query.startswith(("unit", "ended_at")) else "auditevent"
    app = "properties" if model == "lease" else "retention"
    response = client_for(world["root"]).get(f"/admin/{app}/{model}/?{query}")
    assert_refused_naming(response, field)


def test_admin_autocomplete_with_nul_in_the_term_is_a_400_naming_it(world):
    response = client_for(world["root"]).get(
        "/admin/autocomplete/?app_label=retention&model_name=legalhold&field_name=property&term=a%00"
    )
    assert_refused_naming(response, "term")


def test_a_dismiss_that_fails_on_a_database_error_reports_the_error_not_no_longer_open(world, monkeypatch):
    from cleanup_ops.recovery import operator

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("simulated")

    monkeypatch.setattr(operator.DeadLetter, "mark_resolved", broken)
    client = client_for(world["operator"])
    response = client.post(
        "/console/dead-letters/action/",
        {"operation": "dismiss", "letter": world["letter"].pk, "reason": "not needed any more", "confirm": "yes"},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert any("could not be dismissed" in m and "DatabaseError" in m for m in shown), shown
    assert not any("no longer open" in m for m in shown), shown
    assert DeadLetter.objects.get(pk=world["letter"].pk).status == "open"


def test_every_lookup_a_real_filter_uses_is_accepted(world):
    """The guard refuses what the list does not offer, never what it does."""
    client = client_for(world["root"])
    pid = world["portfolio"].pk
    for path in (
        f"/admin/properties/lease/?portfolio__id__exact={pid}",
        "/admin/retention/legalhold/?released_at__isempty=1&record_kind__exact=lease",
        "/admin/retention/auditevent/?created_at__year=2026&created_at__month=8&created_at__day=21",
        f"/admin/retention/policyversion/?policy__portfolio__id__exact={pid}&status__exact=in_review",
        "/admin/retention/auditevent/?q=1&o=1&p=1",
    ):
        assert client.get(path).status_code == 200, path
    assert Lease.objects.exists() and AuditEvent.objects.exists() and RetentionPolicy.objects.exists()


# --- Regression: issue 30, item 6 (and its bad-input coverage of every route) ---------

NUL = "%00"
SURROGATE = "%ED%A0%80"  # U+D800 encoded as UTF-8 would be: a lone surrogate, not text
DEEP_JSON = "[" * 50_000 + "]" * 50_000


def every_route_with(value: str) -> list[str]:
    """Each route of the resolver with ``value`` in every parameter, or (a
    route without parameters) appended to its path."""
    from .route_enumeration import fill, routes

    urls = []
    for route in routes():
        if route.params:
            urls.append(fill(route, dict.fromkeys(route.params, value)))
        else:
            path = fill(route, {}).split("?")[0]
            urls.append(path + value if path.endswith("/") else f"{path}/{value}")
    return sorted(set(urls))


@pytest.mark.parametrize("value", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
def test_a_nul_or_a_lone_surrogate_in_the_path_of_any_route_is_a_400_naming_the_path(world, value):
    clients = {user: client_for(world[user]) for user in ("root", "operator")}
    before = snapshot()
    for user, client in clients.items():
        for url in every_route_with(value):
            for method in ("get", "post"):
                response = getattr(client, method)(url)
                assert response.status_code == 400, f"{method.upper()} {url} as {user}: {response.status_code}"
                assert b"path" in response.content, url
    assert snapshot() == before


def test_an_admin_object_id_that_is_nul_is_a_400_not_a_server_error(world):
    for model in ("django_q/failure", "django_q/success", "retention/legalhold"):
        response = client_for(world["root"]).get(f"/admin/{model}/{NUL}/change/")
        assert_refused_naming(response, "path")


def test_json_nested_50000_deep_posted_to_any_route_is_a_4xx_never_a_server_error(world):
    """Any logged-in user could send it: the session CSRF check parses the
    body before permissions. Every API route answers 4xx; no route 5xx."""
    from .route_enumeration import fill, routes

    clients = [client_for(world["operator"]), client_for(User.objects.get(username="pm"))]
    before = snapshot()
    for client in clients:
        client.handler.enforce_csrf_checks = True  # the path that parsed the body first…
        client.cookies["csrftoken"] = "a" * 32  # …once the browser holds a CSRF cookie
        for route in routes():
            url = fill(route, {p: ("json" if p == "format" else "1") for p in route.params})
            response = client.post(url, DEEP_JSON, content_type="application/json")
            assert response.status_code < 500, f"POST {url}: {response.status_code}"
            if url.startswith("/api/") and route.name != "api-root":
                assert 400 <= response.status_code < 500, f"POST {url}: {response.status_code}"
    assert snapshot() == before


def test_a_deeply_nested_json_body_is_a_400_that_says_so(world):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(world["operator"])
    response = api.post(
        f"/api/v1/dead-letters/{world['letter'].pk}/redrive/", DEEP_JSON, content_type="application/json"
    )
    assert response.status_code == 400 and "nested too deeply" in response.json()["detail"]


@pytest.mark.parametrize("field", ["record_kind", "reason"])
def test_a_lone_surrogate_in_a_json_field_is_a_400_that_does_not_quote_it(world, field):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(world["root"])
    body = {"portfolio": world["portfolio"].pk, "record_kind": "lease", "reason": "a long enough reason"}
    raw = json.dumps(body).replace(f'"{field}": "', f'"{field}": "\\ud800', 1)
    before = snapshot()
    response = api.post("/api/v1/legal-holds/", raw, content_type="application/json")
    assert response.status_code == 400
    assert "surrogate" in response.json()["detail"]
    assert snapshot() == before
