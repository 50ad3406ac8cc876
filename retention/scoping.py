"""Tenant scoping: where a user may do what, defined once.

The one rule (docs/policies.md, "Memberships and roles"): **a user may do X in the
portfolios where they hold a role that grants X's permission** — every
portfolio for the platform's staff whose groups grant it, and for a
customer's staff the portfolios of their memberships whose role grants it
(``roles.MEMBERSHIP_ROLE_PERMISSIONS``). Membership alone grants nothing: an
auditor of portfolio 1 who is a property manager of portfolio 3 reads jobs
of portfolio 1 only, because a property manager's role does not grant
``cleanup_ops.view_cleanupjob``.

- **Platform staff** — superusers and members of the groups in
  ``roles.PLATFORM_GROUPS`` (``operator``, ``auditor``,
  ``compliance_reviewer``) — hold their groups' permissions everywhere.
- **Customer staff** hold each permission in the portfolios of the
  memberships whose role grants it, there only.
- The ``property_manager`` group grants no portfolio: a user in it without
  memberships sees nothing (fail closed: customer staff must be members).

Every read of tenant data goes through ``scope_queryset(qs, user, perm=…)``
(or ``portfolio_ids_where`` where a set is needed) with the permission the
read needs — the one its route, page or admin requires — and every tenant
write checks ``may_act_in`` with the write's permission. Objects outside the
scope answer 404 exactly like objects that do not exist. Results are cached
on the user object, which lives for one request, so a page pays one query
per permission however many querysets it filters.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib.auth.backends import ModelBackend
from django.db.models import Model, Q, QuerySet

from retention.backends import MEMBERSHIP_PERM_CACHE
from retention.domain import portfolio_model, portfolio_model_label, view_permission
from retention.models import Membership
from retention.roles import MEMBERSHIP_ROLE_PERMISSIONS, PLATFORM_GROUPS

M = TypeVar("M", bound=Model)

# The portfolios a read may see: None, every portfolio (platform staff); a
# set, a customer's portfolios. The type every scoped selector takes.
PortfolioScope = frozenset[int] | None

_CACHE = "_tenant_scope_cache"


def _cache(user: Any) -> dict[str, Any]:
    cache = getattr(user, _CACHE, None)
    if cache is None:
        cache = {}
        setattr(user, _CACHE, cache)
    return cache


def forget_cached_scope(user: Any) -> None:
    """Drop the scope and membership permissions cached on ``user`` (after
    its memberships changed, for a user object that outlives the change)."""
    for name in (_CACHE, MEMBERSHIP_PERM_CACHE):
        if hasattr(user, name):
            delattr(user, name)


def _known(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def is_platform_staff(user: Any) -> bool:
    """Superusers and members of a platform group: they see every portfolio."""
    if not _known(user):
        return False
    if user.is_superuser:
        return True
    cache = _cache(user)
    if "platform" not in cache:
        cache["platform"] = user.groups.filter(name__in=PLATFORM_GROUPS).exists()
    return bool(cache["platform"])


VIEW_PORTFOLIO = view_permission(portfolio_model_label())
AUDIT_VIEW = "retention.view_auditevent"


def visible_portfolio_ids(user: Any) -> PortfolioScope:
    """The portfolios in which ``user`` may view the portfolio itself; ``None``
    means every portfolio. Every role grants it, so this is every portfolio
    the user is a member of, and it is used only for reads of portfolios."""
    return portfolio_ids_where(user, VIEW_PORTFOLIO)


def portfolios_visible_to(user: Any) -> QuerySet[Any]:
    return portfolios_where(user, VIEW_PORTFOLIO)


def portfolio_ids_q(portfolio_ids: frozenset[int] | None, *, field: str = "portfolio_id") -> Q:
    """Rows whose ``field`` (a lookup path to a portfolio id) is one of
    ``portfolio_ids``; every row when it is ``None``. For selectors that take
    a scope instead of a user (``visible_portfolio_ids`` gives it)."""
    if portfolio_ids is None:
        return Q()
    return Q(**{f"{field}__in": sorted(portfolio_ids)})


def scope_queryset(qs: QuerySet[M], user: Any, *, perm: str, field: str = "portfolio_id") -> QuerySet[M]:
    """``qs`` narrowed to rows whose ``field`` (a lookup path to a portfolio
    id) is a portfolio in which ``user`` holds ``perm``. Unchanged for the
    platform's staff holding it."""
    return qs.filter(portfolio_ids_q(portfolio_ids_where(user, perm), field=field))


def audit_scope_q(portfolio_ids: frozenset[int]) -> Q:
    """Audit events about these portfolios: the ones whose details name one
    (policies, versions, holds, memberships) or whose object is one (a
    portfolio's pause). Events about the platform as a whole match neither."""
    ids = sorted(portfolio_ids)
    return Q(details__portfolio_id__in=ids) | Q(object_type="portfolio", object_id__in=[str(i) for i in ids])


def scope_audit_events(qs: QuerySet[M], user: Any) -> QuerySet[M]:
    """Audit events of the portfolios where ``user`` may view audit events."""
    ids = portfolio_ids_where(user, AUDIT_VIEW)
    return qs if ids is None else qs.filter(audit_scope_q(ids))


def _platform_has_perm(user: Any, perm: str) -> bool:
    # Only the groups' and the user's own permissions count platform-wide;
    # ``user.has_perm`` would also count membership roles, which hold in their
    # portfolios only.
    return bool(user.is_superuser or ModelBackend().has_perm(user, perm))


def roles_granting(perm: str) -> list[str]:
    return sorted(role for role, perms in MEMBERSHIP_ROLE_PERMISSIONS.items() if perm in perms)


def portfolio_ids_where(user: Any, perm: str) -> PortfolioScope:
    """Portfolios in which ``user`` holds ``perm``; ``None`` means every portfolio."""
    if not _known(user):
        return frozenset()
    if is_platform_staff(user) and _platform_has_perm(user, perm):
        return None
    cache = _cache(user)
    key = f"where:{perm}"
    if key not in cache:
        cache[key] = frozenset(
            Membership.objects.filter(user_id=user.pk, role__in=roles_granting(perm))
            .values_list("portfolio_id", flat=True)
            .distinct()
        )
    return cache[key]


def portfolios_where(user: Any, perm: str) -> QuerySet[Any]:
    ids = portfolio_ids_where(user, perm)
    qs = portfolio_model()._default_manager.all()
    return qs if ids is None else qs.filter(pk__in=sorted(ids))


def may_act_in(user: Any, perm: str, portfolio_id: int) -> bool:
    """Whether ``user`` holds ``perm`` in the portfolio ``portfolio_id``."""
    ids = portfolio_ids_where(user, perm)
    return ids is None or portfolio_id in ids
