from __future__ import annotations

from django.contrib import admin

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity


@admin.register(Portfolio)
class PortfolioAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "slug", "created_at"]
    search_fields = ["name", "slug"]


@admin.register(Property)
class PropertyAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "portfolio"]
    list_filter = ["portfolio"]
    list_select_related = ["portfolio"]
    search_fields = ["name"]


class RecordAdmin(admin.ModelAdmin):
    list_filter = ["portfolio"]
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
