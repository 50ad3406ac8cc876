"""Names for ids (portfolios, properties, sweeps, users) and the scope type every read takes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import User

from cleanup_ops.models import Sweep
from properties.models import Portfolio, Property
from retention.scoping import portfolio_ids_q

# None: every portfolio (platform staff); a set: a customer's portfolios.
PortfolioScope = frozenset[int] | None

PAGE_SIZE = 50
# The longest text a search box takes.
SEARCH_MAX_LENGTH = 100


# --- Names -------------------------------------------------------------------


def portfolio_names(ids: Iterable[int | None]) -> dict[int, str]:
    """Portfolio id → name for the ids a page shows: one query (none if empty)."""
    wanted = sorted({i for i in ids if i is not None})
    if not wanted:
        return {}
    return dict(Portfolio.objects.filter(pk__in=wanted).values_list("id", "name"))


def portfolio_choices(*, portfolio_ids: PortfolioScope) -> list[dict[str, Any]]:
    """Every portfolio the user may see, by name (a pause form's select)."""
    qs = Portfolio.objects.filter(portfolio_ids_q(portfolio_ids, field="pk")).order_by("name", "id")
    return list(qs.values("id", "name", "slug"))


def _wanted(ids: Iterable[Any]) -> list[int]:
    return sorted({int(i) for i in ids if isinstance(i, int) or (isinstance(i, str) and i.isdigit())})


def property_names(ids: Iterable[int | None]) -> dict[int, str]:
    """Property id → name for the ids a page shows: one query (none if empty)."""
    wanted = _wanted(ids)
    return dict(Property.objects.filter(pk__in=wanted).values_list("id", "name")) if wanted else {}


def sweep_keys(ids: Iterable[int | None]) -> dict[int, str]:
    """Sweep id → its key (the slot: ``cleanup:2026-08-21T02:00Z``): one query."""
    wanted = _wanted(ids)
    return dict(Sweep.objects.filter(pk__in=wanted).values_list("id", "key")) if wanted else {}


def usernames(ids: Iterable[int | None]) -> dict[int, str]:
    wanted = _wanted(ids)
    return dict(User.objects.filter(pk__in=wanted).values_list("id", "username")) if wanted else {}


def audit_names(events: Iterable[Any]) -> dict[str, dict[int, str]]:
    """The names an audit page's details need (portfolios, properties, sweeps,
    users they mention, and portfolios that are the object): four queries at most."""
    events = list(events)
    details = [e.details for e in events if isinstance(e.details, dict)]
    portfolios = [d.get("portfolio_id") for d in details]
    portfolios += [e.object_id for e in events if e.object_type == "portfolio"]
    return {
        "portfolios": portfolio_names(_wanted(portfolios)),
        "properties": property_names(d.get("property_id") for d in details),
        "sweeps": sweep_keys(d.get("sweep_id") for d in details),
        "users": usernames(d.get("user_id") for d in details),
    }
