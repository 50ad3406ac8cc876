"""Record shapes: a kind keyed by a UUID."""

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("properties", "0004_document_indexes"),
        ("schema_b", "0002_signed_contract"),
    ]

    operations = [
        migrations.CreateModel(
            name="Ticket",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, primary_key=True, serialize=False)),
                ("resolved_at", models.DateTimeField()),
                ("document_id", models.CharField(blank=True, default="", max_length=64)),
                (
                    "building",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="properties.property",
                    ),
                ),
                (
                    "customer",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="properties.portfolio"
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["building", "id"], include=("resolved_at",), name="ticket_keyset_idx")
                ],
            },
        ),
    ]
