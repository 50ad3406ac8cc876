from django.db import migrations

from retention.roles import sync_role_groups


class Migration(migrations.Migration):
    """Operators and auditors see login lockouts (django-axes); operators lift them."""

    dependencies = [
        ("retention", "0004_memberships"),
        ("axes", "0010_accessattemptexpiration"),
    ]

    operations = [migrations.RunPython(sync_role_groups, migrations.RunPython.noop)]
