# A lease's end is a moment, not a day: the field is a DateTimeField, so its name says "at"
# like closed_at and occurred_at (the other record kinds' timestamps). The database renames
# the column and its two indexes follow it; only Django's state needs the indexes restated.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("properties", "0004_document_indexes")]

    operations = [
        migrations.RenameField(model_name="lease", old_name="ended_on", new_name="ended_at"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="lease", name="lease_due_idx"),
                migrations.RemoveIndex(model_name="lease", name="lease_keyset_idx"),
                migrations.AddIndex(
                    model_name="lease",
                    index=models.Index(fields=["property", "ended_at", "id"], name="lease_due_idx"),
                ),
                migrations.AddIndex(
                    model_name="lease",
                    index=models.Index(fields=["property", "id"], include=("ended_at",), name="lease_keyset_idx"),
                ),
            ]
        ),
    ]
