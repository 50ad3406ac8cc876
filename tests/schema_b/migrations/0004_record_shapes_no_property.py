"""Record shapes: a kind without a property."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("properties", "0004_document_indexes"),
        ("schema_b", "0003_record_shapes_uuid"),
    ]

    operations = [
        migrations.CreateModel(
            name="Notice",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("sent_at", models.DateTimeField()),
                ("document_id", models.CharField(blank=True, default="", max_length=64)),
                (
                    "customer",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="properties.portfolio",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["customer", "id"], include=("sent_at",), name="notice_keyset_idx")],
            },
        ),
    ]
