from __future__ import annotations

from django.db import migrations

from retention.roles import sync_role_groups


class Migration(migrations.Migration):
    # Operators (and scheduler accounts in that group) may trigger a sweep
    # through the API: cleanup_ops.add_sweep.
    dependencies = [("retention", "0002_roles_and_append_only_audit"), ("cleanup_ops", "0004_operator_permissions")]
    operations = [migrations.RunPython(sync_role_groups, migrations.RunPython.noop)]
