"""Property-based API tests: schemathesis against the live OpenAPI schema.

Each test loads ``/api/v1/schema/`` from pytest-django's ``live_server`` (on
127.0.0.1, real HTTP), takes one operation and sends it Hypothesis-generated
requests with the DRF token of each role in turn (``TOKENS``): a user who holds
all four roles, each platform role alone, and each customer role of a
membership in the seeded portfolio:

* valid (positive) requests must get a documented status code, content type,
  headers and body, and never a server error — whichever role asks (a 403 or
  404 of a role without the permission is a documented answer too);
* invalid (negative) requests must never get a server error.

Data is seeded first (portfolio, property, active policy, a version in review,
a legal hold, a sweep whose job became a dead letter), and path ids are drawn
from the seeded rows as well as generated, so detail and action endpoints are
reached. Every operation gets a fresh database; an operation that mutates
(redrive, dismiss, approve, pause, ...) sees only its own earlier changes, and
its later answers (409 not open, 400 not in review, ...) are documented ones.

schemathesis' own pytest loader (``schemathesis.pytest.from_fixture``) fails
under pytest 9 (it assigns ``Node._nodeid``, which pytest 9 no longer has), so
each operation is driven here with ``APIOperation.as_strategy`` and ``@given``.
Generation is derandomized: a run is reproducible, and a failure names the
request as a ``curl`` command.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis
from django.contrib.auth.models import AbstractBaseUser
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cleanup_ops.api_tokens import api_token_issue
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.inputs import reason_problem
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion, RetentionPolicy
from retention.services import legal_hold_place, policy_version_submit

from .conftest import make_records, make_user, utc
from .testenv import examples

OLD = utc("2020-01-01T00:00:00Z")
ROLES = ("property_manager", "compliance_reviewer", "operator", "auditor")
# The tokens each operation is asked with: every role the API knows.
TOKENS = (
    "all-roles",  # holds the four groups: every operation must succeed for it at least once
    *(f"platform-{role}" for role in ROLES),  # one group each (a property manager's sees no portfolio)
    *(f"customer-{role}" for role in ("property_manager", "compliance_reviewer", "auditor")),  # a membership
)
# Per operation and generation mode, for the all-roles token: 20 in ci
# (tests/testenv.py), and never fewer: the test asserts each operation succeeded
# at least once, which 4 derandomized examples (the dev profile's share) do not
# reach for the review actions.
MAX_EXAMPLES = max(20, examples(cost=25))
# For each other role, per operation: what differs between roles is the
# permission and the portfolio, mostly decided before the input is read, so
# fewer examples each (positive, negative) keep the file within a few minutes.
ROLE_EXAMPLES = {GenerationMode.POSITIVE: 5, GenerationMode.NEGATIVE: 2}

# The rows a path ``{id}`` names, by the path's collection (/api/v1/<collection>/{id}/...).
COLLECTIONS = {
    "audit-events": AuditEvent,
    "dead-letters": DeadLetter,
    "jobs": CleanupJob,
    "legal-holds": LegalHold,
    "policies": RetentionPolicy,
    "policy-versions": PolicyVersion,
    "sweeps": Sweep,
}

pytestmark = pytest.mark.django_db(transaction=True)  # live_server serves from another thread


def collection(case: Any) -> str:
    return case.operation.path.split("/")[3]


# Every operation must succeed at least once with the seeded data.
NEVER_SUCCEEDS: set[str] = set()


POSITIVE_CHECKS: list[Callable[..., Any]] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
NEGATIVE_CHECKS: list[Callable[..., Any]] = [not_a_server_error]


# --- Fixtures -------------------------------------------------------------------


def documented_operations() -> list[str]:
    """``METHOD /path`` of every operation, from the generator that serves the schema."""
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return sorted(f"{method.upper()} {path}" for path, item in paths.items() for method in item)


@pytest.fixture
def seeded(portfolio, prop, manager, active_policy, api_user) -> dict[str, list[Any]]:  # type: ignore[no-untyped-def]
    """A row of every kind the API serves; returns their ids by collection."""
    version = active_policy(portfolio, "lease", 365)
    policy_version_submit(
        policy=version.policy, retention_days=400, enabled=True, author=manager, reason="longer for the tests"
    )
    make_records(prop, "lease", 3, ended=OLD)
    # A second partition whose job stays pending: run now and cancel can succeed.
    make_records(Property.objects.create(portfolio=portfolio, name="Pending Row"), "lease", 1, ended=OLD)
    sweep_trigger()

    def rejected(job_id: int) -> None:
        raise DownstreamError(400)

    job_run_slice(job_id=CleanupJob.objects.order_by("id").first().pk, before_batch=rejected)
    holder = make_user("hold-reviewer", "compliance_reviewer")
    legal_hold_place(portfolio=portfolio, property=prop, reason="litigation 2026-17", placed_by=holder)
    pipeline_pause(actor=None, reason="seeded portfolio pause", portfolio_id=portfolio.pk)  # so resume can succeed
    ids: dict[str, list[Any]] = {
        name: list(model.objects.order_by("id").values_list("id", flat=True)) for name, model in COLLECTIONS.items()
    }
    assert all(ids.values()), ids
    unpaused = Portfolio.objects.create(name="Not paused yet", slug="unpaused")  # a pause of it can succeed
    ids |= {"portfolio": [portfolio.pk], "property": [prop.pk], "unpaused": [unpaused.pk]}
    # A second token of the API's user, which revoking can succeed on (not the one the requests carry).
    ids["tokens"] = [api_token_issue(user=api_user).token_id]
    assert DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count() == 1
    assert PolicyVersion.objects.filter(status=PolicyVersion.Status.IN_REVIEW).count() == 1
    return ids


def token_header(user: AbstractBaseUser) -> dict[str, str]:
    return {"Authorization": f"Token {api_token_issue(user=user).secret}"}


@pytest.fixture
def api_user(db: None) -> AbstractBaseUser:
    return make_user("api-all-roles", *ROLES)


@pytest.fixture
def api_headers(api_user: AbstractBaseUser) -> dict[str, str]:
    return token_header(api_user)


@pytest.fixture
def role_headers(api_headers: dict[str, str], seeded: dict[str, list[int]]) -> dict[str, dict[str, str]]:
    """The ``Authorization`` header of each of ``TOKENS``; the customer roles
    are memberships in the seeded portfolio."""
    headers = {"all-roles": api_headers}
    for role in ROLES:
        headers[f"platform-{role}"] = token_header(make_user(f"api-platform-{role}", role))
    portfolio = Portfolio.objects.get(pk=seeded["portfolio"][0])
    for role in ("property_manager", "compliance_reviewer", "auditor"):
        user = make_user(f"api-customer-{role}")
        Membership.objects.create(user=user, portfolio=portfolio, role=role)
        headers[f"customer-{role}"] = token_header(user)
    assert set(headers) == set(TOKENS)
    return headers


@pytest.fixture
def base_url(live_server) -> str:  # type: ignore[no-untyped-def]
    """The live server's address as 127.0.0.1 (pytest-django calls it ``localhost``)."""
    port = urlsplit(live_server.url).port
    assert port
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def http() -> Iterator[requests.Session]:
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: requests go straight to loopback
    yield session
    # Closing the keep-alive sockets ends the live server's request threads,
    # which close their database connections (else the test database cannot be dropped).
    session.close()


@pytest.fixture
def api_schema(base_url: str, api_headers: dict[str, str]):  # type: ignore[no-untyped-def]
    config = schemathesis.Config.from_dict(
        {"base-url": base_url, "generation": {"database": "none", "with-security-parameters": False}}
    )
    return schemathesis.openapi.from_url(
        f"{base_url}/api/v1/schema/",
        config=config,
        headers=api_headers,
        proxies={"http": None, "https": None},
        timeout=30,
    )


def case_strategy(operation: Any, mode: GenerationMode, seeded: dict[str, list[Any]]) -> st.SearchStrategy[Any]:
    """Generated cases, plus cases that name seeded rows: each seeded ``{id}``
    in the path, and the seeded portfolio and property in a body that refers
    to them (creating a legal hold)."""
    generated = operation.as_strategy(generation_mode=mode)
    strategies = [generated]
    if any(p.name == "token_id" for p in operation.path_parameters) and mode == GenerationMode.POSITIVE:
        strategies += [operation.as_strategy(generation_mode=mode, path_parameters={"token_id": seeded["tokens"][0]})]
    has_id = any(p.name == "id" for p in operation.path_parameters)
    # In negative mode a fixed id leaves nothing to make invalid unless there is a body.
    if has_id and (mode == GenerationMode.POSITIVE or operation.body):
        ids = seeded[operation.path.split("/")[3]]
        strategies += [operation.as_strategy(generation_mode=mode, path_parameters={"id": i}) for i in ids]
    if mode == GenerationMode.POSITIVE and operation.body:

        def with_seeded_references(case: Any) -> Any:
            if isinstance(case.body, dict):
                refs = {name: seeded[name][0] for name in ("portfolio", "property") if name in case.body}
                if "portfolio_id" in case.body:  # resume the seeded (paused) portfolio, pause another
                    refs["portfolio_id"] = seeded["unpaused" if case.path.endswith("/pause/") else "portfolio"][0]
                if case.path.endswith("/dead-letters/bulk/"):  # ids of seeded letters, not a filter too
                    case.body.pop("filter", None)
                    refs["letter_ids"] = seeded["dead-letters"]
                    refs["reason"] = "a generated decision, long enough"
                for text in ("reason", "note"):  # the reason rule: 10 visible characters (retention.inputs)
                    value = case.body.get(text)
                    if text in case.body and (not isinstance(value, str) or reason_problem(value, field=text)):
                        refs[text] = "a generated decision, long enough"
                case.body = {**case.body, **refs}
            return case

        strategies.append(generated.map(with_seeded_references))
        if has_id:  # a seeded row *and* a valid body: the operation's success path (redrive, approve, ...)
            strategies += [
                operation.as_strategy(generation_mode=mode, path_parameters={"id": i}).map(with_seeded_references)
                for i in seeded[operation.path.split("/")[3]]
            ]
    return st.one_of(strategies)


def fuzz(strategy: st.SearchStrategy[Any], send: Callable[[Any], None], *, max_examples: int) -> None:
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # nothing written to .hypothesis/
        derandomize=True,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        send(case)

    run()


# --- The test -------------------------------------------------------------------


@pytest.mark.parametrize("label", documented_operations())
def test_the_api_operation_answers_as_documented_and_never_with_a_server_error(
    label: str,
    api_schema,
    seeded,
    base_url: str,
    role_headers: dict[str, dict[str, str]],
    http: requests.Session,
    capsys: pytest.CaptureFixture[str],
) -> None:  # type: ignore[no-untyped-def]
    method, path = label.split(" ", 1)
    assert f"{method} {path}" in {f"{op.ok().method.upper()} {op.ok().path}" for op in api_schema.get_all_operations()}
    operation = api_schema[path][method]
    statuses: dict[str, list[int]] = {token: [] for token in TOKENS}

    def sender(token: str, checks: list[Callable[..., Any]]) -> Callable[[Any], None]:
        def send(case: Any) -> None:
            response = case.call_and_validate(
                base_url=base_url, session=http, headers=role_headers[token], checks=checks
            )
            assert urlsplit(response.request.url).hostname == "127.0.0.1"
            statuses[token].append(response.status_code)

        return send

    modes = [GenerationMode.POSITIVE]
    if operation.path_parameters or operation.query or operation.body:  # else nothing can be made invalid
        modes.append(GenerationMode.NEGATIVE)
    for token in TOKENS:
        for mode in modes:
            checks = POSITIVE_CHECKS if mode == GenerationMode.POSITIVE else NEGATIVE_CHECKS
            examples = MAX_EXAMPLES if token == "all-roles" else ROLE_EXAMPLES[mode]
            fuzz(case_strategy(operation, mode, seeded), sender(token, checks), max_examples=examples)

    assert all(statuses.values()), {token: len(codes) for token, codes in statuses.items()}
    sent = [code for codes in statuses.values() for code in codes]
    with capsys.disabled():  # one line per operation: the figures of the run
        print(f"\n{label}: {len(sent)} cases, {len(TOKENS)} tokens, statuses {dict(sorted(Counter(sent).items()))}")
    if label not in NEVER_SUCCEEDS:  # the seeded data lets every other operation succeed at least once
        codes = statuses["all-roles"]
        assert any(200 <= code < 300 for code in codes), f"{label} never succeeded: {sorted(set(codes))}"
