"""Names for ids (portfolios, properties, sweeps, users) and the scope type every read takes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from properties.models import Portfolio
from retention.scoping import portfolio_ids_q

# None: every portfolio (platform staff); a set: a customer's portfolios.

PortfolioScope = frozenset[int] | None

PAGE_SIZE = 50


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
