from __future__ import annotations

from types import ModuleType

from django.apps import AppConfig


class RetentionConfig(AppConfig):
    name = "retention"
    verbose_name = "Retention"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        super().__init__(app_name, app_module)
        from retention.conf import RETENTION_SETTINGS, apply_defaults

        # Before any model is imported: the models' foreign keys name
        # settings.RETENTION_PORTFOLIO_MODEL (retention.conf).
        apply_defaults(RETENTION_SETTINGS)

    def ready(self) -> None:
        # The system checks (registered on import): the record kinds', and
        # the settings' and the customer and site models'.
        from retention import checks, domain_checks  # noqa: F401
