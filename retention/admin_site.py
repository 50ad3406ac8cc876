"""The admin site: every changelist and autocomplete request is checked first.

Django's changelist applies any lookup on a model's own fields that the
query string names (``?created_at__year=…``, ``?unit__regex=(a``) and fails
with a 500 on values it cannot turn into SQL (a 20-digit year, year 9999
whose range ends in year 10000, an invalid regular expression on
PostgreSQL). ``GuardedAdminSite.admin_view`` wraps every model admin's
changelist, whatever app registered it (ours, django-q2's, django-axes'),
so that before Django's code runs:

- only the parameters the list itself offers are accepted — the lookups of
  its ``list_filter`` entries and its date hierarchy, plus the changelist's
  own ``q``, ``o``, ``p``, ``all``, ``e``, ``_popup``, ``_to_field``,
  ``_changelist_filters``, ``_facets``; any other is a 400 naming it;
- values are checked: ids (a related filter's ``…__id__exact``, an action's
  ``_selected_action``) are 1 to 19 digits up to 2^63-1, a date
  hierarchy's year is 1 to 9998, its month 1 to 12, its day 1 to 31, and
  free text (``q`` included) is at most ``MAX_FILTER_LENGTH`` characters.

The change, history and delete pages of every model check the permission
to view the model before looking the object up (Django does it the other way
round, which tells a user without the permission which ids exist).

A changelist action is a write: an action that declares no
``allowed_permissions`` (django-q2's "Resubmit selected tasks", which also
deletes failed-task records) is refused with a 403 to a user without the
model's change permission, whatever the selection (``select_across`` too);
Django would run it for anyone who may view the list.

Autocomplete (``/admin/autocomplete/``) takes a ``term`` of at most
``MAX_FILTER_LENGTH`` characters. Control characters anywhere are refused
earlier, by ``retention.middleware``. A 400 here renders a short page that
names the parameter; nothing is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.contrib.admin.utils import get_fields_from_path
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseBase

from retention.domain import portfolio_model
from retention.inputs import MAX_FILTER_LENGTH, id_problem, key_problem, text_problem

# Views of one object (and Django's redirect to change): permission before lookup.
OBJECT_VIEWS = frozenset({"change_view", "history_view", "delete_view"})
CHANGELIST_PARAMS = frozenset({"q", "o", "p", "all", "e", "_popup", "_to_field", "_changelist_filters", "_facets"})

# Kinds of value a changelist parameter takes.
ID, YEAR, MONTH, DAY, TEXT = "id", "year", "month", "day", "text"
INTEGER_KEYS = frozenset({"AutoField", "BigAutoField", "SmallAutoField", "IntegerField", "BigIntegerField"})
RANGES = {YEAR: (1, 9998), MONTH: (1, 12), DAY: (1, 31)}


def all_values_filter(field: Any, filter_class: Any) -> bool:
    """Whether the changelist filters ``field`` with Django's
    ``AllValuesFieldListFilter``: named, or the default for a plain field
    (no choices, not a boolean, not a date: those have filters of their own)."""
    if filter_class is not None:
        return isinstance(filter_class, type) and issubclass(filter_class, admin.AllValuesFieldListFilter)
    return not field.choices and not isinstance(field, models.BooleanField | models.DateField)


def changelist_lookups(model_admin: admin.ModelAdmin, request: HttpRequest) -> dict[str, str]:
    """Every query parameter the changelist's filters and date hierarchy read, with its kind."""
    lookups: dict[str, str] = {}
    for entry in model_admin.get_list_filter(request):
        if isinstance(entry, list | tuple):
            # A path: a list_filter tuple may start with a Field too, but Django's own
            # lookup (get_fields_from_path) takes a path, and every tuple here names one.
            path, filter_class = cast(str, entry[0]), entry[1]
        elif isinstance(entry, str):
            path, filter_class = entry, None
        else:  # a SimpleListFilter: its own parameter
            lookups[str(getattr(entry, "parameter_name", ""))] = TEXT
            continue
        try:
            field = get_fields_from_path(model_admin.model, path)[-1]
        except (FieldDoesNotExist, LookupError):
            continue
        lookups[f"{path}__isnull"] = TEXT
        if filter_class is admin.EmptyFieldListFilter:
            lookups[f"{path}__isempty"] = TEXT
        elif field.is_relation:
            target_field = getattr(field, "target_field", None)
            target = target_field.name if target_field is not None else "pk"
            # An id where the related key is an integer; a UUID or a string key
            # (a host's customer, site or user) is text, which its field parses.
            integer = target_field is None or isinstance(target_field, models.IntegerField)
            lookups[f"{path}__{target}__exact"] = ID if integer else TEXT
            lookups[f"{path}__{target}__in"] = TEXT
        else:
            for suffix in ("exact", "gte", "lt"):
                lookups[f"{path}__{suffix}"] = TEXT
            if all_values_filter(field, filter_class):
                # Django's AllValuesFieldListFilter (a plain field's default:
                # axes' "path info") filters by the bare path, ``?path_info=…``;
                # without it here every link of that filter answered 400.
                lookups[path] = TEXT
    hierarchy = model_admin.get_date_hierarchy(request) if hasattr(model_admin, "get_date_hierarchy") else None
    hierarchy = hierarchy or model_admin.date_hierarchy
    if hierarchy:
        lookups.update({f"{hierarchy}__year": YEAR, f"{hierarchy}__month": MONTH, f"{hierarchy}__day": DAY})
    return lookups


def value_problem(name: str, value: str, kind: str) -> str | None:
    problem = text_problem(value, field=name, max_length=MAX_FILTER_LENGTH)
    if problem is not None or value == "":
        return problem
    if kind == ID:
        return id_problem(value, field=name, from_form=True)
    if kind in RANGES:
        low, high = RANGES[kind]
        if not (value.isascii() and value.isdigit() and len(value) <= 4 and low <= int(value) <= high):
            return f"{name} must be a whole number from {low} to {high}."
    return None


def changelist_problem(model_admin: admin.ModelAdmin, request: HttpRequest) -> tuple[str, str] | None:
    """The first parameter of a changelist request that the list does not
    take, or whose value is not valid, with the reason; ``None`` if all are."""
    lookups = changelist_lookups(model_admin, request)
    for name, values in request.GET.lists():
        kind = TEXT if name in CHANGELIST_PARAMS else lookups.get(name)
        if kind is None:
            return name, f"{name} is not a filter of this list."
        for value in values:
            if (problem := value_problem(name, value, kind)) is not None:
                return name, problem
    if request.method == "POST":
        action = request.POST.get("action", "")
        if action:
            # get_actions' values are never None (its declared type allows it).
            func = (model_admin.get_actions(request).get(action) or (None,))[0]
            if (
                func is not None
                and not getattr(func, "allowed_permissions", ())
                and not model_admin.has_change_permission(request)
            ):
                raise PermissionDenied
        # Ids are integers where the model's key is (django-q2's task ids are text).
        integer_key = model_admin.model._meta.pk.get_internal_type() in INTEGER_KEYS
        for value in request.POST.getlist("_selected_action"):
            problem = (
                id_problem(value, field="_selected_action", from_form=True)
                if integer_key
                else value_problem("_selected_action", value, TEXT)
            )
            if problem is not None:
                return "_selected_action", problem
    return None


def autocomplete_problem(request: HttpRequest) -> tuple[str, str] | None:
    for name in ("term", "app_label", "model_name", "field_name", "page"):
        problem = text_problem(request.GET.get(name, ""), field=name, max_length=MAX_FILTER_LENGTH)
        if problem is not None:
            return name, problem
    # The legal hold form's property picker narrows by the chosen portfolio (an id, or nothing chosen yet).
    portfolio = request.GET.get("portfolio", "")
    if portfolio and (problem := key_problem(portfolio, model=portfolio_model(), field="portfolio", from_form=True)):
        return "portfolio", problem
    return None


def refused(field: str, message: str) -> HttpResponse:
    return HttpResponseBadRequest(f"{field}: {message}\n", content_type="text/plain")


# A view: what admin_view takes and gives back, of the same type (the base class's signature).
_View = TypeVar("_View", bound=Callable[..., HttpResponseBase])


class GuardedAdminSite(admin.AdminSite):
    def admin_view(self, view: _View, cacheable: bool = False) -> _View:
        owner = getattr(view, "__self__", None)
        name = getattr(view, "__name__", "")
        checked: Callable[..., Any] = view
        if name == "changelist_view" and isinstance(owner, admin.ModelAdmin):
            checked = self._guard(view, lambda request: changelist_problem(owner, request))
        elif name in OBJECT_VIEWS and isinstance(owner, admin.ModelAdmin):
            checked = self._permission_first(view, owner)
        elif name == "autocomplete_view" and owner is self:
            checked = self._guard(view, autocomplete_problem)
        # The wrappers take the view's arguments and answer its response or a
        # 400/403 (functools.wraps keeps its name): still a view of its type.
        return super().admin_view(cast(_View, checked), cacheable)

    @staticmethod
    def _permission_first(view: Callable[..., Any], model_admin: admin.ModelAdmin) -> Callable[..., Any]:
        """Django looks an object up before it checks the permission: a user
        who may not view the model gets a redirect ("does not exist") for a
        missing id and a 403 for an existing one — an oracle for ids. Here
        the permission comes first, so every id answers the same 403."""

        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if not model_admin.has_view_or_change_permission(request):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return checked

    @staticmethod
    def _guard(view: Callable[..., Any], check: Callable[[HttpRequest], tuple[str, str] | None]) -> Callable[..., Any]:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            problem = check(request)
            if problem is not None:
                return refused(*problem)
            return view(request, *args, **kwargs)

        return guarded


class GuardedAdminConfig(AdminConfig):
    """Django's admin app with ``GuardedAdminSite`` as ``admin.site`` (``INSTALLED_APPS``)."""

    default_site = "retention.admin_site.GuardedAdminSite"
