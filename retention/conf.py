"""The product's settings: each one's default, applied by the app, and its bad-value check.

A host project sets only what it wants to change. Each app lists its own
settings (``retention.conf.RETENTION_SETTINGS``, ``cleanup_ops.defaults.SETTINGS``)
with the default and the rule a value must meet; its ``AppConfig`` fills in
every setting the project did not set (``apply_defaults``), and a system
check reports every value that breaks its rule, naming the setting
(``setting_errors``). The demo project (``config/settings.py``) reads the
same settings from the environment with the same defaults and stops start-up
on a bad variable; the checks hold for it too.

Why the defaults are filled in when the app config is created rather than in
``ready()``: the models name the ``RETENTION_PORTFOLIO_MODEL`` setting in
their foreign keys, and models are imported between the two.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks

# Rows per batch, at most: one transaction's rows. The one home of the
# ceiling — a policy's batch size, CLEANUP_BATCH_SIZE and a caller's fixed
# size are all held under it (``retention.models`` re-exports it).
MAX_BATCH_SIZE = 1000

# A rule returns what is wrong with a value, or None when it is fine.
Rule = Callable[[Any], str | None]


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    rule: Rule | None = None


def apply_defaults(specs: Iterable[Setting]) -> None:
    """Give every setting the project did not set its default."""
    for spec in specs:
        if not hasattr(settings, spec.name):
            setattr(settings, spec.name, spec.default)


def setting_errors(specs: Iterable[Setting], *, id_prefix: str) -> list[checks.CheckMessage]:
    """One error per setting whose value breaks its rule, naming the setting."""
    errors: list[checks.CheckMessage] = []
    for number, spec in enumerate(specs, 1):
        if spec.rule is None:
            continue
        problem = spec.rule(getattr(settings, spec.name, spec.default))
        if problem is not None:
            errors.append(
                checks.Error(
                    f"{spec.name}: {problem}",
                    hint=f"Set {spec.name} in your settings (default {spec.default!r}).",
                    id=f"{id_prefix}.E{number:03d}",
                )
            )
    return errors


# --- rules ----------------------------------------------------------------------


def integer(*, minimum: int | None = None, maximum: int | None = None) -> Rule:
    def rule(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {value!r}"
        if minimum is not None and value < minimum:
            return f"must be at least {minimum}, got {value}"
        if maximum is not None and value > maximum:
            return f"must be at most {maximum}, got {value}"
        return None

    return rule


def number(*, minimum: float = 0.0) -> Rule:
    def rule(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {value!r}"
        if not math.isfinite(value) or value < minimum:
            return f"must be a finite number >= {minimum}, got {value!r}"
        return None

    return rule


def text(pattern: str, what: str) -> Rule:
    def rule(value: Any) -> str | None:
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            return f"expected {what}, got {value!r}"
        return None

    return rule


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}, got {value!r}"

    return rule


def strings(value: Any) -> str | None:
    if not isinstance(value, list | tuple | set | frozenset) or not all(isinstance(v, str) for v in value):
        return f"expected a list of strings, got {value!r}"
    return None


def ip_addresses(value: Any) -> str | None:
    problem = strings(value)
    if problem is not None:
        return problem
    for item in value:
        try:
            ipaddress.ip_address(item)
        except ValueError:
            return f"{item!r} is not an IP address"
    return None


def model_label(value: Any) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*", value):
        return f"expected a model label such as 'properties.Portfolio', got {value!r}"
    return None


# --- retention's own settings ------------------------------------------------------

RETENTION_SETTINGS: tuple[Setting, ...] = (
    # The host's customer and site models (retention.domain) and the site's
    # foreign key to its customer. The demo's models are the defaults.
    Setting("RETENTION_PORTFOLIO_MODEL", "properties.Portfolio", model_label),
    Setting("RETENTION_PROPERTY_MODEL", "properties.Property", model_label),
    Setting("RETENTION_PROPERTY_PORTFOLIO_FIELD", "portfolio", text(r"[A-Za-z_][A-Za-z0-9_]*", "a field name")),
    # Shared with cleanup_ops (both read them; either app may be the first to fill them in).
    Setting("CLEANUP_BATCH_SIZE", MAX_BATCH_SIZE, integer(minimum=1, maximum=MAX_BATCH_SIZE)),
    Setting("CLEANUP_SCOPE_LOCK_WAIT_SECONDS", 10.0, number(minimum=0.1)),
)
