"""Admin for the domain models (portfolios, properties and their records).

They live here, not in ``properties/admin.py``, because every page is scoped
to the user's portfolios and memberships are a ``retention`` concept: the
domain app imports nothing of ours (import-linter). ``retention.admin``
imports this module so the admin registers it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.admin_scoping import PortfolioListFilter, PortfolioScopedAdmin
from retention.inputs import id_problem


@admin.register(Portfolio)
class PortfolioAdmin(PortfolioScopedAdmin):
    portfolio_field = "pk"
    list_display = ["id", "name", "slug", "created_at"]
    search_fields = ["name", "slug"]


@admin.register(Property)
class PropertyAdmin(PortfolioScopedAdmin):
    list_display = ["id", "name", "portfolio"]
    list_filter = [("portfolio", PortfolioListFilter)]
    list_select_related = ["portfolio"]
    search_fields = ["name"]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Property], search_term: str) -> Any:
        """An autocomplete (a legal hold's property picker) that sends the
        chosen ``portfolio`` gets that portfolio's properties only
        (``retention/static/retention/hold_property_picker.js``; the admin
        site refuses a value that is not an id). The form still checks the pair."""
        queryset, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        portfolio = request.GET.get("portfolio", "")
        if request.path.endswith("/autocomplete/") and id_problem(portfolio, field="portfolio", from_form=True) is None:
            queryset = queryset.filter(portfolio_id=int(portfolio))
        return queryset, may_have_duplicates


class RecordAdmin(PortfolioScopedAdmin):
    list_filter = [("portfolio", PortfolioListFilter)]
    raw_id_fields = ["portfolio", "property"]
    show_full_result_count = False


@admin.register(Lease)
class LeaseAdmin(RecordAdmin):
    list_display = ["id", "portfolio_id", "property_id", "unit", "ended_on"]


@admin.register(MaintenanceRecord)
class MaintenanceRecordAdmin(RecordAdmin):
    list_display = ["id", "portfolio_id", "property_id", "summary", "closed_at"]


@admin.register(TenantActivity)
class TenantActivityAdmin(RecordAdmin):
    list_display = ["id", "portfolio_id", "property_id", "activity_type", "occurred_at"]
