"""Request filters parsed once, for the console and the API alike.

A parser takes a mapping of request parameters. ``strict`` raises
``FilterError`` naming the parameter for an invalid value, which the API and
the console turn into a 400 naming it (``retention.inputs`` defines what is
valid: ids of 1 to 19 digits up to 2^63-1, free text without control
characters and within the column's length); not strict ignores it (kept for
callers that only build links).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import CharField, Field, IntegerField, Model, Q, QuerySet

from retention.inputs import id_problem, key_check, key_problem, text_problem
from retention.models import AuditEvent

# The longest age filter (hours): a century. Larger values would move the
# cutoff before year 1 and overflow the date arithmetic.
MAX_AGE_HOURS = 24 * 366 * 100


class FilterError(ValueError):
    """A filter parameter that is not valid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def id_param(params: Mapping[str, Any], name: str, *, strict: bool) -> int | None:
    """An id parameter: None when absent; invalid → ``FilterError`` (strict) or None."""
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    problem = id_problem(str(raw), field=name, from_form=True)
    if problem is not None:
        if strict:
            raise FilterError(name, problem)
        return None
    return int(raw)


def key_param(params: Mapping[str, Any], name: str, *, model: type[Model], strict: bool) -> Any:
    """A customer's or a site's key (``inputs.key_problem``: the model's own
    key type): None when absent; invalid → ``FilterError`` (strict) or None."""
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    problem = key_problem(str(raw), model=model, field=name, from_form=True)
    if problem is not None:
        if strict:
            raise FilterError(name, problem)
        return None
    return key_check(str(raw), model=model, field=name, from_form=True)


def int_param(params: Mapping[str, Any], name: str, *, strict: bool, minimum: int, maximum: int) -> int | None:
    """A whole number from ``minimum`` to ``maximum`` (ASCII digits only)."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    text = str(raw)
    if not (text.isascii() and text.isdigit() and len(text) <= 19 and minimum <= int(text) <= maximum):
        if strict:
            raise FilterError(name, f"{name} must be a whole number from {minimum} to {maximum}.")
        return None
    return int(text)


def text_param(params: Mapping[str, Any], name: str, *, strict: bool, max_length: int) -> str | None:
    """Free text matched exactly: at most ``max_length`` characters, no control characters."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    problem = text_problem(str(raw), field=name, max_length=max_length)
    if problem is not None:
        if strict:
            raise FilterError(name, problem)
        return None
    return str(raw)


def choice_param(params: Mapping[str, Any], name: str, choices: list[str], *, strict: bool) -> str | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    if raw not in choices:
        if strict:
            raise FilterError(name, f"{name} must be one of {', '.join(choices)}")
        return None
    return str(raw)


@dataclass(frozen=True)
class AuditFilter:
    """``action`` matches a part of the action ("redriven", "legal_hold.");
    ``actor`` is a user's id or username (exact, any case). The id is of the
    host's ``AUTH_USER_MODEL`` key type: an integer, or (a UUID, a string key)
    whatever that key's field accepts, which is then also tried as a username."""

    action: str | None = None
    object_type: str | None = None
    actor_id: object = None
    object_id: str | None = None
    actor_name: str | None = None

    def q(self) -> Q:
        q = Q()
        if self.action:
            q &= Q(action__icontains=self.action)
        if self.object_type:
            q &= Q(object_type=self.object_type)
        actor = Q()
        if self.actor_id is not None:
            actor |= Q(actor_id=self.actor_id)
        if self.actor_name:
            actor |= Q(**{f"actor__{get_user_model().USERNAME_FIELD}__iexact": self.actor_name})
        q &= actor
        if self.object_id:
            q &= Q(object_id=self.object_id)
        return q

    def as_params(self) -> dict[str, str]:
        pairs = {
            "action": self.action,
            "object_type": self.object_type,
            "object_id": self.object_id,
            "actor": self.actor_id if self.actor_id is not None else self.actor_name,
        }
        return {name: str(value) for name, value in pairs.items() if value}


def user_key_field() -> Field[Any, Any]:
    return get_user_model()._meta.pk


def user_key_is_integer() -> bool:
    """Whether the host's ``AUTH_USER_MODEL`` has an integer key (Django's default user's has)."""
    pk = user_key_field()
    # A key that is a one-to-one link (multi-table inheritance) has its parent's type.
    return isinstance(getattr(pk, "target_field", pk) if pk.is_relation else pk, IntegerField)


def user_key_parse(raw: object) -> object:
    """``raw`` as a key of the host's user model, or None when it is not one."""
    if raw in (None, "") or not isinstance(raw, str):
        return None
    try:
        return user_key_field().to_python(raw)
    except (ValidationError, ValueError, TypeError):
        return None


def audit_filter_parse(params: Mapping[str, Any], *, strict: bool) -> AuditFilter:
    def column(name: str) -> int:
        # The filtered columns are the audit trail's CharFields, each with a max_length (retention.models).
        field = cast("CharField[Any, Any]", AuditEvent._meta.get_field(name))
        return cast(int, field.max_length)

    raw_actor = params.get("actor")
    actor_id: object = None
    if user_key_is_integer():
        by_id = isinstance(raw_actor, str) and raw_actor.isascii() and raw_actor.isdigit()
        actor_id = id_param(params, "actor", strict=strict) if by_id else None
    else:
        # A UUID (or string) key: the value is an id when the key's field takes it, and a username too.
        actor_id = user_key_parse(raw_actor)
        by_id = False
    return AuditFilter(
        action=text_param(params, "action", strict=strict, max_length=column("action")),
        object_type=text_param(params, "object_type", strict=strict, max_length=column("object_type")),
        actor_id=actor_id,
        # A username is at most 150 characters (django.contrib.auth).
        actor_name=None if by_id else text_param(params, "actor", strict=strict, max_length=150),
        object_id=text_param(params, "object_id", strict=strict, max_length=column("object_id")),
    )


def audit_events(audit_filter: AuditFilter) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(audit_filter.q()).select_related("actor").order_by("-id")
