"""The API tokens' admin (django-rest-knox's ``AuthToken``), replacing knox's
own: a read-only list; deleting a token revokes it through
``cleanup_ops.api_tokens.api_token_revoke`` (audited). No add form: tokens are
issued by ``manage.py cleanup_api_token`` or the API. Imported by
``cleanup_ops.admin`` only where knox is installed."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from knox import admin as knox_admin  # noqa: F401 - registers knox's admin now, so it is replaced below
from knox.models import AuthToken

from cleanup_ops.api_tokens import api_token_revoke
from retention.actors import request_actor

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
