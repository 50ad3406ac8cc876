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

The world (``tests/crawler_world.py``: customers a and b, every id and text a
canary) and the enumeration (``tests/route_enumeration.py``) are their own
modules; this one crawls and checks.

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

The crawl is cut in pieces, and ``make test-fast`` runs a fifth of it. Every
(route pattern, format) pair, in the resolver's order, falls in one of
``SHARES`` shares in turn (the n-th pair in share n mod ``SHARES``:
``route_enumeration.in_turn``); each user's crawl is one test per share, so
``make test`` still crawls every pair as every user, with the same checks. In
the fast tier (database) each user crawls one share — the customer user
listed k-th crawls share k, the superuser share 0 — and the other shares are
in the system tier (``route_enumeration.pieces``). The
fast crawl thus asks every route pattern in every format, by every method,
with every id, as one customer user (the five take turns along the routes),
and each customer user crawls a fifth of the routes; a response there is held
to exactly the checks of the whole crawl (no canary of a portfolio where the
user lacks the permission, no 5xx, another customer's id answering like a
missing one). What only the whole crawl finds is a leak that one role's view
of a route has and another's has not: ``make test`` (and CI) run it.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import resolve

from cleanup_ops.models import CleanupJob, DeadLetter
from retention.models import AuditEvent, Membership
from retention.roles import MEMBERSHIP_ROLE_PERMISSIONS

from . import crawler_world
from .crawler_world import CUSTOMER_USERS, METHODS, MISSING, PORTFOLIO_VIEW, VIEW, World
from .route_enumeration import SHARES, Variant, fast_share, formats, in_turn, pieces, routes, variants

pytestmark = pytest.mark.django_db

world = crawler_world.world  # the fixture: customers a and b, their canaries (tests/crawler_world.py)


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


_DIGIT_RUNS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Forbidden:
    """The canaries a user must never receive: ids (a whole run of digits: no digit on
    either side) and texts (anywhere). One pass over a body for the ids (its runs of
    digits, looked up in a set) and a substring test per text — what one alternation of
    them all with lookarounds found, at a fraction of its cost over thousands of bodies."""

    ids: frozenset[str]
    texts: tuple[str, ...]

    def search(self, text: str) -> str | None:
        """A canary in ``text``, or None."""
        for run in _DIGIT_RUNS.findall(text):
            if run in self.ids:
                return run
        return next((canary for canary in self.texts if canary in text), None)


def forbidden_pattern(user: User, world: World) -> Forbidden | None:
    ids: set[str] = set()
    texts: set[str] = set()
    for canary in world.canaries:
        allowed = canary.perm != "platform-only" and holds(user, canary.perm, canary.portfolio_id)
        if not allowed:
            (ids if canary.is_id else texts).add(canary.text)
    return Forbidden(frozenset(ids), tuple(sorted(texts, key=len, reverse=True))) if ids or texts else None


def may_read(user: User, variant: Variant, world: World) -> bool:
    """Whether the object substituted in ``variant`` is one ``user`` may read."""
    if variant.model is None or variant.label in {"-", "missing"}:
        return True
    portfolio = world.portfolios[variant.label]
    perm = VIEW.get(variant.model)
    if perm is None:  # a platform model (users, sweeps): read wherever the route lets one read
        return variant.label != "B" or holds(user, PORTFOLIO_VIEW, portfolio.pk)
    return holds(user, perm, portfolio.pk)


# Whose objects each user is shown: A2 only where the user's roles differ
# between A1 and A2 (the mixed user); the platform: one object and a missing id.
LABELS = {
    "mixed": frozenset({"A1", "A2", "B"}),
    "superuser": frozenset({"A1"}),
}
DEFAULT_LABELS = frozenset({"A1", "B"})


@dataclass
class Crawl:
    requests: int = 0
    combinations: set[tuple[str, str, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)


def share_of_pairs() -> dict[tuple[str, str], int]:
    """Each (route pattern, format) pair a customer user asks, and its share (the module docstring)."""
    return in_turn((route.pattern, fmt) for route in routes() for fmt, _, _ in formats(route, customer=True))


def crawl(user_key: str, world: World, share: int | None = None) -> Crawl:
    """``user_key``'s crawl: of every (route, format) pair, or of one share of them."""
    shares = share_of_pairs()
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
            if share is not None and shares[(route.pattern, fmt)] != share:
                continue
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
                        result.problems.append(f"{where}: contains {hit!r}")
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


@pytest.mark.parametrize(("user_key", "share"), pieces())
def test_every_route_in_every_format_shows_a_user_nothing_of_portfolios_they_hold_no_role_for(
    world: World, results: dict[str, Crawl], user_key: str, share: int, settings: Any
) -> None:
    # Sessions in memory and no warning line per 4xx: the crawl's thousands of
    # requests spend their time in the views (5xx are still logged).
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    request_log = logging.getLogger("django.request")
    level = request_log.level
    request_log.setLevel(logging.ERROR)
    started = time.monotonic()
    try:
        result = crawl(user_key, world, share)
    finally:
        request_log.setLevel(level)
    results[f"{user_key} {share}"] = result
    print(  # the closing note's figures (pytest -s)
        f"{user_key}: {len(result.combinations)} (route, format) combinations, {result.requests} requests, "
        f"{time.monotonic() - started:.1f} s, statuses {dict(sorted(result.statuses.items()))}"
    )
    assert not result.problems, "\n".join(result.problems[:200]) + f"\n({len(result.problems)} problems)"
    assert result.requests > 500 // SHARES
    share_pairs = {pair for pair, its in share_of_pairs().items() if its == share}
    assert {(pattern, fmt) for pattern, _, fmt in result.combinations} == {
        (pattern, fmt) for pattern, fmt in share_pairs if user_key in CUSTOMER_USERS or fmt != "html"
    }


def test_the_fast_tiers_crawl_asks_every_route_in_every_format_as_a_customer_user() -> None:
    # Each share is some customer user's share in the fast tier, and holds pairs.
    assert {fast_share(user_key) for user_key in CUSTOMER_USERS} == set(range(SHARES))
    assert set(share_of_pairs().values()) == set(range(SHARES))


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
                problems.append(f"{template} {label}: contains {hit!r}")
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
