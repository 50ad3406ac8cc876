"""Names for ids (portfolios, properties, sweeps, users) and the scope type every read takes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from cleanup_ops.models import Sweep
from retention.domain import SEARCHED_FIELDS, integer_key, names_by_pk, portfolio_model, property_model
from retention.inputs import key_or_none
from retention.scoping import PortfolioScope, portfolio_ids_q, portfolio_ids_where

PAGE_SIZE = 50
# The longest text a search box takes.
SEARCH_MAX_LENGTH = 100


# --- Names -------------------------------------------------------------------


def portfolio_names(ids: Iterable[Any]) -> dict[Any, str]:
    """Portfolio id → name for the ids a page shows: one query (none if empty)."""
    return _names(portfolio_model(), ids)


def _names(model: type[Any], ids: Iterable[Any]) -> dict[Any, str]:
    """Key → name of the customers or sites ``ids`` name, whatever their key
    type: an id as a page has it (a key, or the text of an audit event's
    details or object id) is read as the model's key, and a key that is not
    an integer is found by its text too (a UUID's in the details)."""
    wanted = {key for key in (_key(model, i) for i in ids) if key is not None}
    if not wanted:
        return {}
    names = names_by_pk(model, sorted(wanted))
    if integer_key(model):
        return names
    return {**names, **{str(key): name for key, name in names.items()}}


def _key(model: type[Any], value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return None
    if integer_key(model) and isinstance(value, int):
        return value
    return key_or_none(str(value), model=model)


def portfolio_choices(*, portfolio_ids: PortfolioScope) -> list[dict[str, Any]]:
    """Every portfolio the user may see, by name (a pause form's select)."""
    model = portfolio_model()
    qs = model._default_manager.filter(portfolio_ids_q(portfolio_ids, field="pk"))
    fields = [name for name in SEARCHED_FIELDS if name in {f.name for f in model._meta.concrete_fields}]
    if "name" in fields:
        return [{"id": row.pop("pk"), **row} for row in qs.order_by("name", "pk").values("pk", *fields)]
    # A host's customer model without a name: its str(), in that order.
    names = names_by_pk(model, qs.values_list("pk", flat=True))
    return [{"id": pk, "name": name} for pk, name in sorted(names.items(), key=lambda item: (item[1], item[0]))]


def _wanted(ids: Iterable[Any]) -> list[int]:
    return sorted({int(i) for i in ids if isinstance(i, int) or (isinstance(i, str) and i.isdigit())})


def property_names(ids: Iterable[Any]) -> dict[Any, str]:
    """Property id → name for the ids a page shows: one query (none if empty)."""
    return _names(property_model(), ids)


def sweep_keys(ids: Iterable[int | None]) -> dict[int, str]:
    """Sweep id → its key (the slot: ``cleanup:2026-08-21T02:00Z``): one query."""
    wanted = _wanted(ids)
    return dict(Sweep.objects.filter(pk__in=wanted).values_list("id", "key")) if wanted else {}


def usernames(ids: Iterable[object]) -> dict[str, str]:
    """User id (as text: ``"7"``, a UUID's ``"0b5e…"``) → username, for the ids
    an audit event's details name, of whatever key type the host's
    ``AUTH_USER_MODEL`` has: one query (none if empty). Ids written before
    details carried text (integers) and ids that are not of the key's type
    (a hand-edited row) are looked up by their text, or skipped."""
    model = get_user_model()
    wanted = set()
    for raw in ids:
        if raw is None or isinstance(raw, bool) or not isinstance(raw, (int, str)):
            continue
        try:
            wanted.add(model._meta.pk.to_python(raw))
        except (ValidationError, ValueError, TypeError):
            continue
    if not wanted:
        return {}
    rows = model._default_manager.filter(pk__in=wanted).values_list("pk", model.USERNAME_FIELD)
    return {str(pk): str(name) for pk, name in rows}


def audit_names(events: Iterable[Any]) -> dict[str, dict[Any, str]]:
    """The names an audit page's details need (portfolios, properties, sweeps,
    users they mention, and portfolios that are the object): four queries at most."""
    events = list(events)
    details = [e.details for e in events if isinstance(e.details, dict)]
    portfolios = [d.get("portfolio_id") for d in details]
    portfolios += [e.object_id for e in events if e.object_type == "portfolio"]
    return {
        "portfolios": portfolio_names(portfolios),
        "properties": property_names(d.get("property_id") for d in details),
        "sweeps": sweep_keys(d.get("sweep_id") for d in details),
        "users": usernames(d.get("user_id") for d in details),
    }


# --- Where a viewer may go ---------------------------------------------------------


@dataclass(frozen=True)
class LinkReach:
    """Which console pages a viewer may open, for pages that name other
    subjects (the audit log, search): those are links, the rest plain names.
    Managers and reviewers read the audit log but not the pipeline's pages: a
    link there would answer 403 (or 404 outside their portfolios)."""

    portfolios: PortfolioScope  # where the portfolio page's permission holds (None: every portfolio)
    jobs: bool
    letters: bool
    sweeps: bool

    def portfolio(self, portfolio_id: object) -> bool:
        """Whether the portfolio page of ``portfolio_id`` opens for the viewer."""
        if self.portfolios is None:
            return True
        # An audit event names it as text (its object_id): read as the customer model's key.
        key = key_or_none(str(portfolio_id), model=portfolio_model())
        return key is not None and key in self.portfolios


def link_reach(user: Any, *, page_perm: str, letter_perm: str) -> LinkReach:
    """``user``'s reach, from the permissions the pages require: the job,
    sweep and portfolio pages ``page_perm`` (the portfolio page only in the
    portfolios where it holds), the dead-letter page ``letter_perm``."""
    may_pages = bool(user.has_perm(page_perm))
    return LinkReach(
        portfolios=portfolio_ids_where(user, page_perm) if may_pages else frozenset(),
        jobs=may_pages,
        letters=bool(user.has_perm(letter_perm)),
        sweeps=may_pages,
    )
