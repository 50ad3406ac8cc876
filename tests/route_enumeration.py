"""Django's URL resolver, enumerated for the route crawler: every pattern as a
``Route`` (``routes``), its URL for given parameter values (``fill``), the
variants the crawler asks it in (another customer's id, one's own, a missing
one; every word a parameter takes) and the formats (JSON, the browsable API,
CSV, a console page and its htmx partial); and the crawls' shares (``in_turn``,
``pieces``): a crawl cut in ``SHARES`` tests per user, one of them in the fast
tier (``tests/test_route_crawler.py`` says why).

Separate from ``tests/test_route_crawler.py`` because other modules enumerate
the routes too (``tests/test_bad_input.py``, the hostile-input crawl).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern

from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from properties.models import Lease, Portfolio
from retention.models import LegalHold, PolicyVersion, RetentionPolicy

from .crawler_world import CUSTOMER_USERS, MISSING, PLATFORM_USERS, World

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
    """Every pattern of the URLconf in use, in the resolver's order."""
    return list(_routes_of(get_resolver()))


@functools.cache
def _routes_of(resolver: URLResolver) -> tuple[Route, ...]:
    """The walk itself, once per resolver (``get_resolver`` keeps one per URLconf): each
    crawl piece asks for the routes several times (its share, its checks), and the
    hostile-input crawl's 60 pieces four times each."""
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

    walk(resolver.url_patterns, (), ())
    return tuple(found)


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
    # The catch-all under api/ (retention.apierrors.api_not_found).
    "rest": ["no-such-route/"],
    "token_id": ["0123456789abcde"],  # an API token's id (knox's token_key): nobody's here
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


# --- The crawls in shares -------------------------------------------------------------

SHARES = 5
CRAWLED_USERS = CUSTOMER_USERS + PLATFORM_USERS
T = TypeVar("T", bound=Hashable)


def in_turn(items: Iterable[T]) -> dict[T, int]:
    """Each of ``items`` once, in their order, with its share: the n-th in share n mod ``SHARES``."""
    return {item: index % SHARES for index, item in enumerate(dict.fromkeys(items))}


def fast_share(user_key: str) -> int:
    """The share ``user_key`` crawls in the fast tier: the k-th user the k-th share."""
    return CRAWLED_USERS.index(user_key) % SHARES


def pieces() -> list[Any]:
    """``(user_key, share)`` for every crawled user and share: each user's fast share a
    database test, the others ``system`` (only ``make test`` runs them)."""
    return [
        pytest.param(
            user_key,
            share,
            id=f"{user_key}-{share + 1}of{SHARES}",
            marks=() if share == fast_share(user_key) else pytest.mark.system,
        )
        for user_key in CRAWLED_USERS
        for share in range(SHARES)
    ]
