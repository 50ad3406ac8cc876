from __future__ import annotations

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def install(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # The periodic dispatcher: enqueues due and rescued jobs once a minute;
    # finished slices also wake it, so a busy pipeline never waits for this.
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="cleanup_dispatch",
        defaults={"func": "cleanup_ops.tasks.dispatch", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def remove(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("django_q", "Schedule").objects.filter(name="cleanup_dispatch").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]
    operations = [migrations.RunPython(install, remove)]
