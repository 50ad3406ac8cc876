"""Hostile paths and bodies on every route Django resolves, as every crawled
user (issue 30): a NUL or a lone surrogate in any parameter (or appended to
a route without one) is a 400, and JSON nested 50,000 deep posted anywhere
is never a server error — a 4xx on the API.

The routes are enumerated as the crawler enumerates them
(``tests/route_enumeration.py``), logged in as the crawler's users
(``tests/crawler_world.py``), and cut in shares as the crawler's are: the
routes, in the resolver's order, fall in one of ``SHARES`` shares in turn, and
each user's crawl is one test per share. ``make test-fast`` runs each user's
one share (the k-th user the k-th share: every route, as a customer user),
``make test`` every share as every user (the others are ``system``).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from . import crawler_world
from .crawler_world import METHODS, World
from .route_enumeration import Route, fill, in_turn, pieces, routes

pytestmark = pytest.mark.django_db

world = crawler_world.world  # the fixture: customers a and b, their canaries (tests/crawler_world.py)


# --- Issue 30: hostile paths and bodies on every route, as every crawled user -------------

HOSTILE_PATH_VALUES = {"nul": "%00", "lone-surrogate": "%ED%A0%80"}
DEEP_JSON = "[" * 50_000 + "]" * 50_000


def routes_of(share: int) -> list[Route]:
    """The routes of one share, in the resolver's order."""
    shares = in_turn(route.pattern for route in routes())
    found = [route for route in routes() if shares[route.pattern] == share]
    assert found, f"share {share} holds no route"
    return found


def hostile_urls(value: str, share: int) -> list[str]:
    """Every route of the share with ``value`` in each of its parameters, or appended to a route without any."""
    urls = set()
    for route in routes_of(share):
        if route.params:
            urls.add(fill(route, dict.fromkeys(route.params, value)))
        else:
            path = fill(route, {}).split("?")[0]
            urls.add(path + value if path.endswith("/") else f"{path}/{value}")
    return sorted(urls)


@pytest.mark.parametrize(("user_key", "share"), pieces())
def test_a_nul_or_a_lone_surrogate_in_any_routes_path_is_a_400_for_every_user(
    world: World, user_key: str, share: int
) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.get(pk=world.users[user_key].pk))
    for name, value in HOSTILE_PATH_VALUES.items():
        for url in hostile_urls(value, share):
            for method in METHODS:
                response = getattr(client, method)(url)
                assert response.status_code == 400, f"{method.upper()} {url} ({name}) as {user_key}"


@pytest.mark.parametrize(("user_key", "share"), pieces())
def test_json_50000_deep_on_any_route_is_never_a_server_error_and_a_4xx_on_the_api(
    world: World, user_key: str, share: int
) -> None:
    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    client.force_login(User.objects.get(pk=world.users[user_key].pk))
    client.cookies["csrftoken"] = "a" * 32  # a browser's session holds one: the CSRF check then parses the body
    for route in routes_of(share):
        url = fill(route, {p: ("json" if p == "format" else "1") for p in route.params})
        response = client.post(url, DEEP_JSON, content_type="application/json")
        assert response.status_code < 500, f"POST {url} as {user_key}: {response.status_code}"
        if url.startswith("/api/"):
            assert 400 <= response.status_code < 500, f"POST {url} as {user_key}: {response.status_code}"
