from __future__ import annotations

from types import ModuleType

from django.apps import AppConfig


class CleanupOpsConfig(AppConfig):
    name = "cleanup_ops"
    verbose_name = "Cleanup operations"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        super().__init__(app_name, app_module)
        from cleanup_ops.defaults import SETTINGS
        from retention.conf import apply_defaults

        # Every setting the project did not set gets its default, before any
        # model or module reads it (retention.conf says why not in ready()).
        apply_defaults(SETTINGS)

    def ready(self) -> None:
        from django.db.models.signals import post_migrate
        from django_q.signals import post_spawn, pre_execute

        from cleanup_ops import checks  # noqa: F401 - registers the system checks
        from cleanup_ops.downstream.guard import guards_on_migrate

        # The reference guard on the record tables (downstream.guard).
        post_migrate.connect(guards_on_migrate, dispatch_uid="cleanup_ops.guards_on_migrate")

        from cleanup_ops.health import heartbeat_on_spawn, heartbeat_on_task_start
        from cleanup_ops.selectors import kind_rows_per_second
        from retention.selectors import throughput_provider_set

        # The policy review's impact preview shows the measured rate of a kind.
        throughput_provider_set(kind_rows_per_second)

        # Each new qcluster worker registers its cluster's run and wakes the
        # dispatcher; each task it starts is progress (cleanup_ops.health).
        post_spawn.connect(heartbeat_on_spawn, dispatch_uid="cleanup_ops.heartbeat_on_spawn")
        pre_execute.connect(heartbeat_on_task_start, dispatch_uid="cleanup_ops.heartbeat_on_task_start")
