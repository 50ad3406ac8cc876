from __future__ import annotations

from django.db import migrations

from retention.roles import sync_role_groups


class Migration(migrations.Migration):
    dependencies = [("cleanup_ops", "0003_recovery"), ("retention", "0002_roles_and_append_only_audit")]
    operations = [migrations.RunPython(sync_role_groups, migrations.RunPython.noop)]
