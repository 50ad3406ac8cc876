"""The batch's outbox (step f of ``execution.batches``): what an applied batch
leaves for the attachments' purge, written in the batch's own transaction.

Apart from the batch transaction because it is a different subject — which
document each deleted record named, in which store, and the document's
disposition row (``_dispositions_take``, the batch's part in the disposition
protocol, whose statement lives here) — and the purge's protocol
(``downstream.purge``) is what a reader of it needs next, not the batch's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from psycopg import sql as pg

from cleanup_ops import sql
from cleanup_ops.downstream import stores
from cleanup_ops.execution.candidates import Key
from cleanup_ops.models import (
    CleanupJob,
    DeletedAttachment,
    DispositionState,
    DocumentDisposition,
    JobKind,
    PurgeRequest,
    scope_of,
)
from retention.registry import get_spec

_DISPOSITION_COLUMNS: sql.Columns = (("document_id", "varchar"),)


def _dispositions_take() -> pg.Composed:
    """A batch's part in each document's one decision: the ``DocumentDisposition``
    row of every document its deleted records named, created or locked (an
    ``ON CONFLICT DO UPDATE`` locks the row whether or not its condition lets
    it update), in document id order, held until the batch commits. A purge
    decides about a document only under that row's ``FOR UPDATE``, so the
    deleted records it reads (``DeletedAttachment``, written in the same
    batch) cannot grow while it decides: a batch naming the document either
    committed before the purge took the row, or waits for the purge's
    decision to end. A document already ``purged`` whose id a deleted record
    names again was reused for a new file: it gets a fresh decision
    (``pending``). Parameters: ``x`` (``_DISPOSITION_COLUMNS``), ``pending``,
    ``purged``.

    Its home: the disposition protocol has two parts, the purge's (the row
    created and locked ``FOR UPDATE``, the decision under it:
    ``downstream.decision``) and the batch's, this statement, which lives
    with the one module that runs it; ``downstream.decision`` sits a layer
    above and only cites it."""
    return sql.composed(
        """
        WITH {x}
        INSERT INTO {table} (document_id, state) SELECT x.document_id, %(pending)s FROM x ORDER BY x.document_id
        ON CONFLICT (document_id) DO UPDATE SET state = %(pending)s, decided_by_id = NULL, decided_at = NULL
        WHERE {table}.state = %(purged)s
        """,
        x=sql.rows_cte("x", _DISPOSITION_COLUMNS),
        table=sql.ident(DocumentDisposition._meta.db_table),
    )


class DeleteJob(Protocol):
    """What the outbox reads of the delete job a batch ran (``execution.batches.JobRef``)."""

    id: int
    portfolio_id: int
    property_id: int | None
    record_kind: str
    sweep_id: int
    cutoff: datetime


def purge_outbox_write_many(
    batches: list[tuple[DeleteJob, str, list[tuple[str, Key]]]], *, now: datetime
) -> list[CleanupJob]:
    """The outbox rows of applied batches: per batch a ``PurgeRequest`` and its
    ``purge`` job, and per deleted record with a document a ``DeletedAttachment``
    (which record named which document: what the purge's hold check asks
    about), in three statements whatever the number of batches.

    Called inside the batch's transaction. Each document is kept as its
    reference in the kind's store (``stores.document_ref``: the HTTP id, or
    ``<alias>:<key>`` with the storage's canonical name of the key the record
    holds, ``AttachmentStore.canonical``). Ids and
    keys the store cannot take (``stores.key_checker``) are never stored:
    counted, and their records named with the problem (see ``PurgeRequest``).
    """
    requests = []
    refs: list[dict[str, str]] = []  # per batch: the record's document -> its reference (purgeable ones)
    for job, operation, named in batches:
        store = get_spec(job.record_kind).attachment_storage or stores.DOCSTORE
        problem_of = stores.key_checker(store)
        canonical = stores.key_canonicaliser(store)
        refs_of: dict[str, str] = {}
        unpurgeable = []
        for document_id, record_id in named:
            problem = problem_of(document_id)
            if problem is None:
                # The name the store will act on: two spellings of one file
                # are one document to the purge (issue 37).
                refs_of[document_id] = stores.document_ref(store, canonical(document_id))
            else:
                unpurgeable.append({"record_id": record_id, "problem": problem})
        refs.append(refs_of)
        scope = scope_of(job)
        requests.append(
            PurgeRequest(
                key=operation,
                delete_job_id=job.id,
                portfolio_id=scope["portfolio_id"],
                property_id=scope["property_id"],
                record_kind=scope["record_kind"],
                store=store,
                document_ids=list(dict.fromkeys(refs_of[d] for d, _ in named if d in refs_of)),
                invalid_ids=len(unpurgeable),
                unpurgeable=unpurgeable,
                created_at=now,
            )
        )
    PurgeRequest.objects.bulk_create(requests)
    # This batch's part in each named document's one decision (``_dispositions_take``).
    named_documents = sorted({ref for refs_of in refs for ref in refs_of.values()})
    if named_documents:
        params = {
            **sql.rows_params("x", _DISPOSITION_COLUMNS, [{"document_id": d} for d in named_documents]),
            "pending": DispositionState.PENDING,
            "purged": DispositionState.PURGED,
        }
        sql.execute(_dispositions_take(), params)
    DeletedAttachment.objects.bulk_create(
        [
            DeletedAttachment(
                document_id=refs_of[document_id],
                portfolio_id=job.portfolio_id,
                property_id=job.property_id,
                record_kind=job.record_kind,
                # A non-integer key is named by its text (``record_key``).
                record_id=record_id if isinstance(record_id, int) else None,
                record_key="" if isinstance(record_id, int) else record_id,
                purge_request_id=request.pk,
                deleted_at=now,
            )
            for (job, _, named), request, refs_of in zip(batches, requests, refs, strict=True)
            for document_id, record_id in named
            if document_id in refs_of
        ]
    )
    return CleanupJob.objects.bulk_create(
        [
            CleanupJob(
                sweep_id=job.sweep_id,
                key=f"purge:{operation}",
                job_kind=JobKind.PURGE,
                purge_request_id=request.pk,
                cutoff=job.cutoff,
                available_at=now,
                **scope_of(job),
            )
            for (job, operation, _), request in zip(batches, requests, strict=True)
        ]
    )
