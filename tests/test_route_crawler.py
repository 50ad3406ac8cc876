"""Every route Django resolves, crawled as every customer role: no other
customer's data anywhere, no server error, and another customer's id answers
exactly like an id that does not exist.

The crawler enumerates ``django.urls.get_resolver()`` itself — the admin of
every registered model (changelist, add, change, history, delete, the
redirect to change, custom views), autocomplete, both APIs (every route,
action and format suffix), the console (pages and their live partials), the
API docs, the login pages and the catch-alls — so a new route is crawled
without editing this file. A pattern whose parameters it cannot fill fails
the test, naming the pattern.

The world (one fixture set for the module, rolled back at the end):

- customer **a** has portfolios A1 and A2, customer **b** portfolio B; each
  has properties, records, policies, versions in review, a hold, a pause, a
  finished sweep job with ledger rows, a dead letter, audit events and staff;
- every row's id comes from a block of ids of its own (sequences moved to
  ``ID_BASE[table]``), so an id is a canary that cannot be confused with a
  count or another kind's id; names, reasons and usernames carry ``canary``
  strings, and the proof digests of b's jobs are canaries of b's sweep figures.

Each canary is tagged with the portfolio and the permission that reads it. A
user must never receive a canary of a portfolio where they lack that
permission — b's everything for customer a's staff; A2's pipeline data for
the *mixed* user (auditor in A1, property manager in A2); b's pipeline data
for the *cross-customer* user (auditor of a in A1, property manager of b in B).

Users crawled: a's property manager, compliance reviewer and auditor (each a
member of A1 and A2), the mixed user, the cross-customer user; the platform's
operator and a superuser are crawled for server errors only (they see
everything). Formats: the API as JSON, as the browsable API (``?format=api``
and ``Accept: text/html``), the proof as CSV; console pages whole and as their
htmx partial; every other page as it is. Methods: GET, HEAD and OPTIONS.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import time_machine
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.db.models import Model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RegexPattern, RoutePattern

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry, PipelinePause, Sweep
from cleanup_ops.proof import sweep_proof
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion, RetentionPolicy
from retention.roles import MEMBERSHIP_ROLE_PERMISSIONS
from retention.services import (
    legal_hold_place,
    membership_grant,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

from .conftest import utc

OLD = utc("2020-01-01T00:00:00Z")
MISSING = 98765432  # no table has an id this large here
# Each table's ids start at its own block (see the module docstring).
ID_BASE: dict[type[Model], int] = {
    Portfolio: 11_000_000,
    Property: 12_000_000,
    Lease: 13_000_000,
    MaintenanceRecord: 14_000_000,
    TenantActivity: 15_000_000,
    RetentionPolicy: 16_000_000,
    PolicyVersion: 17_000_000,
    LegalHold: 18_000_000,
    AuditEvent: 19_000_000,
    Membership: 21_000_000,
    User: 22_000_000,
    Sweep: 23_000_000,
    CleanupJob: 24_000_000,
    DeadLetter: 25_000_000,
    LedgerEntry: 26_000_000,
    PipelinePause: 27_000_000,
}
VIEW = {
    model: f"{model._meta.app_label}.view_{model._meta.model_name}"
    for model in (
        Portfolio,
        Property,
        Lease,
        MaintenanceRecord,
        TenantActivity,
        RetentionPolicy,
        PolicyVersion,
        LegalHold,
        AuditEvent,
        CleanupJob,
        DeadLetter,
        LedgerEntry,
        Sweep,
    )
}
PORTFOLIO_VIEW = "properties.view_portfolio"
JOB_VIEW = "cleanup_ops.view_cleanupjob"
SWEEP_VIEW = "cleanup_ops.view_sweep"

pytestmark = pytest.mark.django_db


# --- The world --------------------------------------------------------------------


@dataclass
class Canary:
    text: str
    portfolio_id: int
    perm: str
    is_id: bool = False


@dataclass
class World:
    portfolios: dict[str, Portfolio]
    ids: dict[type[Model], dict[str, int]] = field(default_factory=dict)  # model → {"A1"|"A2"|"B": id}
    canaries: list[Canary] = field(default_factory=list)
    users: dict[str, User] = field(default_factory=dict)

    def tag_ids(self, model: type[Model], perm: str, *, field_name: str = "portfolio_id") -> None:
        """Every row of ``model``: its id is a canary of its portfolio, and one
        row per portfolio is the id the crawler substitutes."""
        for key, portfolio in self.portfolios.items():
            rows = list(model._default_manager.filter(**{field_name: portfolio.pk}).order_by("pk"))
            for row in rows:
                self.canaries.append(Canary(str(row.pk), portfolio.pk, perm, is_id=True))
            if rows:
                self.ids.setdefault(model, {})[key] = rows[0].pk


def move_sequences() -> None:
    with connection.cursor() as cursor:
        for model, base in ID_BASE.items():
            table = model._meta.db_table
            if connection.vendor == "postgresql":
                cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)", [table, base + 1])
            else:
                cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
                cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, base])


def staff(name: str, memberships: list[tuple[Portfolio, str]]) -> User:
    user = User.objects.create_user(username=name, password="pw-for-tests", is_staff=True)
    for portfolio, role in memberships:
        membership_grant(user=user, portfolio=portfolio, role=role, granted_by=None)
    return user


def reject(job_id: int) -> None:
    raise DownstreamError(400)


def build_world() -> World:
    move_sequences()
    operator = User.objects.create_user(username="platform-operator", password="pw-for-tests", is_staff=True)
    operator.groups.add(Group.objects.get(name="operator"))
    reviewer = User.objects.create_user(username="platform-reviewer", password="pw-for-tests", is_staff=True)
    reviewer.groups.add(Group.objects.get(name="compliance_reviewer"))
    superuser = User.objects.create_superuser(username="platform-root", password="pw-for-tests")
    portfolios = {
        "A1": Portfolio.objects.create(name="Alder Homes North", slug="alder-north"),
        "A2": Portfolio.objects.create(name="Alder Homes South canary-a2-portfolio", slug="alder-south"),
        "B": Portfolio.objects.create(name="Birch canary-b-portfolio", slug="birch"),
    }
    world = World(portfolios=portfolios)
    a1, a2, b = portfolios["A1"], portfolios["A2"], portfolios["B"]
    world.users = {
        "a-manager": staff("a-manager", [(a1, "property_manager"), (a2, "property_manager")]),
        "a-reviewer": staff("a-reviewer", [(a1, "compliance_reviewer"), (a2, "compliance_reviewer")]),
        "a-auditor": staff("a-auditor", [(a1, "auditor"), (a2, "auditor")]),
        "mixed": staff("mixed-a1-auditor-a2-manager", [(a1, "auditor"), (a2, "property_manager")]),
        "cross": staff("cross-a-auditor-b-manager", [(a1, "auditor"), (b, "property_manager")]),
        "operator": operator,
        "superuser": superuser,
    }
    b_staff = {
        role: staff(f"canary-b-{role}", [(b, role)]) for role in ("property_manager", "compliance_reviewer", "auditor")
    }
    a2_manager = world.users["a-manager"]
    for key, portfolio in portfolios.items():
        marker = f"canary-{key.lower()}"
        prop = Property.objects.create(portfolio=portfolio, name=f"{portfolio.slug} {marker}-property")
        common = {"portfolio_id": portfolio.pk, "property_id": prop.pk}
        Lease.objects.bulk_create(
            [
                *[
                    Lease(**common, unit=f"{i}A", tenant_name=f"{marker}-tenant", started_on=OLD.date(), ended_at=OLD)
                    for i in range(3)
                ],
                Lease(**common, unit="9Z", tenant_name=f"{marker}-tenant-running", started_on=OLD.date()),
            ]
        )
        MaintenanceRecord.objects.bulk_create(
            [MaintenanceRecord(**common, summary=f"{marker}-boiler", opened_at=OLD, closed_at=OLD) for _ in range(2)]
        )
        TenantActivity.objects.create(**common, activity_type="login", details=f"{marker}-portal", occurred_at=OLD)
        author = b_staff["property_manager"] if key == "B" else a2_manager
        approver = b_staff["compliance_reviewer"] if key == "B" else world.users["a-reviewer"]
        for kind in ("lease", "maintenance_record"):
            policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=kind)
            version = policy_version_submit(
                policy=policy, retention_days=365, author=author, reason=f"{marker}-policy-reason"
            )
            policy_version_approve(version_id=version.pk, reviewer=approver, note=f"{marker}-review-note")
    sweep_trigger()
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=reject if job.record_kind == "maintenance_record" else None)
    for key, portfolio in portfolios.items():
        marker = f"canary-{key.lower()}"
        author = b_staff["property_manager"] if key == "B" else a2_manager
        placer = b_staff["compliance_reviewer"] if key == "B" else world.users["a-reviewer"]
        policy = RetentionPolicy.objects.get(portfolio=portfolio, record_kind="lease")
        policy_version_submit(policy=policy, retention_days=400, author=author, reason=f"{marker}-version-reason")
        legal_hold_place(
            portfolio=portfolio, record_kind="tenant_activity", placed_by=placer, reason=f"{marker}-hold-reason"
        )
        pipeline_pause(actor=operator, portfolio_id=portfolio.pk, reason=f"{marker}-pause-reason")

    sweep = Sweep.objects.get()
    world.ids[Sweep] = {"A1": sweep.pk}
    for model in (Lease, MaintenanceRecord, TenantActivity, RetentionPolicy, LegalHold, CleanupJob, DeadLetter):
        world.tag_ids(model, VIEW[model])
    world.tag_ids(Portfolio, PORTFOLIO_VIEW, field_name="pk")
    world.tag_ids(Property, VIEW[Property])
    world.tag_ids(PolicyVersion, VIEW[PolicyVersion], field_name="policy__portfolio_id")
    world.tag_ids(Membership, PORTFOLIO_VIEW)
    # A portfolio's pause shows in its audit trail (the event names its id).
    world.tag_ids(PipelinePause, VIEW[AuditEvent])
    for key, portfolio in portfolios.items():
        marker = f"canary-{key.lower()}"
        for event in AuditEvent.objects.filter(details__portfolio_id=portfolio.pk):
            world.canaries.append(Canary(str(event.pk), portfolio.pk, VIEW[AuditEvent], is_id=True))
        world.ids.setdefault(AuditEvent, {})[key] = (
            AuditEvent.objects.filter(details__portfolio_id=portfolio.pk).order_by("pk").first().pk
        )
        for entry in LedgerEntry.objects.filter(portfolio_id=portfolio.pk):
            world.canaries.append(Canary(entry.operation_id, portfolio.pk, VIEW[LedgerEntry]))
        proof = sweep_proof(sweep=sweep, portfolio_ids=frozenset({portfolio.pk}))
        for partition in proof["partitions"]:
            if partition["operations"]:  # a job without operations has the digest of nothing, shared by all
                world.canaries.append(Canary(partition["digest"], portfolio.pk, SWEEP_VIEW))
        if key != "A1":
            # Their texts: names, tenants, reasons, notes (all carry the marker).
            world.canaries.append(Canary(marker, portfolio.pk, PORTFOLIO_VIEW))
            # A portfolio's pause is in that portfolio's audit trail (its reason included).
            world.canaries.append(Canary(f"{marker}-pause-reason", portfolio.pk, VIEW[AuditEvent]))
    for user in b_staff.values():
        world.canaries.append(Canary(user.username, b.pk, PORTFOLIO_VIEW))
        world.canaries.append(Canary(str(user.pk), b.pk, PORTFOLIO_VIEW, is_id=True))
    world.ids[User] = {"A1": world.users["a-manager"].pk, "B": b_staff["property_manager"].pk}
    # The whole sweep's digest covers b's jobs: no customer user may see it.
    world.canaries.append(Canary(sweep_proof(sweep=sweep)["digest"], b.pk, "platform-only"))
    assert all(world.ids[m].keys() >= {"A1", "A2", "B"} for m in (CleanupJob, DeadLetter, LegalHold, PolicyVersion))
    return world


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    with time_machine.travel("2026-08-21T02:05:00Z", tick=False), django_db_blocker.unblock():
        with transaction.atomic():
            built = build_world()
            yield built
            transaction.set_rollback(True)


# --- Enumerating the resolver ---------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One URL pattern: its full pattern string, its parts, its name."""

    pattern: str
    parts: tuple[Any, ...]  # RoutePattern / RegexPattern of each level
    name: str
    callback: Any

    @property
    def params(self) -> list[str]:
        names: list[str] = []
        for part in self.parts:
            names += list(part.regex.groupindex)
        return names


def routes() -> list[Route]:
    found: list[Route] = []

    def walk(patterns: list[Any], parts: tuple[Any, ...], namespace: tuple[str, ...]) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(
                    entry.url_patterns,
                    (*parts, entry.pattern),
                    (*namespace, entry.namespace) if entry.namespace else namespace,
                )
            elif isinstance(entry, URLPattern):
                full = "".join(str(p) for p in (*parts, entry.pattern))
                name = ":".join((*namespace, entry.name or f"<unnamed {full}>"))
                found.append(Route(full, (*parts, entry.pattern), name, entry.callback))

    walk(get_resolver().url_patterns, (), ())
    return found


_ROUTE_PARAM = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")
_REGEX_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>(?:[^()]|\([^()]*\))*\)")


def fill(route: Route, values: dict[str, str]) -> str:
    """The URL of ``route`` with ``values`` for its parameters."""
    url = ""
    for part in route.parts:
        text = str(part)
        if isinstance(part, RoutePattern):

            def value(m: re.Match[str]) -> str:
                # DRF's format suffix converter takes the dot with the format.
                dot = "." if m.group("converter") == "drf_format_suffix" else ""
                return dot + values[m.group("name")]

            url += _ROUTE_PARAM.sub(value, text)
        elif isinstance(part, RegexPattern):
            text = _REGEX_GROUP.sub(lambda m: values[m.group("name")], text)
            text = text.removeprefix("^").removesuffix("$").replace("/?", "").replace("\\.", ".")
            url += text.replace("\\", "")
    return "/" + url


# --- What goes in each parameter ------------------------------------------------

CONSOLE_PARAMS = {"sweep_id": Sweep, "job_id": CleanupJob, "letter_id": DeadLetter, "portfolio_id": Portfolio}
ADMIN_VIEW_PARAMS = {"policy_id": RetentionPolicy, "version_id": PolicyVersion, "hold_id": LegalHold}
# Parameters that take a word, not an id: every value each may take here.
WORD_PARAMS = {
    "fmt": ["json", "csv"],
    "format": ["json", "api"],
    "url": ["no-such-page/"],
}


def model_of(route: Route, param: str) -> type[Model] | None:
    """The model whose ids go into ``param`` of ``route``."""
    if param in CONSOLE_PARAMS:
        return CONSOLE_PARAMS[param]
    if param in ADMIN_VIEW_PARAMS:
        return ADMIN_VIEW_PARAMS[param]
    if "content_type_id" in route.params:  # the admin's "view on site" shortcut: a lease's
        return Lease
    if route.pattern.startswith("admin/") and param in {"object_id", "id"}:
        app_label, model_name = route.pattern.split("/")[1:3]
        return apps.get_model(app_label, model_name)
    view_class = getattr(route.callback, "cls", None)
    if param == "pk" and view_class is not None:
        queryset = getattr(view_class, "queryset", None)
        return queryset.model if queryset is not None else view_class.serializer_class.Meta.model
    return None


@dataclass(frozen=True)
class Variant:
    label: str  # "A1", "A2", "B", "missing" or "-" (no id)
    url: str
    ids: tuple[str, ...]  # the id values substituted, for comparing with "missing"
    model: type[Model] | None
    words: str = ""  # the non-id parameters, e.g. "fmt=csv"


def word_values(param: str) -> list[str] | None:
    if param == "app_label":  # the admin's app index: every app with a registered model
        return sorted({model._meta.app_label for model in admin.site._registry})
    return WORD_PARAMS.get(param)


def variants(route: Route, world: World, labels: frozenset[str] | None = None) -> list[Variant]:
    words = {p: word_values(p) or [] for p in route.params if word_values(p) is not None}
    id_params = [p for p in route.params if p not in words]
    models = {}
    for param in id_params:
        if param == "content_type_id":
            continue
        model = model_of(route, param)
        if model is None:
            raise AssertionError(f"{route.pattern} ({route.name}): the crawler cannot fill {param!r}")
        models[param] = model
    word_sets: list[dict[str, str]] = [{}]
    for param, choices in words.items():
        word_sets = [{**w, param: c} for w in word_sets for c in choices]
    out: list[Variant] = []
    for word in word_sets:
        tag = ",".join(f"{k}={v}" for k, v in sorted(word.items()))
        if not id_params:
            out.append(Variant("-", fill(route, word), (), None, tag))
            continue
        model = next(iter(models.values()), None)
        known = world.ids.get(model, {}) if model is not None else {}
        for label in [*sorted(k for k in known if labels is None or k in labels), "missing"]:
            values = dict(word)
            for param in id_params:
                if param == "content_type_id":
                    values[param] = str(ContentType.objects.get_for_model(model or Lease).pk)
                else:
                    values[param] = str(known[label] if label != "missing" else MISSING)
            substituted = tuple(values[p] for p in id_params if p != "content_type_id")
            out.append(Variant(label, fill(route, values), substituted, model, tag))
    return out


# --- Formats ----------------------------------------------------------------------


def formats(route: Route, *, customer: bool = True) -> list[tuple[str, str, dict[str, str]]]:
    """(format name, query string, headers) for a route. The platform's user
    asks for the browsable API one way (the same renderer either way)."""
    if hasattr(route.callback, "cls") and route.pattern.startswith("api/") and "format" not in route.params:
        found = [("json", "", {}), ("browsable", "?format=api", {})]
        if customer:
            found.append(("html", "", {"HTTP_ACCEPT": "text/html"}))
        if route.name.endswith("-proof"):
            found.append(("csv", "?export=csv", {}))
        return found
    if route.name.startswith("console:"):
        return [("page", "", {}), ("partial", "", {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "live"})]
    return [("page", "", {})]


# --- Checking responses -------------------------------------------------------------

_TOKENS = re.compile(r"[A-Za-z0-9]{32,}")


def without_echo(text: str, url: str) -> str:
    """``text`` without the URL asked for and its parent paths, which a page
    may show back (the browsable API's breadcrumbs and form actions): an echo
    of the request, not data."""
    path = url.split("?")[0]
    prefixes = [url, path] + [path[: i + 1] for i in range(len(path) - 1, 0, -1) if path[i] == "/"]
    for prefix in prefixes:
        if prefix.count("/") > 2:  # never "/" or "/api/" alone
            text = text.replace(prefix, "").replace(quote(prefix), "")
    return text


def normalised(body: str, ids: tuple[str, ...]) -> str:
    for value in ids:
        body = re.sub(rf"(?<![0-9]){value}(?![0-9])", "<ID>", body)
    return _TOKENS.sub("<TOKEN>", body)


def holds(user: User, perm: str, portfolio_id: int) -> bool:
    """Whether a customer's user holds ``perm`` in a portfolio, worked out from
    their memberships and the role table — not from ``retention.scoping``,
    the code under test."""
    roles = Membership.objects.filter(user_id=user.pk, portfolio_id=portfolio_id).values_list("role", flat=True)
    return any(perm in MEMBERSHIP_ROLE_PERMISSIONS[role] for role in roles)


def forbidden_pattern(user: User, world: World) -> re.Pattern[str] | None:
    texts = []
    for canary in world.canaries:
        allowed = canary.perm != "platform-only" and holds(user, canary.perm, canary.portfolio_id)
        if not allowed:
            texts.append(rf"(?<![0-9]){canary.text}(?![0-9])" if canary.is_id else re.escape(canary.text))
    return re.compile("|".join(sorted(set(texts), key=len, reverse=True))) if texts else None


def may_read(user: User, variant: Variant, world: World) -> bool:
    """Whether the object substituted in ``variant`` is one ``user`` may read."""
    if variant.model is None or variant.label in {"-", "missing"}:
        return True
    portfolio = world.portfolios[variant.label]
    perm = VIEW.get(variant.model)
    if perm is None:  # a platform model (users, sweeps): read wherever the route lets one read
        return variant.label != "B" or holds(user, PORTFOLIO_VIEW, portfolio.pk)
    return holds(user, perm, portfolio.pk)


CUSTOMER_USERS = ["a-manager", "a-reviewer", "a-auditor", "mixed", "cross"]
# The platform's superuser reaches every page (for server errors; it sees everything).
PLATFORM_USERS = ["superuser"]
# Whose objects each user is shown: A2 only where the user's roles differ
# between A1 and A2 (the mixed user); the platform: one object and a missing id.
LABELS = {
    "mixed": frozenset({"A1", "A2", "B"}),
    "superuser": frozenset({"A1"}),
}
DEFAULT_LABELS = frozenset({"A1", "B"})
METHODS = ("get", "head", "options")


@dataclass
class Crawl:
    requests: int = 0
    combinations: set[tuple[str, str, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)


def crawl(user_key: str, world: World) -> Crawl:
    user = User.objects.get(pk=world.users[user_key].pk)  # fresh: no cached scope
    client = Client(raise_request_exception=False)
    client.force_login(user)
    customer = user_key in CUSTOMER_USERS
    forbidden = forbidden_pattern(user, world) if customer else None
    result = Crawl()
    labels = LABELS.get(user_key, DEFAULT_LABELS)
    for route in routes():
        route_variants = variants(route, world, labels)
        for fmt, query, headers in formats(route, customer=customer):
            result.combinations.add((route.pattern, user_key, fmt))
            answers: dict[tuple[str, str, str], tuple[int, str]] = {}
            for variant in route_variants:
                for method in METHODS:
                    url = variant.url + query
                    response = getattr(client, method)(url, **headers)
                    result.requests += 1
                    result.statuses[response.status_code] += 1
                    where = f"{method.upper()} {url} [{fmt}] as {user_key}"
                    if response.status_code >= 500:
                        result.problems.append(f"{where}: {response.status_code}")
                    body = b"".join(response.streaming_content) if response.streaming else response.content
                    text = body.decode("utf-8", "replace") + " " + response.get("Location", "")
                    text = without_echo(text, url)
                    if forbidden is not None and (hit := forbidden.search(text)):
                        result.problems.append(f"{where}: contains {hit.group(0)!r}")
                    answers[(variant.words, variant.label, method)] = (
                        response.status_code,
                        normalised(text, variant.ids),
                    )
            if not customer:
                continue
            for variant in route_variants:
                if variant.label in {"-", "missing"} or may_read(user, variant, world):
                    continue
                for method in METHODS:
                    mine = answers[(variant.words, variant.label, method)]
                    missing = answers[(variant.words, "missing", method)]
                    if mine != missing:
                        result.problems.append(
                            f"{method.upper()} {variant.url}{query} [{fmt}] as {user_key}: {variant.label}'s id "
                            f"answers {mine[0]}, a missing id {missing[0]}"
                            + ("" if mine[0] != missing[0] else " (the bodies differ)")
                        )
    return result


@pytest.fixture(scope="module")
def results() -> dict[str, Crawl]:
    return {}


@pytest.mark.parametrize("user_key", CUSTOMER_USERS + PLATFORM_USERS)
def test_every_route_in_every_format_shows_a_user_nothing_of_portfolios_they_hold_no_role_for(
    world: World, results: dict[str, Crawl], user_key: str, settings: Any
) -> None:
    # Sessions in memory and no warning line per 4xx: the crawl's thousands of
    # requests spend their time in the views (5xx are still logged).
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    request_log = logging.getLogger("django.request")
    level = request_log.level
    request_log.setLevel(logging.ERROR)
    started = time.monotonic()
    try:
        result = crawl(user_key, world)
    finally:
        request_log.setLevel(level)
    results[user_key] = result
    print(  # the closing note's figures (pytest -s)
        f"{user_key}: {len(result.combinations)} (route, format) combinations, {result.requests} requests, "
        f"{time.monotonic() - started:.1f} s, statuses {dict(sorted(result.statuses.items()))}"
    )
    assert not result.problems, "\n".join(result.problems[:200]) + f"\n({len(result.problems)} problems)"
    assert result.requests > 500


def test_the_crawler_reaches_every_pattern_and_every_registered_admin(world: World) -> None:
    found = routes()
    patterns = {r.pattern for r in found}
    for model in admin.site._registry:
        opts = model._meta
        for view in ("", "add/", "<path:object_id>/change/", "<path:object_id>/history/", "<path:object_id>/delete/"):
            assert f"admin/{opts.app_label}/{opts.model_name}/{view}" in patterns, (model, view)
    for route in found:
        for variant in variants(route, world):
            match = resolve(variant.url.split("?")[0])
            assert match.func == route.callback or match.route == "".join(str(p) for p in route.parts), (
                route.pattern,
                variant.url,
            )
    assert {"console:overview", "api-root", "admin:autocomplete", "prometheus-metrics"} <= {r.name for r in found}


# --- Issue 30: hostile paths and bodies on every route, as every crawled user -------------

HOSTILE_PATH_VALUES = {"nul": "%00", "lone-surrogate": "%ED%A0%80"}
DEEP_JSON = "[" * 50_000 + "]" * 50_000


def hostile_urls(value: str) -> list[str]:
    """Every route with ``value`` in each of its parameters, or appended to a route without any."""
    urls = set()
    for route in routes():
        if route.params:
            urls.add(fill(route, dict.fromkeys(route.params, value)))
        else:
            path = fill(route, {}).split("?")[0]
            urls.add(path + value if path.endswith("/") else f"{path}/{value}")
    return sorted(urls)


@pytest.mark.parametrize("user_key", CUSTOMER_USERS + PLATFORM_USERS)
def test_a_nul_or_a_lone_surrogate_in_any_routes_path_is_a_400_for_every_user(world: World, user_key: str) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.get(pk=world.users[user_key].pk))
    for name, value in HOSTILE_PATH_VALUES.items():
        for url in hostile_urls(value):
            for method in METHODS:
                response = getattr(client, method)(url)
                assert response.status_code == 400, f"{method.upper()} {url} ({name}) as {user_key}"


@pytest.mark.parametrize("user_key", CUSTOMER_USERS + PLATFORM_USERS)
def test_json_50000_deep_on_any_route_is_never_a_server_error_and_a_4xx_on_the_api(world: World, user_key: str) -> None:
    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    client.force_login(User.objects.get(pk=world.users[user_key].pk))
    client.cookies["csrftoken"] = "a" * 32  # a browser's session holds one: the CSRF check then parses the body
    for route in routes():
        url = fill(route, {p: ("json" if p == "format" else "1") for p in route.params})
        response = client.post(url, DEEP_JSON, content_type="application/json")
        assert response.status_code < 500, f"POST {url} as {user_key}: {response.status_code}"
        if url.startswith("/api/"):
            assert 400 <= response.status_code < 500, f"POST {url} as {user_key}: {response.status_code}"


# --- The operator actions (POST), issue 30 item 18 ---------------------------------

NEW_ROUTES = {
    "console:dead_letter_groups",
    "console:jobs_selected",
    "job-run-now",
    "job-cancel",
    "dead-letter-bulk",
    "policy-version-impact",
}


def test_the_crawler_reaches_the_console_and_api_routes_of_issue_30(world: World) -> None:
    names = {route.name for route in routes()}
    assert names >= NEW_ROUTES, NEW_ROUTES - names


@pytest.mark.parametrize("user_key", CUSTOMER_USERS)
def test_the_new_actions_answer_another_customers_id_like_a_missing_one_and_change_nothing(
    world: World, user_key: str, settings: Any
) -> None:
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    user = User.objects.get(pk=world.users[user_key].pk)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    forbidden = forbidden_pattern(user, world)
    reason = {"reason": "canary-free reason for the crawl"}
    events = AuditEvent.objects.count()
    open_letters = DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count()
    problems: list[str] = []
    posts = [(f"/api/v1/jobs/{{}}/{action}/", CleanupJob, reason) for action in ("run-now", "cancel")]
    for template, model, body in posts:
        answers = {}
        for label in ("A1", "B", "missing"):
            pk = world.ids[model][label] if label != "missing" else MISSING
            response = client.post(template.format(pk), body, content_type="application/json")
            text = without_echo(response.content.decode(), template.format(pk))
            if response.status_code >= 500:
                problems.append(f"{template} {label}: {response.status_code}")
            if forbidden is not None and (hit := forbidden.search(text)):
                problems.append(f"{template} {label}: contains {hit.group(0)!r}")
            answers[label] = (response.status_code, normalised(text, (str(pk),)))
        theirs = world.portfolios["B"].pk
        if not holds(user, VIEW[model], theirs) and answers["B"] != answers["missing"]:
            problems.append(f"{template}: B's id answers {answers['B'][0]}, a missing id {answers['missing'][0]}")
    bulk_ids = [world.ids[DeadLetter][label] for label in ("A1", "A2", "B")] + [MISSING]
    bulk = client.post(
        "/api/v1/dead-letters/bulk/",
        {"operation": "dismiss", "letter_ids": bulk_ids, **reason},
        content_type="application/json",
    )
    if bulk.status_code != 403:
        problems.append(f"bulk dismiss as {user_key}: {bulk.status_code} {bulk.content[:200]!r}")
    selected = client.post(
        "/console/jobs/selected/",
        {"operation": "run_now", "job": [str(world.ids[CleanupJob][k]) for k in ("A1", "B")], **reason},
    )
    if selected.status_code != 403:
        problems.append(f"console jobs/selected as {user_key}: {selected.status_code}")
    assert AuditEvent.objects.count() == events
    assert DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count() == open_letters
    assert not problems, "\n".join(problems)
