"""The purge's outbox and its decisions: what a batch hands to the purge of
its attachments, and what each document's purge decided.

Apart from the jobs (``models/jobs.py``, whose docstring says how a batch
writes a ``PurgeRequest`` and its ``purge`` job in its own transaction): these
rows are read and locked by the purge's protocol, stated in
``cleanup_ops/downstream/decision.py``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from cleanup_ops.models.jobs import CleanupJob
from cleanup_ops.models.scope_keys import ScopeKey

# S3's limit on an object key (bytes of UTF-8) and a storage alias's length:
# a purge's document reference is an HTTP document id, or ``<alias>:<key>``
# (``downstream.stores.document_ref``), kept exactly.
STORAGE_KEY_MAX_BYTES = 1024
STORE_ALIAS_MAX_LENGTH = 64
DOCUMENT_REF_MAX_LENGTH = STORE_ALIAS_MAX_LENGTH + 1 + STORAGE_KEY_MAX_BYTES


class PurgeRequest(models.Model):
    """Outbox row: the attachments of one applied batch, to be removed from the store.

    Written in the batch's transaction. ``key`` is the batch's operation id;
    each document's ``Idempotency-Key`` is ``<key>:<document id>``, so every
    retry, redelivery or redrive sends the same key for the same document.
    ``store`` is where the files are: ``""`` for the HTTP document store, or
    the ``STORAGES`` alias of the kind at the batch's time; ``document_ids``
    are the documents' references (``downstream.stores.document_ref``).
    Ids or keys that cannot be purged (an HTTP id that is not a plain
    identifier — it could be a URL or a path smuggled into a record —, a key
    too long for the storage, blank, or refused by it) are never stored and
    never sent: their count is ``invalid_ids`` and their records are named in
    ``unpurgeable`` (``{"record_id": …, "problem": …}``, the problem a short
    category, never the key), and the purge job then ends as a
    ``policy_or_input`` dead letter naming the kind and those records.
    """

    key = models.CharField(max_length=64, unique=True)
    delete_job = models.ForeignKey(CleanupJob, on_delete=models.PROTECT, related_name="purge_requests")
    portfolio = ScopeKey(settings.RETENTION_PORTFOLIO_MODEL)
    property = ScopeKey(settings.RETENTION_PROPERTY_MODEL, null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    store = models.CharField(max_length=STORE_ALIAS_MAX_LENGTH, blank=True, default="")
    document_ids = models.JSONField(default=list)
    invalid_ids = models.PositiveIntegerField(default=0)
    unpurgeable = models.JSONField(default=list, blank=True)
    documents_purged = models.PositiveIntegerField(default=0)
    documents_absent = models.PositiveIntegerField(default=0, help_text="404: already gone, counted as done.")
    documents_referenced = models.PositiveIntegerField(
        default=0, help_text="Skipped: a remaining record (of any kind) still names the document. Never deleted."
    )
    documents_held = models.PositiveIntegerField(
        default=0, help_text="Set aside: an active legal hold covered the deleted records' scope before the purge."
    )
    # The set-aside documents not yet handed to a later purge (emptied when a
    # sweep finds their hold released and re-queues them as a new request).
    held_document_ids = models.JSONField(default=list, blank=True)
    # A re-queued request: the original (its key is the batch's operation id,
    # whose ledger row gives the deleted records' id range).
    origin = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="requeues")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [
            # Each sweep trigger looks for set-aside documents whose hold is gone.
            models.Index(fields=["id"], condition=Q(documents_held__gt=0), name="purge_request_held_idx"),
        ]

    def __str__(self) -> str:
        return f"Purge request {self.key[:12]}"


class DeletedAttachment(models.Model):
    """A deleted record named this document: written in the deleting batch's
    transaction, one row per record (never two: a record is deleted once).

    What the purge of a document asks about (``downstream.decision``): an
    active hold over *any* record that named the document — of any kind,
    property or portfolio, deleted by any batch — keeps the file. Record ids
    are kept so that a record-level hold is matched exactly; rows written
    before record ids were kept have none and match any record-level hold of
    their scope (keep a file too many, never one too few).
    """

    document_id = models.CharField(max_length=DOCUMENT_REF_MAX_LENGTH)
    portfolio = ScopeKey(settings.RETENTION_PORTFOLIO_MODEL)
    property = ScopeKey(settings.RETENTION_PROPERTY_MODEL, null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    record_id = models.BigIntegerField(null=True, blank=True)
    # A non-integer key, as text (record_id is then NULL).
    record_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    purge_request = models.ForeignKey(PurgeRequest, on_delete=models.PROTECT, related_name="attachments")
    deleted_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["document_id"], name="deleted_attachment_doc_idx")]
        constraints = [
            models.UniqueConstraint(fields=["record_kind", "record_id"], name="deleted_attachment_one_per_record"),
            models.UniqueConstraint(
                fields=["record_kind", "record_key"], condition=~Q(record_key=""), name="deleted_attachment_one_per_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.record_kind} {self.record_id} named {self.document_id}"


class DispositionState(models.TextChoices):
    PENDING = "pending", "Pending"  # no decision yet (or only "still referenced")
    SET_ASIDE = "set_aside", "Set aside under a legal hold"
    PURGED = "purged", "Purged"  # final: the store deleted it (or had no such document)


class DocumentDisposition(models.Model):
    """The one purge decision per document id: its row is the lock every
    purge of that document takes (``FOR UPDATE``), whichever request, scope
    or portfolio it comes from, and ``purged`` is final, so no document is
    deleted twice and none through another record's request while a hold
    keeps it."""

    State = DispositionState

    document_id = models.CharField(max_length=DOCUMENT_REF_MAX_LENGTH, unique=True)
    state = models.CharField(max_length=12, choices=DispositionState.choices, default=DispositionState.PENDING)
    # The request whose purge decided last (set aside or purged).
    decided_by = models.ForeignKey(
        PurgeRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="decisions"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.document_id}: {self.state}"


class DocumentSpelling(models.Model):
    """A living record spells a storage document's key other than the
    storage's canonical name (``downstream.stores``: ``contracts//a.pdf`` for
    ``contracts/a.pdf``): written by the reference guard's trigger when a
    record starts naming the key (``downstream.guard``), and by
    ``cleanup_reference_guard --install`` for rows written before the guard.

    Why: the purge compares canonical references, but the living-reference
    check asks the record tables by the value of their column, through its
    index; this table gives it every other spelling of a document to ask for
    too, so a record naming the file another way keeps it. A row outlives the
    record that spelled the key so (a spelling no record holds any more
    matches nothing): at most one row per distinct spelling ever written.
    """

    # The canonical reference (``stores.document_ref``), as a disposition's.
    document_id = models.CharField(max_length=DOCUMENT_REF_MAX_LENGTH)
    # The key as a record's column spells it.
    spelling = models.CharField(max_length=STORAGE_KEY_MAX_BYTES)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["document_id", "spelling"], name="document_spelling_one_per_spelling"),
        ]

    def __str__(self) -> str:
        return f"{self.document_id} spelled {self.spelling}"
