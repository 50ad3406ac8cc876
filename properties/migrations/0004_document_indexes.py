"""Partial indexes on document_id: the purge asks whether any remaining record still names a document."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("properties", "0003_record_portfolio_matches_property"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="lease",
            index=models.Index(
                condition=models.Q(("document_id__isnull", False)), fields=["document_id"], name="lease_document_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="maintenancerecord",
            index=models.Index(
                condition=models.Q(("document_id__isnull", False)),
                fields=["document_id"],
                name="maintenance_document_idx",
            ),
        ),
    ]
