"""Request filters parsed once, for the console and the API alike.

A parser takes a mapping of request parameters. ``strict`` (the API) raises
``FilterError`` naming the parameter for an invalid value, which the API
turns into a 400; not strict (the console's links) ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet

from retention.models import AuditEvent

MAX_ID = 2**63 - 1


class FilterError(ValueError):
    """A filter parameter that is not valid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def id_param(params: Mapping[str, Any], name: str, *, strict: bool) -> int | None:
    """An id parameter: None when absent; invalid → ``FilterError`` (strict) or None."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        if strict:
            raise FilterError(name, f"{name} must be an integer id") from None
        return None
    if not 0 <= value <= MAX_ID:
        if strict:
            raise FilterError(name, f"{name} must be an id between 0 and 2^63-1")
        return None
    return value


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
    action: str | None = None
    object_type: str | None = None
    actor_id: int | None = None
    object_id: str | None = None

    def q(self) -> Q:
        q = Q()
        if self.action:
            q &= Q(action=self.action)
        if self.object_type:
            q &= Q(object_type=self.object_type)
        if self.actor_id is not None:
            q &= Q(actor_id=self.actor_id)
        if self.object_id:
            q &= Q(object_id=self.object_id)
        return q

    def as_params(self) -> dict[str, str]:
        pairs = {
            "action": self.action,
            "object_type": self.object_type,
            "object_id": self.object_id,
            "actor": self.actor_id,
        }
        return {name: str(value) for name, value in pairs.items() if value}


def audit_filter_parse(params: Mapping[str, Any], *, strict: bool) -> AuditFilter:
    return AuditFilter(
        action=params.get("action") or None,
        object_type=params.get("object_type") or None,
        actor_id=id_param(params, "actor", strict=strict),
        object_id=(params.get("object_id") or "")[:200] or None,
    )


def audit_events(audit_filter: AuditFilter) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(audit_filter.q()).select_related("actor").order_by("-id")
