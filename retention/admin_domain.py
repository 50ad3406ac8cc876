"""Admin for the demo's domain models (portfolios, properties and their records).

They live here, not in ``properties/admin.py``, because every page is scoped
to the user's portfolios and memberships are a ``retention`` concept: the
domain app imports nothing of ours (import-linter). ``retention.admin``
calls ``register_demo_domain`` so the admin registers them.

Only when the demo's ``properties`` app is installed: a host's own customer
and site models (``RETENTION_PORTFOLIO_MODEL``, ``RETENTION_PROPERTY_MODEL``)
have the host's own admin, which may scope its pages with
``retention.admin_scoping.PortfolioScopedAdmin``.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from retention.admin_scoping import PortfolioListFilter, PortfolioScopedAdmin
from retention.domain import portfolio_model, property_portfolio_attname
from retention.inputs import key_or_none


class PortfolioAdmin(PortfolioScopedAdmin):
    portfolio_field = "pk"
    list_display = ["id", "name", "slug", "created_at"]
    search_fields = ["name", "slug"]


class PropertyAdmin(PortfolioScopedAdmin):
    list_display = ["id", "name", "portfolio"]
    list_filter = [("portfolio", PortfolioListFilter)]
    list_select_related = ["portfolio"]
    search_fields = ["name"]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> Any:
        """An autocomplete (a legal hold's property picker) that sends the
        chosen ``portfolio`` gets that portfolio's properties only
        (``retention/static/retention/hold_property_picker.js``; the admin
        site refuses a value that is not an id). The hold's picker with no
        portfolio chosen yet gets none: offering every portfolio's properties
        would offer ones the form then refuses. The form still checks the pair."""
        queryset, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if not request.path.endswith("/autocomplete/"):
            return queryset, may_have_duplicates
        portfolio = request.GET.get("portfolio", "")
        key = key_or_none(portfolio, model=portfolio_model()) if portfolio else None
        if key is not None:
            queryset = queryset.filter(**{property_portfolio_attname(): key})
        elif request.GET.get("model_name") == "legalhold" and request.GET.get("field_name") == "property":
            queryset = queryset.none()
        return queryset, may_have_duplicates


class RecordAdmin(PortfolioScopedAdmin):
    list_filter = [("portfolio", PortfolioListFilter)]
    raw_id_fields = ["portfolio", "property"]
    show_full_result_count = False


class LeaseAdmin(RecordAdmin):
    list_display = ["id", "portfolio_id", "property_id", "unit", "ended_at"]


class MaintenanceRecordAdmin(RecordAdmin):
    list_display = ["id", "portfolio_id", "property_id", "summary", "closed_at"]


class TenantActivityAdmin(RecordAdmin):
    list_display = ["id", "portfolio_id", "property_id", "activity_type", "occurred_at"]


def register_demo_domain(site: admin.AdminSite) -> None:
    """Register the demo's models, when the ``properties`` app is installed.
    Each one only if the project chose it (the customer and site models) and
    nobody registered it first."""
    if not apps.is_installed("properties"):
        return
    models = {
        "properties.Portfolio": PortfolioAdmin,
        "properties.Property": PropertyAdmin,
        "properties.Lease": LeaseAdmin,
        "properties.MaintenanceRecord": MaintenanceRecordAdmin,
        "properties.TenantActivity": TenantActivityAdmin,
    }
    for label, model_admin in models.items():
        model = apps.get_model(label)
        if not model._meta.swapped and not site.is_registered(model):
            site.register(model, model_admin)
