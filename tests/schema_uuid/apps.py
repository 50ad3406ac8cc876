from __future__ import annotations

from django.apps import AppConfig


class SchemaUuidConfig(AppConfig):
    name = "tests.schema_uuid"
    label = "schema_uuid"
    default_auto_field = "django.db.models.BigAutoField"
