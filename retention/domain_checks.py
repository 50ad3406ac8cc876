"""System checks of retention's own settings (``retention.conf``) and of the customer and site models.

Every bad value is reported at start-up, naming the setting; the record kinds'
checks are ``retention.checks``.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models

from retention.conf import RETENTION_SETTINGS, setting_errors
from retention.domain import key_field, string_key, supported_key


@checks.register(checks.Tags.models)
def retention_settings_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors = setting_errors(RETENTION_SETTINGS, id_prefix="retention.settings")
    named = {error.msg.split(":", 1)[0] for error in errors}
    if named & {"RETENTION_PORTFOLIO_MODEL", "RETENTION_PROPERTY_MODEL", "RETENTION_PROPERTY_PORTFOLIO_FIELD"}:
        return errors  # the models cannot be looked up with these values
    return errors + _domain_errors()


def _installed_model(name: str, number: int) -> tuple[type[models.Model] | None, list[checks.CheckMessage]]:
    label = getattr(settings, name)
    try:
        return apps.get_model(label), []
    except (LookupError, ValueError):
        return None, [
            checks.Error(
                f"{name}: {label!r} is not a model of an installed app",
                hint=f"Add its app to INSTALLED_APPS, or set {name} to your own model's label ('app_label.Model').",
                id=f"retention.E1{number:02d}",
            )
        ]


# A string key's longest text: the product's names built from a key (the rate
# buckets' ``docstore:portfolio:<key>``, the ledger chains' ``portfolio:<key>``)
# must fit their columns.
MAX_STRING_KEY_LENGTH = 40


def key_type_errors(name: str, model: type[models.Model], number: int) -> list[checks.CheckMessage]:
    # The product's columns naming a customer or a site take its key's type
    # (cleanup_ops.models.scope_keys): an integer, a UUID or a short string.
    field = key_field(model)
    if supported_key(model) and not (
        string_key(model) and (field.max_length is None or field.max_length > MAX_STRING_KEY_LENGTH)
    ):
        return []
    return [
        checks.Error(
            f"{name}: {model._meta.label}'s primary key {model._meta.pk.name!r} is not an integer, a UUID "
            f"or a string of at most {MAX_STRING_KEY_LENGTH} characters",
            hint="The customer and site models need an integer, UUIDField or CharField(max_length<=40) primary key.",
            id=f"retention.E1{number:02d}",
        )
    ]


def _domain_errors() -> list[checks.CheckMessage]:
    portfolio, errors = _installed_model("RETENTION_PORTFOLIO_MODEL", 1)
    site, site_errors = _installed_model("RETENTION_PROPERTY_MODEL", 2)
    errors += site_errors
    if portfolio is not None:
        errors += key_type_errors("RETENTION_PORTFOLIO_MODEL", portfolio, 3)
    if site is not None:
        errors += key_type_errors("RETENTION_PROPERTY_MODEL", site, 4)
    if portfolio is None or site is None:
        return errors
    name = settings.RETENTION_PROPERTY_PORTFOLIO_FIELD
    try:
        field = site._meta.get_field(name)
    except FieldDoesNotExist:
        field = None
    if not isinstance(field, models.ForeignKey) or field.related_model is not portfolio:
        errors.append(
            checks.Error(
                f"RETENTION_PROPERTY_PORTFOLIO_FIELD: {site._meta.label} has no foreign key {name!r} "
                f"to {portfolio._meta.label}",
                hint="Name the site model's ForeignKey to the customer model.",
                id="retention.E105",
            )
        )
    return errors
