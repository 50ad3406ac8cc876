"""The host's customers and sites: which models are the portfolio and the property.

A host names them in ``RETENTION_PORTFOLIO_MODEL`` and ``RETENTION_PROPERTY_MODEL``
(app labels, swappable like ``AUTH_USER_MODEL``) and the site model's foreign
key to its customer in ``RETENTION_PROPERTY_PORTFOLIO_FIELD``; the demo's
``properties.Portfolio`` and ``properties.Property`` are the defaults. Every
module of ``retention`` and ``cleanup_ops`` reaches the two models through
these helpers, never by importing ``properties.models``, so a host project
without the demo apps loads, checks and migrates.

The labels and permission names need only the settings (usable while the
app registry loads, e.g. in ``retention.roles``); the models need a loaded
registry (``apps.get_model``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.db import models


def portfolio_model_label() -> str:
    return str(settings.RETENTION_PORTFOLIO_MODEL)


def property_model_label() -> str:
    return str(settings.RETENTION_PROPERTY_MODEL)


def portfolio_model() -> type[models.Model]:
    """The customer model (``RETENTION_PORTFOLIO_MODEL``)."""
    return apps.get_model(portfolio_model_label(), require_ready=False)


def property_model() -> type[models.Model]:
    """The site model (``RETENTION_PROPERTY_MODEL``)."""
    return apps.get_model(property_model_label(), require_ready=False)


def property_portfolio_field_name() -> str:
    return str(settings.RETENTION_PROPERTY_PORTFOLIO_FIELD)


def property_portfolio_field() -> models.ForeignKey[Any, Any] | None:
    """The site model's foreign key to the customer model (``RETENTION_PROPERTY_PORTFOLIO_FIELD``);
    None when there is no such field. Not raising here: modules read it at
    import, and the system check (``retention.domain_checks``) is what names
    a wrong setting."""
    try:
        field = property_model()._meta.get_field(property_portfolio_field_name())
    except FieldDoesNotExist:
        return None
    return field if isinstance(field, models.ForeignKey) else None


def property_portfolio_column() -> str:
    """The site table's column holding its customer's key (``portfolio_id`` in the demo)."""
    field = property_portfolio_field()
    return field.column if field is not None else f"{property_portfolio_field_name()}_id"


def property_portfolio_attname() -> str:
    """The lookup of a site's customer key (``portfolio_id`` in the demo), for ``filter()``."""
    field = property_portfolio_field()
    return field.attname if field is not None else f"{property_portfolio_field_name()}_id"


def property_portfolio_id(site: models.Model) -> Any:
    """The customer key of one site, whatever the foreign key is called."""
    return getattr(site, property_portfolio_attname())


# --- Their keys -----------------------------------------------------------------
# A customer's or a site's key is whatever the host's model has: an integer, a
# UUID, a string. The product's own columns naming them take that type
# (``cleanup_ops.models.scope_keys``; any integer as a bigint), and so do its
# statements' casts and its parsing of a key from a URL, a form or JSON.


def key_field(model: type[models.Model]) -> models.Field[Any, Any]:
    """The field holding ``model``'s key's value: its primary key, or the
    field that one-to-one key points at (a child of multi-table inheritance)."""
    field: Any = model._meta.pk
    while field.is_relation:
        field = field.target_field
    return field


def integer_key(model: type[models.Model]) -> bool:
    return isinstance(key_field(model), models.IntegerField)  # AutoField and BigAutoField are IntegerFields


def string_key(model: type[models.Model]) -> bool:
    return isinstance(key_field(model), models.CharField | models.TextField)


def supported_key(model: type[models.Model]) -> bool:
    """An integer, a UUID or a string key (``retention.domain_checks`` refuses others)."""
    return integer_key(model) or string_key(model) or isinstance(key_field(model), models.UUIDField)


def key_sql_type(model: type[models.Model]) -> str:
    """The type the product's statements cast ``model``'s keys to: ``bigint``
    for any integer key (its columns are bigints), ``uuid``, or ``text`` for a
    string key (never ``varchar(n)``, whose cast would cut a longer value
    short)."""
    if integer_key(model):
        return "bigint"
    if string_key(model):
        return "text"
    return "uuid"


def portfolio_key_sql_type() -> str:
    return key_sql_type(portfolio_model())


def property_key_sql_type() -> str:
    return key_sql_type(property_model())


def key_of(model: type[models.Model], value: Any) -> Any:
    """``value`` (text from a URL, a form or JSON, or a key) as ``model``'s
    key; raises ``ValidationError`` when it is none (``retention.inputs``
    names the field)."""
    return key_field(model).to_python(value)


def key_json(value: Any) -> Any:
    """A key as JSON carries it: an integer as a number, any other (a UUID) as
    its text; None stays None. What the proofs, the API and the audit details
    write, and what ``proof_verify`` reads back."""
    if value is None or isinstance(value, int):
        return value
    return str(value)


def key_number(value: Any) -> int:
    """A key as a non-negative integer, for what only takes numbers (the
    lease's advisory stripe locks): an integer key itself, any other the
    first 63 bits of the SHA-256 of its text — stable across processes and
    releases, unlike Python's ``hash``."""
    if isinstance(value, int):
        return value
    return int.from_bytes(hashlib.sha256(str(value).encode()).digest()[:8], "big") >> 1


def view_permission(label: str) -> str:
    """``app_label.view_modelname`` of a model label, from the label alone
    (Django's default permission codename), so it is known before the
    registry is ready."""
    app_label, _, model_name = label.partition(".")
    return f"{app_label}.view_{model_name.lower()}"


# The text fields the console shows and searches for a customer or a site,
# when the model has them (the demo's have both, a site only a name).
DISPLAY_FIELD = "name"
SEARCHED_FIELDS = ("name", "slug")


def _text_field(model: type[models.Model], name: str) -> bool:
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return isinstance(field, models.CharField | models.TextField)


def names_by_pk(model: type[models.Model], pks: Iterable[Any]) -> dict[Any, str]:
    """Key → name for these keys, in one query: the ``name`` field, or the
    object's ``str()`` for a host model without one."""
    qs = model._default_manager.filter(pk__in=sorted(set(pks)))
    if _text_field(model, DISPLAY_FIELD):
        return dict(qs.values_list("pk", DISPLAY_FIELD))
    return {obj.pk: str(obj) for obj in qs}


def matching(model: type[models.Model], text: str) -> models.QuerySet[Any]:
    """The objects whose name (or slug) contains ``text``; none for a model
    without such fields (it is then found by its id only)."""
    fields = [name for name in SEARCHED_FIELDS if _text_field(model, name)]
    if not fields:
        return model._default_manager.none()
    q = models.Q()
    for name in fields:
        q |= models.Q(**{f"{name}__icontains": text})
    return model._default_manager.filter(q)
