"""The pytest plugin of a run on the UUID schema (``-p tests.schema_uuid.pytest_plugin``).

It refuses to start unless the user, customer and site models the settings name
are keyed by UUIDs (a run meant for this schema that fell back to the demo's
integer keys would prove nothing), and names them in the report header, which
``tests/test_uuid_schema.py`` reads back from the second pytest process.
"""

from __future__ import annotations

import pytest

HEADER = "uuid schema:"


def uuid_keyed_models() -> dict[str, str]:
    """Role -> label of the user, customer and site models; UsageError unless each is keyed by a UUID."""
    from django.contrib.auth import get_user_model
    from django.db import models

    from retention.domain import key_field, portfolio_model, property_model

    named = {"user": get_user_model(), "customer": portfolio_model(), "site": property_model()}
    wrong = [
        f"{role} {model._meta.label}"
        for role, model in named.items()
        if not isinstance(key_field(model), models.UUIDField)
    ]
    if wrong:
        raise pytest.UsageError(f"not keyed by a UUID: {', '.join(wrong)} (run with --ds=tests.settings_uuid)")
    return {role: model._meta.label for role, model in named.items()}


def pytest_report_header(config: pytest.Config) -> str:
    return f"{HEADER} " + ", ".join(f"{role} {label}" for role, label in uuid_keyed_models().items())
