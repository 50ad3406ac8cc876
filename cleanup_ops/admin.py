"""Read-only admin for the worker clusters' heartbeats (operators and auditors may view them).

django-q2's admin is view-only for operators (``retention.roles``): its
"Resubmit selected tasks" action re-enqueues tasks and, on failed tasks,
deletes their records, yet declares no permission, so Django offers it to
anyone who may view the list. It is declared a change here, so the action
is neither shown nor run without ``django_q.change_*`` (the admin site
refuses any undeclared action to such a user as well).

The API tokens' admin is ``cleanup_ops.admin_tokens``, registered where
knox is installed.
"""

from __future__ import annotations

from django.apps import apps as django_apps
from django.contrib import admin
from django.http import HttpRequest
from django_q import admin as django_q_admin

from cleanup_ops.models import WorkerHeartbeat

django_q_admin.resubmit_task.allowed_permissions = ("change",)


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


# The API tokens' admin needs knox; a host without it is told the line to add
# (``cleanup_ops.checks``) rather than failing here as the admin is discovered.
if django_apps.is_installed("knox"):
    from cleanup_ops import admin_tokens  # noqa: F401 - registers the tokens' admin
