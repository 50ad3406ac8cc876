"""Shared REST plumbing for the apps' APIs under ``/api/v1/`` (DRF).

``RolePermission`` maps each view action to a Django permission;
``call_service`` runs a service and maps its errors to HTTP
(``ValidationError`` → 400, ``PermissionDenied`` → 403); ``int_param`` and
``choice_param`` validate list filters; ``Conflict`` is the 409 an app's API
raises for its own state conflicts; ``ReasonSerializer`` is the body of every
action that only takes a reason; ``TenantScoped`` narrows a viewset to the
user's portfolios. It lives in ``retention`` (the lower layer)
so both ``retention.api`` and ``cleanup_ops.api`` can use it.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, PermissionDenied, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from retention.filters import FilterError, id_param
from retention.filters import choice_param as filters_choice_param
from retention.scoping import scope_queryset


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict"


# Reads: the keys a view may use for its GET permission, in the order looked up.
_READ_KEYS = ("get", "list", "retrieve")


class RolePermission(BasePermission):
    """Each view declares ``required_perms = {action: "app.codename"}``.

    ``HEAD`` and ``OPTIONS`` are reads: they need the same permission as
    ``GET`` (a viewset's ``list``/``retrieve``, a plain view's ``get``), never
    less. DRF routes a viewset's ``OPTIONS`` to its ``metadata`` action and a
    plain view's ``HEAD`` to no action at all, so neither would find a key of
    its own and both would otherwise pass unchecked. A view that declares no
    read permission answers them only to a user holding one of its others.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        perms: dict[str, str] = getattr(view, "required_perms", {})
        method = request.method.lower()
        action = getattr(view, "action", None)
        if method in ("head", "options") or action == "metadata":
            required = [perms[key] for key in _read_keys(action) if key in perms]
            if not required:
                return not perms or any(request.user.has_perm(perm) for perm in perms.values())
            return request.user.has_perm(required[0])
        perm = perms.get(action or method)
        return perm is None or request.user.has_perm(perm)


def _read_keys(action: str | None) -> tuple[str, ...]:
    """A HEAD routed to ``retrieve`` needs retrieve's permission first."""
    if action in _READ_KEYS:
        return (action, *(key for key in _READ_KEYS if key != action))
    return _READ_KEYS


def call_service(fn: Any, **kwargs: Any) -> Any:
    try:
        return fn(**kwargs)
    except DjangoValidationError as exc:
        raise ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}) from None
    except DjangoPermissionDenied as exc:
        raise PermissionDenied(str(exc) or None) from None


def filter_errors_as_400() -> Any:
    """Context: a ``FilterError`` from a filter parser becomes a 400 naming the parameter."""
    return _FilterErrors()


class _FilterErrors:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, FilterError):
            raise ValidationError({exc.field: exc.message}) from None
        return False


def int_param(request: Request, name: str) -> int | None:
    with filter_errors_as_400():
        return id_param(request.query_params, name, strict=True)


def choice_param(request: Request, name: str, choices: list[str]) -> str | None:
    with filter_errors_as_400():
        return filters_choice_param(request.query_params, name, choices, strict=True)


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class TenantScoped:
    """Mixin for viewsets over tenant data (``retention.scoping``).

    Lists and object lookups go through ``filter_queryset``, so narrowing it
    covers every list, detail and detail action, whatever ``get_queryset``
    a viewset writes. On a detail route the object is looked up *before* the
    role check: another customer's object is a 404 for every role, exactly
    like an id that does not exist, never a 403 that would confirm it exists.
    """

    portfolio_field = "portfolio_id"

    def scope(self, queryset: Any) -> Any:
        return scope_queryset(queryset, self.request.user, field=self.portfolio_field)  # type: ignore[attr-defined]

    def filter_queryset(self, queryset: Any) -> Any:
        return self.scope(super().filter_queryset(queryset))  # type: ignore[misc]

    def check_permissions(self, request: Request) -> None:
        lookup = self.lookup_url_kwarg or self.lookup_field  # type: ignore[attr-defined]
        if request.user and request.user.is_authenticated and lookup in self.kwargs:  # type: ignore[attr-defined]
            self.get_object()  # type: ignore[attr-defined]
        super().check_permissions(request)  # type: ignore[misc]
