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
        from django.db.models.signals import post_migrate

        from retention import checks, domain_checks  # noqa: F401
        from retention.roles import role_groups_grant_on_migrate

        post_migrate.connect(role_groups_grant_on_migrate, sender=self, dispatch_uid="retention.role_groups")
