from __future__ import annotations

from django.apps import AppConfig


class SchemaBConfig(AppConfig):
    name = "tests.schema_b"
    label = "schema_b"
    default_auto_field = "django.db.models.BigAutoField"
