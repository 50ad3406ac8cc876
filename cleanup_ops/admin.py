"""Read-only admin for the worker clusters' heartbeats (operators and auditors may view them).

django-q2's admin is view-only for operators (``retention.roles``): its
"Resubmit selected tasks" action re-enqueues tasks and, on failed tasks,
deletes their records, yet declares no permission, so Django offers it to
anyone who may view the list. It is declared a change here, so the action
is neither shown nor run without ``django_q.change_*`` (the admin site
refuses any undeclared action to such a user as well).

The API tokens (django-rest-knox's ``AuthToken``) replace knox's own admin:
a list of every token's id (its first characters), user, issue and expiry
for the platform's staff, and deleting one revokes it through
``cleanup_ops.api_tokens.api_token_revoke`` (audited). No add form: knox's
shows the new token in a flash message, which the session may store; tokens
are issued by ``manage.py cleanup_api_token issue``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django_q import admin as django_q_admin
from knox import admin as knox_admin  # noqa: F401 - registers knox's admin now, so it is replaced below
from knox.models import AuthToken

from cleanup_ops.api_tokens import api_token_revoke
from cleanup_ops.models import WorkerHeartbeat
from retention.actors import request_actor

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


# knox's admin is imported above, so it is registered (and replaced here) whatever the apps' order.
if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)


@admin.register(AuthToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("token_key", "user", "created", "expiry")
    search_fields = ("token_key",)
    ordering = ("-created",)
    fields = ("token_key", "user", "created", "expiry")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        api_token_revoke(user=obj.user, token_id=obj.token_key, revoked_by=request_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for token in queryset.select_related("user"):
            self.delete_model(request, token)
