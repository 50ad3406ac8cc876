"""Every answer under /api/ is JSON, errors included (retention.apierrors), and
the API refuses what it does not document: strict query parameters and
strict JSON types (retention.apiutils, retention.filters).

The enumeration walks Django's URL resolver (tests/route_enumeration.py):
every route under api/, every method, answered by an anonymous caller, by a
caller holding every role (an id that does not exist), and with every view
made to fail (a 500). None of them may answer HTML.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpResponseBase
from django.test import Client
from rest_framework.test import APIClient
from rest_framework.views import APIView

from retention.apierrors import MAX_URI_LENGTH

from .conftest import make_user
from .crawler_world import MISSING
from .route_enumeration import Route, fill, routes

pytestmark = pytest.mark.django_db

ROLES = ("property_manager", "compliance_reviewer", "operator", "auditor")
METHODS = ("get", "post", "put", "patch", "delete", "options", "head")


def json_error(response: HttpResponseBase) -> dict[str, Any]:
    """The body of an error answer, which must be a JSON object."""
    assert response.status_code >= 400, response.status_code
    content_type = response.get("Content-Type", "")
    assert content_type.split(";")[0] == "application/json", (response.status_code, content_type)
    if not response.content:  # HEAD: the headers say JSON, there is no body
        return {}
    body = response.json()  # type: ignore[attr-defined]
    assert isinstance(body, dict) and body, body
    return body


@pytest.fixture
def everyone() -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user("api-errors-all-roles", *ROLES))
    return client


def api_routes() -> list[Route]:
    found = [route for route in routes() if route.pattern.lstrip("^").startswith("api/")]
    assert len(found) > 20, [route.pattern for route in found]  # the router's routes, not three
    return found


def url_of(route: Route) -> str:
    values = {name: str(MISSING) for name in route.params}
    values |= {"format": "json", "rest": "no-such-route/"}
    return fill(route, {name: values[name] for name in route.params})


# --- Paths the router does not match -----------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/abc/",
        "/api/v1/jobs/-1/",
        "/api/v1/jobs/1.5/",
        "/api/v1/jobs/123456789012345678901/",  # 21 digits: beyond any id
        "/api/v1/dead-letters/abc/redrive/",
        "/api/v1/no-such-collection/",
        "/api/v2/",
        "/api/",
    ],
)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_a_path_the_router_does_not_match_answers_a_json_404(everyone: APIClient, path: str, method: str) -> None:
    response = getattr(everyone, method)(path)
    assert response.status_code == 404
    assert "detail" in json_error(response)


def test_an_id_above_the_largest_bigint_answers_a_json_404(everyone: APIClient) -> None:
    response = everyone.get(f"/api/v1/jobs/{2**63}/")
    assert response.status_code == 404
    assert "detail" in json_error(response)


def test_a_post_to_an_unknown_path_with_a_session_is_a_json_404_not_the_csrf_page() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("api-errors-session", "operator"))
    response = client.post("/api/v1/nothing-here/", {"a": "b"})
    assert response.status_code == 404
    json_error(response)


@pytest.mark.urls("tests.host_urls")
def test_a_host_project_including_the_product_under_a_prefix_answers_json_404s_there(everyone: APIClient) -> None:
    response = everyone.get("/ops/api/v1/jobs/abc/")
    assert response.status_code == 404
    json_error(response)
    assert everyone.get(f"/ops/api/v1/jobs/{MISSING}/").status_code == 404
    # Outside the product's api/ the host's own 404 stands.
    assert everyone.get("/elsewhere/").get("Content-Type", "").startswith("text/html")


def test_a_uri_longer_than_the_limit_answers_a_json_414(everyone: APIClient) -> None:
    response = everyone.get("/api/v1/jobs/", {"state": "x" * MAX_URI_LENGTH})
    assert response.status_code == 414
    assert "detail" in json_error(response)


# --- Every route x method ----------------------------------------------------------


def test_every_api_route_and_method_answers_its_errors_as_json(everyone: APIClient) -> None:
    anonymous = APIClient()
    errors = 0
    for route in api_routes():
        url = url_of(route)
        for method in METHODS:
            for client in (anonymous, everyone):
                response = getattr(client, method)(url)
                if response.status_code >= 400:
                    json_error(response)
                    errors += 1
    # Most answers are errors: an anonymous caller, ids that do not exist, methods a route does not take.
    assert errors > len(api_routes()) * len(METHODS), errors


def test_every_api_route_and_method_answers_an_unexpected_exception_as_a_json_500(
    everyone: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: APIView, request: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in a view")

    monkeypatch.setattr(APIView, "initial", fail)
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(make_user("api-errors-500", *ROLES))
    failed = 0
    for route in api_routes():
        if route.name == "api-not-found":
            continue  # a plain view: no DRF code to fail
        for method in METHODS:
            response = getattr(client, method)(url_of(route))
            assert response.status_code == 500, (route.pattern, method, response.status_code)
            body = json_error(response)
            assert method == "head" or body == {"detail": "Internal Server Error"}
            failed += 1
    assert failed == (len(api_routes()) - 1) * len(METHODS)


# --- Strict JSON types -------------------------------------------------------------


def client_of(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def policy(portfolio, active_policy):  # type: ignore[no-untyped-def]
    return active_policy(portfolio, "lease", 365).policy


def policy_manager(policy: Any) -> Any:
    from retention.models import Membership

    manager = make_user("strict-manager", "property_manager")
    Membership.objects.create(user=manager, portfolio=policy.portfolio, role="property_manager")
    return manager


@pytest.mark.parametrize("days", ["30", 30.0, True, None, [30]])
def test_retention_days_that_is_not_a_json_integer_answers_400_naming_it(policy, days: Any) -> None:  # type: ignore[no-untyped-def]
    manager = policy_manager(policy)
    response = client_of(manager).post(
        f"/api/v1/policies/{policy.pk}/versions/",
        {"retention_days": days, "reason": "a longer period for the tests"},
        format="json",
    )
    assert response.status_code == 400
    assert list(json_error(response)) == ["retention_days"]


@pytest.mark.parametrize(
    ("field", "value"), [("batch_size", "500"), ("enabled", "true"), ("enabled", 1), ("reason", 12345678901)]
)
def test_each_field_of_a_new_version_takes_only_its_json_type(policy, field: str, value: Any) -> None:  # type: ignore[no-untyped-def]
    manager = policy_manager(policy)
    body = {"retention_days": 30, "reason": "a longer period for the tests", field: value}
    response = client_of(manager).post(f"/api/v1/policies/{policy.pk}/versions/", body, format="json")
    assert response.status_code == 400
    assert list(json_error(response)) == [field]


def test_a_number_as_a_reason_answers_400_naming_the_field(portfolio, prop) -> None:  # type: ignore[no-untyped-def]
    reviewer = make_user("strict-reviewer", "compliance_reviewer")
    response = client_of(reviewer).post(
        "/api/v1/legal-holds/", {"portfolio": portfolio.pk, "reason": 1234567890123}, format="json"
    )
    assert response.status_code == 400
    assert list(json_error(response)) == ["reason"]
    assert "string" in response.json()["reason"][0]


def test_a_number_as_a_review_note_answers_400_naming_the_field(policy) -> None:  # type: ignore[no-untyped-def]
    from retention.services import policy_version_submit

    version = policy_version_submit(
        policy=policy, retention_days=400, author=make_user("strict-author", "property_manager"), reason="x" * 12
    )
    reviewer = make_user("strict-reviewer", "compliance_reviewer")
    response = client_of(reviewer).post(
        f"/api/v1/policy-versions/{version.pk}/approve/", {"note": 1234567890123}, format="json"
    )
    assert response.status_code == 400
    assert list(json_error(response)) == ["note"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/pause/", {"reason": 12345678901}),
        ("/api/v1/dead-letters/bulk/", {"operation": "dismiss", "letter_ids": [1], "reason": 12345678901}),
        ("/api/v1/sweeps/", {"slot": 202608210200}),
    ],
)
def test_a_number_as_text_answers_400_naming_the_field_on_the_pipeline_routes(path: str, body: dict[str, Any]) -> None:
    response = client_of(make_user("strict-operator", "operator")).post(path, body, format="json")
    assert response.status_code == 400
    assert list(json_error(response)) == [next(name for name, value in body.items() if isinstance(value, int))]


def test_every_writable_field_of_the_apis_request_bodies_is_strict() -> None:
    """Enumerates every operation's request body, as the schema generator
    finds them: every field a request may write takes only its JSON type (a
    strict field, an id, or a list or dict of them)."""
    from drf_spectacular.generators import SchemaGenerator
    from rest_framework import serializers

    from retention import apiutils

    strict = (
        apiutils.StrictJSONType,
        apiutils.IdField,
        apiutils.RecordIdField,
        apiutils.StrictPrimaryKeyRelatedField,
        apiutils.PortfolioKeyField,  # the customer model's key: a JSON integer, or a string for a UUID
    )

    def check(name: str, field: Any) -> None:
        if isinstance(field, serializers.ListField | serializers.DictField):
            check(name, field.child)
        else:
            assert isinstance(field, strict), f"{name}: {type(field).__name__} coerces its JSON value"

    bodies: set[type] = set()
    from drf_spectacular.settings import spectacular_settings

    generator = SchemaGenerator()
    generator._initialise_endpoints()
    for path, _regex, method, view in generator._get_paths_and_endpoints():
        if method in {"POST", "PUT", "PATCH"}:
            # What drf-spectacular sets before it asks a view's schema for the body.
            view.request = spectacular_settings.GET_MOCK_REQUEST(method, path, view, None)
            view.schema.path, view.schema.method = path, method
            body = view.schema.get_request_serializer()
            if body is not None:
                bodies.add(body if isinstance(body, type) else type(body))
    checked = 0
    for cls in bodies:
        for name, field in cls().fields.items():
            if not field.read_only:
                check(f"{cls.__name__}.{name}", field)
                checked += 1
    assert len(bodies) >= 6 and checked >= 15, (bodies, checked)


# --- Strict query parameters -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "query", "name"),
    [
        ("/api/v1/jobs/", "page=1&page=2", "page"),
        ("/api/v1/audit-events/", "page=1&page=1", "page"),
        ("/api/v1/jobs/", "state=pending&state=running", "state"),
        ("/api/v1/jobs/", "sweep=", "sweep"),
        ("/api/v1/sweeps/1/proof/", "export=", "export"),
        ("/api/v1/dead-letters/", "status=open&status=open", "status"),
    ],
)
def test_a_repeated_or_empty_query_parameter_answers_400_naming_it(
    everyone: APIClient, path: str, query: str, name: str
) -> None:
    response = everyone.get(f"{path}?{query}")
    assert response.status_code == 400
    assert list(json_error(response)) == [name]


def test_an_empty_slot_answers_400_naming_it() -> None:
    response = client_of(make_user("strict-operator", "operator")).post("/api/v1/sweeps/", {"slot": ""}, format="json")
    assert response.status_code == 400
    assert list(json_error(response)) == ["slot"]
