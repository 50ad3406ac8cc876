"""Django app config of the demo app (seed commands, demo document store)."""

from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo data"
