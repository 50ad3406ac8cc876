from __future__ import annotations

from django.apps import AppConfig


class PropertiesConfig(AppConfig):
    name = "properties"
    verbose_name = "Property records"
