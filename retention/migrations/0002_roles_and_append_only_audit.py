from __future__ import annotations

from django.apps.registry import Apps
from django.conf import settings
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from retention.roles import sync_role_groups

# The audit table rejects UPDATE and DELETE at the database
# level, so not even raw SQL from a shell session can rewrite history. TRUNCATE
# is left alone: it needs table ownership, and Django's test flush relies on it.
APPEND_ONLY_SQL = """
CREATE OR REPLACE FUNCTION retention_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = 'retention_auditevent is append-only (' || TG_OP || ' rejected)',
        ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER retention_auditevent_no_update_delete
    BEFORE UPDATE OR DELETE ON retention_auditevent
    FOR EACH ROW EXECUTE FUNCTION retention_auditevent_append_only();
"""

DROP_SQL = """
DROP TRIGGER IF EXISTS retention_auditevent_no_update_delete ON retention_auditevent;
DROP FUNCTION IF EXISTS retention_auditevent_append_only();
"""


def add_trigger(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    schema_editor.execute(APPEND_ONLY_SQL)


def drop_trigger(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    schema_editor.execute(DROP_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0001_initial"),
        migrations.swappable_dependency(settings.RETENTION_PORTFOLIO_MODEL),
        migrations.swappable_dependency(settings.RETENTION_PROPERTY_MODEL),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(sync_role_groups, migrations.RunPython.noop),
        migrations.RunPython(add_trigger, drop_trigger),
    ]
