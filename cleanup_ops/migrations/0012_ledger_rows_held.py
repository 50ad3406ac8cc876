from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0011_heartbeat_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="ledgerentry",
            name="rows_held",
            field=models.PositiveIntegerField(default=0),
        ),
        # Rows written before this counted held as candidates − deleted: say so
        # as they said it (the ledger is a record, not a recomputation).
        migrations.RunSQL(
            "UPDATE cleanup_ops_ledgerentry SET rows_held = candidates - rows_deleted",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
