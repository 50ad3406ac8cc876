from __future__ import annotations

from django.apps import AppConfig


class RetentionConfig(AppConfig):
    name = "retention"
    verbose_name = "Retention"

    def ready(self) -> None:
        # The record kinds' system checks (registered on import).
        from retention import checks  # noqa: F401
