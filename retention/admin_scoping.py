"""Tenant scoping for the Django admin: one base class every tenant admin uses.

``PortfolioScopedAdmin`` narrows the changelist, search, autocomplete, date
hierarchy and counts (all built on ``get_queryset``) to the portfolios where
the user may *view* the model (``retention.scoping``: the portfolios of the
roles granting ``<app>.view_<model>``, not every membership); answers 404 for the change, history and delete pages
of an object outside them (Django would redirect to the index with a "does not
exist" message, which is not the 404 the API gives); and limits the portfolio
and property choices of a form to the portfolios where the user may add the
object. ``PortfolioListFilter`` lists only the portfolios of the model's view
permission.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.admin.widgets import AutocompleteSelect
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse

from retention.domain import portfolio_model, property_model, property_portfolio_attname
from retention.inputs import key_problem
from retention.scoping import portfolios_where, scope_queryset


def view_permission(opts: Any) -> str:
    return f"{opts.app_label}.{get_permission_codename('view', opts)}"


class IdAutocompleteSelect(AutocompleteSelect):
    """Django's autocomplete widget, which looks up the selected value to show
    its label and fails with a 500 on one that is not an id (``?property=abc``
    on an add form, or posted back with a form error). Values that are not
    ids are shown as nothing selected; the form field reports them."""

    def optgroups(self, name: str, value: Any, attr: Any = None) -> Any:
        # Keys of the related model's type (an integer, a UUID: a host's customer, site or user).
        model = self.field.remote_field.model
        ids = [
            v for v in value if v in (None, "") or key_problem(str(v), model=model, field=name, from_form=True) is None
        ]
        return super().optgroups(name, ids, attr)


class PortfolioListFilter(admin.RelatedFieldListFilter):
    """A portfolio filter whose choices are the portfolios the user may see."""

    def field_choices(  # type: ignore[override]  # the choices' values are pks (ints), as Django's are
        self, field: Any, request: HttpRequest, model_admin: Any
    ) -> list[tuple[Any, str]]:
        where = portfolios_where(request.user, view_permission(model_admin.opts))
        return sorted(((p.pk, str(p)) for p in where), key=lambda choice: (choice[1], choice[0]))

    def has_output(self) -> bool:
        # Django applies only the filters it shows and shows a related filter
        # from two choices on: a member of one portfolio asking for another's
        # would silently get the unfiltered (their own) list. Shown from one.
        return bool(self.lookup_choices)


class PortfolioScopedAdmin(admin.ModelAdmin):
    #: Lookup path from the model to its portfolio id.
    portfolio_field = "portfolio_id"
    #: Foreign keys looked up by autocomplete when their model has an admin on
    #: this site (it answers the lookups, scoped). The customer and site models
    #: are the host's: whether it gives them an admin is its choice, so these
    #: fall back to a select of the scoped choices instead of failing the
    #: admin's checks (admin.E039).
    autocomplete_if_registered: tuple[str, ...] = ()

    def get_autocomplete_fields(self, request: HttpRequest) -> Any:
        registered = [
            name
            for name in self.autocomplete_if_registered
            # A foreign key's related_model is its model class once the registry is loaded.
            if isinstance(related := self.opts.get_field(name).related_model, type)
            and self.admin_site.is_registered(related)
        ]
        return [*super().get_autocomplete_fields(request), *registered]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return scope_queryset(
            super().get_queryset(request), request.user, perm=view_permission(self.opts), field=self.portfolio_field
        )

    def get_object_or_404(self, request: HttpRequest, object_id: Any) -> Any:
        """The object, if it exists *and* is in the portfolios where the user
        may view it; else 404 (the same answer for both). A user who may view
        this model nowhere gets Django's 403 for every id instead, which
        confirms nothing either."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(str(object_id)))
        if obj is None:
            raise Http404(f"No {self.opts.verbose_name} matches the given query.")
        return obj

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self.get_object_or_404(request, object_id)
        return super().change_view(request, object_id, form_url, extra_context)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        self.get_object_or_404(request, object_id)
        return super().history_view(request, object_id, extra_context)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        self.get_object_or_404(request, object_id)
        return super().delete_view(request, object_id, extra_context)

    def add_permission_name(self) -> str:
        return f"{self.opts.app_label}.{get_permission_codename('add', self.opts)}"

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # A new object may name only a portfolio where the user may add it, and
        # a property of such a portfolio: anything else is "not one of the
        # available choices", the same message as for an id that does not exist.
        related: type[Model] = db_field.related_model
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = IdAutocompleteSelect(db_field, self.admin_site, using=kwargs.get("using"))
        if related is portfolio_model():
            kwargs["queryset"] = portfolios_where(request.user, self.add_permission_name())
        elif related is property_model():
            kwargs["queryset"] = scope_queryset(
                property_model()._default_manager.all(),
                request.user,
                perm=self.add_permission_name(),
                field=property_portfolio_attname(),
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)
