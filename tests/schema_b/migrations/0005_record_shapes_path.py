"""Record shapes: a kind whose property is one hop away (a visit's unit's building)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("schema_b", "0004_record_shapes_no_property"),
        migrations.swappable_dependency(settings.RETENTION_PORTFOLIO_MODEL),
        migrations.swappable_dependency(settings.RETENTION_PROPERTY_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Unit",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(default="", max_length=40)),
                (
                    "building",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.RETENTION_PROPERTY_MODEL,
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="Visit",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("visited_at", models.DateTimeField()),
                (
                    "customer",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.RETENTION_PORTFOLIO_MODEL,
                    ),
                ),
                (
                    "unit",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="schema_b.unit",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["unit", "id"], include=("visited_at",), name="visit_keyset_idx")],
            },
        ),
    ]
