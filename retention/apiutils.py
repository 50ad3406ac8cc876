"""Shared REST plumbing for the apps' APIs under ``/api/v1/`` (DRF).

``RolePermission`` maps each view action to a Django permission;
``call_service`` runs a service and maps its errors to HTTP
(``ValidationError`` → 400, ``PermissionDenied`` → 403); ``int_param`` and
``choice_param`` validate list filters; ``Conflict`` is the 409 an app's API
raises for its own state conflicts; ``ReasonSerializer`` is the body of every
action that only takes a reason; ``TenantScoped`` narrows a viewset to the
portfolios where the user holds its read permission; ``IdField``,
``StrictPrimaryKeyRelatedField``, ``FreeTextField`` and ``ReasonField`` apply
``retention.inputs`` to request bodies (ids are JSON integers, text is
bounded and free of control characters, a reason follows the reason rule),
and every other field of a body is a ``StrictJSONType`` (``StrictIntegerField``,
``StrictBooleanField``…, and ``StrictModelSerializer``'s generated fields):
a JSON body's value must have the field's JSON type, never coerced.
``BrowsableAPIRenderer`` is DRF's browsable API with the inline styles its templates write allowed by the
Content-Security-Policy for its own pages (never inline scripts: it has none
that run). It lives in ``retention`` (the lower layer)
so both ``retention.api`` and ``cleanup_ops.api`` can use it.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.http import QueryDict
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ParseError, PermissionDenied, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BrowsableAPIRenderer as DRFBrowsableAPIRenderer
from rest_framework.request import Request

if TYPE_CHECKING:
    from rest_framework.generics import GenericAPIView

from retention.domain import integer_key, key_field, key_json, portfolio_model, property_model, string_key
from retention.filters import FilterError, id_param, key_param
from retention.filters import choice_param as filters_choice_param
from retention.inputs import (
    CONTROL_FREE_PATTERN,
    MAX_ID,
    MAX_TEXT_LENGTH,
    MIN_REASON_LENGTH,
    REASON_RULE,
    id_problem,
    json_type_problem,
    key_check,
    key_problem,
    reason_problem,
)
from retention.scoping import scope_queryset


class StrictJSONParser(JSONParser):
    """DRF's JSON parser, answering 400 rather than 500 for two bodies it lets through:

    - JSON nested so deeply that Python's parser runs out of stack
      (50,000 ``[``): ``RecursionError``. Any logged-in user can send it, and
      the session CSRF check parses the body before permissions run.
    - A string holding a lone surrogate (``"\\ud800"``): valid JSON, not
      valid text; an error message quoting it cannot be encoded.

    Neither message quotes the body.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        except UnicodeEncodeError:
            raise ParseError(
                "JSON parse error - a string holds a lone surrogate (\\ud800-\\udfff), not text."
            ) from None
        return data


class BrowsableAPIRenderer(DRFBrowsableAPIRenderer):
    """DRF's browsable API under the Content-Security-Policy (django-csp).

    Its templates (``rest_framework/base.html``) position elements with
    ``style=`` attributes and write the code highlighting as a ``<style>``;
    its scripts are all static files (the CSRF token is a JSON
    ``<script type="application/json">``, which never runs). So its pages,
    and only they, add ``'unsafe-inline'`` to ``style-src``."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> Any:
        response = (renderer_context or {}).get("response")
        if response is not None:
            # What csp.decorators.csp_update sets; csp.middleware.CSPMiddleware merges it.
            setattr(response, "_csp_update", {"style-src": ["'unsafe-inline'"]})  # noqa: B010
        return super().render(data, accepted_media_type, renderer_context)


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
        method = (request.method or "").lower()  # never None on a request DRF dispatched
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

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if isinstance(exc, FilterError):
            raise ValidationError({exc.field: exc.message}) from None
        return False


def int_param(request: Request, name: str) -> int | None:
    with filter_errors_as_400():
        return id_param(request.query_params, name, strict=True)


def portfolio_param(request: Request, name: str = "portfolio") -> Any:
    """A portfolio's key in the query string, of the customer model's own key type (a 400 naming it otherwise)."""
    with filter_errors_as_400():
        return key_param(request.query_params, name, model=portfolio_model(), strict=True)


def choice_param(request: Request, name: str, choices: list[str]) -> str | None:
    with filter_errors_as_400():
        return filters_choice_param(request.query_params, name, choices, strict=True)


def _from_form(field: serializers.Field) -> bool:
    # A form post (the browsable API's forms) sends every value as a string;
    # a JSON body must send an id as a JSON integer.
    return isinstance(getattr(field.root, "initial_data", None), QueryDict)


def _id_value(field: serializers.Field, data: Any) -> int:
    problem = id_problem(data, field=field.field_name or "id", from_form=_from_form(field))
    if problem is not None:
        raise ValidationError(problem)
    return int(data)


class IdField(serializers.IntegerField):
    """An id: a JSON integer from 1 to 2^63-1 (digits only in a form post)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        return _id_value(self, data)


#: The router's pattern for a path ``{id}``: 1 to 19 digits. Anything else
#: (``abc``, ``-1``, twenty digits) matches no route and is the catch-all's JSON
#: 404 (``retention.apierrors``); a value above ``MAX_ID`` is a 404 of the view.
ID_PATH_PATTERN = "[0-9]{1,19}"


#: An id's JSON Schema: what ``IdField`` and the router take.
ID_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_ID}


UUID_TEXT = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


@extend_schema_field(
    {"oneOf": [{"type": "integer", "minimum": 1, "maximum": MAX_ID}, {"type": "string", "format": "uuid"}]}
)
class RecordIdField(serializers.Field):
    """A record's id: an integer (``IdField``'s rules) or, for a kind keyed by
    UUID, the UUID as a string. Whether it is the kind's own key type is the
    service's check (``legal_hold_record_ref``: a 400 naming the field)."""

    def to_internal_value(self, data: Any) -> int | str:
        if isinstance(data, str) and not data.strip().isdigit():
            if not UUID_TEXT.match(data.strip()):
                raise ValidationError("expected an integer id, or a UUID for a kind keyed by UUID.")
            return data.strip()
        return _id_value(self, data)

    def to_representation(self, value: Any) -> Any:
        return value


def key_schema(model: type[models.Model]) -> dict[str, Any]:
    """The JSON Schema of ``model``'s key (a customer's, a site's): ``ID_SCHEMA``
    for an integer key, a UUID's or a string's otherwise."""
    if integer_key(model):
        return ID_SCHEMA
    if string_key(model):
        return {"type": "string", "minLength": 1, "maxLength": getattr(key_field(model), "max_length", None) or 40}
    return {"type": "string", "format": "uuid"}


def _key_value(field: serializers.Field, model: type[models.Model], data: Any) -> Any:
    name = field.field_name or "id"
    problem = key_problem(data, model=model, field=name, from_form=_from_form(field))
    if problem is not None:
        raise ValidationError(problem)
    return key_check(data, model=model, field=name, from_form=_from_form(field))


class PortfolioKeyField(serializers.Field):
    """A portfolio's key, of the customer model's own type (``inputs.key_problem``):
    a JSON integer for an integer key, a string for a UUID or a string key. Its
    schema: ``PortfolioKeySchema``, below."""

    def to_internal_value(self, data: Any) -> Any:
        return _key_value(self, portfolio_model(), data)

    def to_representation(self, value: Any) -> Any:
        return key_json(value)


class PropertyKeyField(PortfolioKeyField):
    """A property's key, of the site model's own type (``PortfolioKeyField``'s rules)."""

    def to_internal_value(self, data: Any) -> Any:
        return _key_value(self, property_model(), data)


class PortfolioKeySchema(OpenApiSerializerFieldExtension):
    """``PortfolioKeyField``'s schema, the host's key type's (``key_schema``), read when the schema is built."""

    target_class = PortfolioKeyField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return key_schema(portfolio_model())


class PropertyKeySchema(OpenApiSerializerFieldExtension):
    target_class = PropertyKeyField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return key_schema(property_model())


class StrictPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A related object by id, the id checked before the lookup (DRF would
    otherwise find portfolio 1 for ``1.5`` and fail with a 500 for
    ``1e400``): like ``IdField`` for an integer key, as the model's own key
    (a UUID in a string) otherwise (``inputs.key_problem``)."""

    def to_internal_value(self, data: Any) -> Any:
        queryset = self.get_queryset()
        return super().to_internal_value(_key_value(self, queryset.model, data))

    def to_representation(self, value: Any) -> Any:
        return key_json(super().to_representation(value))


# --- Strict JSON types ----------------------------------------------------------
#
# DRF's fields coerce: an IntegerField takes "30", a CharField takes 30 and
# a BooleanField takes "yes". In a JSON body each field must already have
# its JSON type (``retention.inputs.json_type_problem``), or the answer is a
# 400 naming the field. A form post (the browsable API's forms) sends every
# value as a string, and is left to the field's own parsing.


class StrictJSONType(serializers.Field):
    """Mixin, first in a field's bases: the value of a JSON body must be of
    ``json_type`` ("string", "integer" or "boolean") before the field parses it."""

    json_type: str

    def to_internal_value(self, data: Any) -> Any:
        if not _from_form(self):
            problem = json_type_problem(data, field=self.field_name or "value", expected=self.json_type)
            if problem is not None:
                raise ValidationError(problem)
        return super().to_internal_value(data)


class StrictCharField(StrictJSONType, serializers.CharField):
    json_type = "string"


class StrictIntegerField(StrictJSONType, serializers.IntegerField):
    json_type = "integer"


class StrictBooleanField(StrictJSONType, serializers.BooleanField):
    json_type = "boolean"


class StrictChoiceField(StrictJSONType, serializers.ChoiceField):
    json_type = "string"  # every choice of ours is a string


class StrictRegexField(StrictJSONType, serializers.RegexField):
    json_type = "string"


class StrictModelSerializer(serializers.ModelSerializer):
    """A ``ModelSerializer`` whose generated fields are the strict ones: a
    writable model field takes only its JSON type."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.IntegerField: StrictIntegerField,
        models.PositiveIntegerField: StrictIntegerField,
        models.PositiveSmallIntegerField: StrictIntegerField,
        models.SmallIntegerField: StrictIntegerField,
        models.BigIntegerField: StrictIntegerField,
        models.BooleanField: StrictBooleanField,
    }
    serializer_choice_field = StrictChoiceField


# A RegexValidator, so the OpenAPI schema states it as the field's ``pattern``.
no_control_characters = RegexValidator(CONTROL_FREE_PATTERN, "must not contain control characters (such as NUL).")


class FreeTextField(StrictCharField):
    """Free text (a slot, a filter value): a JSON string of at most
    ``MAX_TEXT_LENGTH`` characters, no control characters."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_TEXT_LENGTH)
        kwargs.setdefault("trim_whitespace", False)  # the service trims, after checking the length
        super().__init__(**kwargs)
        self.validators.append(no_control_characters)


class ReasonField(FreeTextField):
    """A reason or a review note: free text and the reason rule
    (``retention.inputs.reason_problem``), checked here so the answer is a 400
    naming the field, and stated in the schema (``minLength`` and the rule as
    the ``description``). The services check it again, whatever the route."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_length", MIN_REASON_LENGTH)
        kwargs.setdefault("help_text", REASON_RULE)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        value: str = super().to_internal_value(data)
        problem = reason_problem(value, field=self.field_name or "reason")
        if problem is not None:
            raise ValidationError(problem)
        return value


class ReasonSerializer(serializers.Serializer):
    reason = ReasonField()


# For the type checker, TenantScoped is the generic view it is mixed into
# (GenericAPIView's attributes and methods); at run time a plain mixin.
if TYPE_CHECKING:
    _ScopedBase = GenericAPIView[Any]
else:
    _ScopedBase = object


class TenantScoped(_ScopedBase):
    """Mixin for viewsets over tenant data (``retention.scoping``).

    Lists and object lookups go through ``filter_queryset``, so narrowing it
    covers every list, detail and detail action, whatever ``get_queryset``
    a viewset writes. The scope is the portfolios where the user holds the
    viewset's *read* permission (``required_perms["retrieve"]``), not every
    portfolio they are a member of; a detail action then checks its own
    permission in the object's portfolio (``may_act_in``, 403).

    On a detail route the object is looked up *before* the role check:
    another customer's object is a 404 for every role, exactly like an id
    that does not exist, never a 403 that would confirm it exists. A user who
    holds the read permission nowhere gets the role check's 403 for every
    id, existing or not, which confirms nothing either.
    """

    portfolio_field = "portfolio_id"
    #: Every viewset that mixes this in declares it (RolePermission's map).
    required_perms: dict[str, str]

    @property
    def read_perm(self) -> str:
        return self.required_perms["retrieve"]

    def scope(self, queryset: Any) -> Any:
        return scope_queryset(
            queryset,
            self.request.user,
            perm=self.read_perm,
            field=self.portfolio_field,
        )

    def filter_queryset(self, queryset: Any) -> Any:
        return self.scope(super().filter_queryset(queryset))

    def check_permissions(self, request: Request) -> None:
        lookup = self.lookup_url_kwarg or self.lookup_field
        user = request.user
        if user and user.is_authenticated and lookup in self.kwargs and user.has_perm(self.read_perm):
            self.get_object()
        super().check_permissions(request)
