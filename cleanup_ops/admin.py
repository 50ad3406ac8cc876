"""Read-only admin for the worker clusters' heartbeats (operators and auditors may view them)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from cleanup_ops.models import WorkerHeartbeat


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("cluster", "host", "pid", "started_at", "last_progress_at", "turns", "jobs_leased", "rows_deleted")
    list_filter = ("cluster",)
    ordering = ("host", "cluster")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
