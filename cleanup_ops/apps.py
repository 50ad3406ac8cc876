from __future__ import annotations

from django.apps import AppConfig


class CleanupOpsConfig(AppConfig):
    name = "cleanup_ops"
    verbose_name = "Cleanup operations"
