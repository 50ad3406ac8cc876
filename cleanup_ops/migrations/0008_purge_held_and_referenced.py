"""Purges set aside under a legal hold (outcome purge_held, re-queued once released) and documents still referenced."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0007_worker_heartbeat"),
    ]

    operations = [
        migrations.AddField(
            model_name="purgerequest",
            name="documents_held",
            field=models.PositiveIntegerField(
                default=0,
                help_text="Set aside: an active legal hold covered the deleted records' scope before the purge.",
            ),
        ),
        migrations.AddField(
            model_name="purgerequest",
            name="documents_referenced",
            field=models.PositiveIntegerField(
                default=0,
                help_text="Skipped: a remaining record (of any kind) still names the document. Never deleted.",
            ),
        ),
        migrations.AddField(
            model_name="purgerequest",
            name="held_document_ids",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="purgerequest",
            name="origin",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="requeues",
                to="cleanup_ops.purgerequest",
            ),
        ),
        migrations.AddIndex(
            model_name="purgerequest",
            index=models.Index(
                condition=models.Q(("documents_held__gt", 0)), fields=["id"], name="purge_request_held_idx"
            ),
        ),
        migrations.AlterField(
            model_name="cleanupjob",
            name="outcome",
            field=models.CharField(
                blank=True,
                choices=[
                    ("deleted", "Deleted"),
                    ("purged", "Attachments purged"),
                    ("purge_held", "Attachments set aside under a legal hold"),
                    ("nothing_eligible", "Nothing eligible"),
                    ("held", "Held"),
                    ("scope_missing", "Scope missing"),
                    ("policy_withdrawn", "Policy withdrawn"),
                ],
                default="",
                max_length=20,
            ),
        ),
    ]
