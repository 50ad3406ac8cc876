"""Worker heartbeats (cleanup_health --liveness); operators see them and django-q2's admin pages."""

from __future__ import annotations

from django.db import migrations, models

from retention.roles import sync_role_groups


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0006_console_indexes"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerHeartbeat",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("host", models.CharField(max_length=255)),
                ("cluster", models.CharField(max_length=100)),
                (
                    "pid",
                    models.PositiveIntegerField(help_text="The cluster's sentinel process (parent of its workers)."),
                ),
                (
                    "started_at",
                    models.DateTimeField(help_text="When this run of the cluster (this pid) spawned its first worker."),
                ),
                (
                    "last_progress_at",
                    models.DateTimeField(blank=True, help_text="When a worker last finished a task.", null=True),
                ),
                (
                    "turns",
                    models.PositiveBigIntegerField(default=0, help_text="Tasks finished by this run of the cluster."),
                ),
                (
                    "jobs_leased",
                    models.PositiveBigIntegerField(default=0, help_text="Jobs leased by this run of the cluster."),
                ),
                ("rows_deleted", models.PositiveBigIntegerField(default=0)),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "ordering": ["host", "cluster"],
                "constraints": [models.UniqueConstraint(fields=("host", "cluster"), name="heartbeat_one_per_cluster")],
            },
        ),
        migrations.RunPython(sync_role_groups, migrations.RunPython.noop),
    ]
