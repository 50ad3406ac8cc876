from __future__ import annotations

from django.apps import AppConfig


class CleanupOpsConfig(AppConfig):
    name = "cleanup_ops"
    verbose_name = "Cleanup operations"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from cleanup_ops.health import heartbeat_on_spawn

        # Each new qcluster worker registers its cluster's run and wakes the dispatcher.
        post_spawn.connect(heartbeat_on_spawn, dispatch_uid="cleanup_ops.heartbeat_on_spawn")
