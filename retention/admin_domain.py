"""Admin for the domain models (portfolios, properties and their records).

They live here, not in ``properties/admin.py``, because every page is scoped
to the user's portfolios and memberships are a ``retention`` concept: the
domain app imports nothing of ours (import-linter). ``retention.admin``
imports this module so the admin registers it.
"""

from __future__ import annotations

from django.contrib import admin

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.admin_scoping import PortfolioListFilter, PortfolioScopedAdmin


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
