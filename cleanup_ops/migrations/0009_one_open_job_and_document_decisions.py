"""One open delete job per partition (a partial unique index), and one purge
decision per document (``DocumentDisposition``, ``DeletedAttachment``).

Before the index: open delete jobs that share a partition (possible before
this migration, e.g. a redriven letter beside a later sweep's job) are
reported and the migration stops, naming them, so that an operator decides
which to keep (``cleanup_redrive`` / the console cannot do it for them).
After the tables: the outbox rows of earlier batches become
``DeletedAttachment`` rows without record ids (such a row matches every
record-level hold of its scope), and documents set aside under a hold get
their ``set_aside`` disposition.
"""

import django.db.models.deletion
from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import Count


def refuse_duplicate_open_jobs(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    CleanupJob = apps.get_model("cleanup_ops", "CleanupJob")
    duplicates = list(
        CleanupJob.objects.filter(state__in=["pending", "leased"], kind="delete")
        .values("portfolio_id", "property_id", "record_kind")
        .annotate(n=Count("id"))
        .filter(n__gt=1)[:20]
    )
    if duplicates:
        listed = "; ".join(
            f"portfolio {d['portfolio_id']} property {d['property_id']} {d['record_kind']}: {d['n']} open jobs"
            for d in duplicates
        )
        raise RuntimeError(
            "cleanup_ops.0009: partitions with more than one open delete job: "
            f"{listed}. Let one of them finish (or stop it) before migrating."
        )


def backfill_document_decisions(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    PurgeRequest = apps.get_model("cleanup_ops", "PurgeRequest")
    DeletedAttachment = apps.get_model("cleanup_ops", "DeletedAttachment")
    DocumentDisposition = apps.get_model("cleanup_ops", "DocumentDisposition")
    for request in PurgeRequest.objects.filter(origin__isnull=True).iterator():
        DeletedAttachment.objects.bulk_create(
            [
                DeletedAttachment(
                    document_id=str(document_id),
                    portfolio_id=request.portfolio_id,
                    property_id=request.property_id,
                    record_kind=request.record_kind,
                    record_id=None,
                    purge_request_id=request.pk,
                    deleted_at=request.created_at,
                )
                for document_id in request.document_ids
            ]
        )
    for request in PurgeRequest.objects.filter(documents_held__gt=0).iterator():
        DocumentDisposition.objects.bulk_create(
            [
                DocumentDisposition(document_id=str(d), state="set_aside", decided_by_id=request.pk)
                for d in request.held_document_ids
            ],
            ignore_conflicts=True,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0008_purge_held_and_referenced"),
        ("retention", "0004_memberships"),
    ]

    operations = [
        migrations.RunPython(refuse_duplicate_open_jobs, migrations.RunPython.noop),
        migrations.CreateModel(
            name="DeletedAttachment",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("document_id", models.CharField(max_length=64)),
                ("portfolio_id", models.BigIntegerField()),
                ("property_id", models.BigIntegerField()),
                ("record_kind", models.CharField(max_length=40)),
                ("record_id", models.BigIntegerField(blank=True, null=True)),
                ("deleted_at", models.DateTimeField()),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        migrations.CreateModel(
            name="DocumentDisposition",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("document_id", models.CharField(max_length=64, unique=True)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("set_aside", "Set aside under a legal hold"),
                            ("purged", "Purged"),
                        ],
                        default="pending",
                        max_length=12,
                    ),
                ),
                ("decided_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        migrations.RemoveIndex(
            model_name="cleanupjob",
            name="job_open_partition_idx",
        ),
        migrations.AddConstraint(
            model_name="cleanupjob",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "delete"), ("state__in", ["pending", "leased"])),
                fields=("portfolio_id", "property_id", "record_kind"),
                name="job_one_open_per_partition",
            ),
        ),
        migrations.AddField(
            model_name="deletedattachment",
            name="purge_request",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="attachments", to="cleanup_ops.purgerequest"
            ),
        ),
        migrations.AddField(
            model_name="documentdisposition",
            name="decided_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="decisions",
                to="cleanup_ops.purgerequest",
            ),
        ),
        migrations.AddIndex(
            model_name="deletedattachment",
            index=models.Index(fields=["document_id"], name="deleted_attachment_doc_idx"),
        ),
        migrations.AddConstraint(
            model_name="deletedattachment",
            constraint=models.UniqueConstraint(
                fields=("record_kind", "record_id"), name="deleted_attachment_one_per_record"
            ),
        ),
        migrations.RunPython(backfill_document_decisions, migrations.RunPython.noop),
    ]
