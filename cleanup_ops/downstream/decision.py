"""Downstream purge: remove a deleted batch's attachments from the document
store — the protocol, and the one decision about each document (step 2b).

The protocol's other parts live beside this one: the store calls and their
fencing (step 2c) in ``downstream.fencing``, the purge job's slice, cursor and
finish (steps 1, 2a, 2d, 3) in ``downstream.purge``.

Protocol of a purge job's slice (the job is already leased by
``execution.runner.job_run_slice``, which also classifies any failure):

1. Read the job's ``PurgeRequest`` (document ids, key, scope) and its cursor:
   the number of documents already done. A redrive starts from the old cursor.
2. Per document, in order:
   a. if the store answered 429/503 with a ``Retry-After`` that has not
      passed yet (to this worker or any other), give the job back until that
      instant, without counting an attempt; otherwise take a token from the
      store's own buckets (``DOCSTORE_RATE_*``: global and per portfolio,
      apart from the delete buckets); no token soon → give the job back for
      later, again without counting an attempt;
   b. **the decision about that document**, whatever request, scope or
      portfolio asks (lock, then read): lock the document's
      ``DocumentDisposition`` row (``FOR UPDATE``; created on first use) —
      every purge of that document id serialises here, and so does every
      batch that deletes a record naming it
      (``execution.outbox._dispositions_take``), so the deleted records read
      next cannot grow while this decides — then, in a later statement,
      take the scope lock of *every* deleted record that named it (their
      property and portfolio rows ``FOR SHARE``, from
      ``DeletedAttachment``: the lock a batch takes, which placing a hold
      takes ``FOR UPDATE``), then, in later statements that see any hold
      waited for:
      - already ``purged``: by another request, counted as already gone; by
        this same request (a worker that lost its lease after the call),
        counted as purged. Nothing is sent. (A purged id that a deleted
        record names again was reused: the batch made it ``pending`` again.)
      - an active legal hold over any record that named the document —
        deleted by any batch, of any kind or property
        (``retention.eligibility.deleted_record_held_sql``) → ask the store whether
        it still has the file (``HEAD``): if it does, the document is **set
        aside** (disposition ``set_aside``); if not, it is recorded as
        absent, never as set aside. A set-aside document stays so until
        every such hold is released; the next sweep then hands it to a new
        purge that decides again (``purge_requeue_released``);
      - any remaining record of any kind still naming the document id → the
        document is **skipped as still referenced** (``documents_referenced``)
        and never deleted: that record's own deletion purges it later;
   c. otherwise ``DELETE /documents/<id>`` with ``Idempotency-Key: <request
      key>:<id>`` and a **fencing deadline** (``Fence-Deadline``, on the
      database's clock: the decision's last statement plus the session's idle
      bound, less the allowed clock skew). The decision's
      transaction — and so its locks — stays open across this call, which is
      bounded by the store's timeouts; ``idle_in_transaction_session_timeout``
      ends the session of a worker that stalls past that bound, and the store
      refuses a DELETE that arrives after the deadline (412 →
      ``StaleDecision``, retried under a fresh decision). So no hold commits
      between the check and an applied DELETE. The job row is never locked
      during the call. 2xx → deleted; 404 → already gone, also done. The
      disposition becomes ``purged`` in the decision's transaction;
   d. one short fenced transaction that locks the job row where the lease
      token is still ours and moves the cursor past the document, counting it
      (``documents_held``/``held_document_ids`` for a set-aside one). If the
      lease was lost after the decision committed, the next holder finds the
      disposition ``purged`` by this request and sends nothing; if the
      decision's transaction did not commit, it decides again and sends the
      same key, which the store answers from its idempotency record.
3. Cursor at the end → the job is done, in the same fenced way: ``purged``, or
   ``purge_held`` when documents were set aside. If the outbox counted ids
   or keys that cannot be purged (``PurgeRequest.unpurgeable`` names their
   records), the job instead becomes a ``policy_or_input`` dead letter once
   the valid ones are done, naming the kind and those records: the files of
   such records cannot be found safely and an operator has to look.

Stores that are not fenced (a Django storage: ``downstream.stores``; S3, the
file system) follow the same protocol a batch of documents at a time
(``downstream.fencing.check_and_delete_many``, up to ``STORAGE_PURGE_BATCH_SIZE``, S3's
``DeleteObjects`` limit of 1,000): in one transaction every document's
disposition row ``FOR UPDATE`` in document order, then the scope rows of
every deleted record that named any of them, then the holds (``HEAD`` before
any set-aside) and the living references, set-based, a verdict per document;
then one call for the clear ones. Nothing can refuse a late call, so it is
started only if the session — and so the locks — is sure to outlive the
call's client-side bound (``downstream.fencing._call_gate``; otherwise ``StaleDecision``,
nothing sent). Each key's result is recorded under the locks; after a call
whose effect is unknown (a timeout) the store is asked about each key, and a
file it no longer has is recorded as gone. Step d then moves the cursor past
every document up to the first key the call did not settle (a per-key
``SlowDown``), whose error is raised once the others are recorded. A key the
store refuses (a per-key ``AccessDenied``) names its records in the request's
``unpurgeable`` like a key that could not be sent; docs/architecture.md says
what a hold placed at any moment gets on each backend.

What remains open: a record that starts naming a document id after the
check (record writes by the application take no lock of ours).

Failures are exceptions from the client and are classified by
``cleanup_ops.recovery.classification``: 429/503 wait for ``Retry-After``; other 5xx,
connection errors, timeouts and stale decisions back off and retry with the
same key; other 4xx and redirects dead-letter as ``downstream_rejected``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from psycopg import sql as pg

from cleanup_ops import clock, sql
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.downstream.stores import DOCSTORE, AttachmentStore, ref_key
from cleanup_ops.models import DeletedAttachment, DispositionState, DocumentDisposition, DocumentSpelling
from retention.eligibility import deleted_record_held_sql
from retention.registry import REGISTRY

# The purge's one log (``downstream.purge``'s), whichever of its modules writes.
logger = logging.getLogger("cleanup_ops.downstream.purge")

# What the decision says of one document (step 2b).
CLEAR = "clear"
HELD = "held"
REFERENCED = "referenced"
ALREADY = "already"  # purged before, by another request
PURGED_BY_US = "purged_by_us"  # purged before by this request (a lost lease after the call)


@dataclass(frozen=True)
class SliceRequest:
    """A purge request as a slice needs it, read once."""

    id: int
    key: str
    document_ids: list[str]
    invalid: int
    portfolio_id: int
    property_id: int | None  # None: a kind without a property (the partition is the portfolio)
    record_kind: str
    store: str


def purge_decide(
    *, request: SliceRequest, document_id: str, cur: Any = None, store: AttachmentStore | None = None
) -> str:
    """Inside the caller's transaction: the one decision about ``document_id``.

    The document's disposition row locked first (every purge of it waits
    here), then the scope rows of every deleted record that named it, then —
    in later statements, which under READ COMMITTED see a hold whose
    placement we waited for — the hold and reference checks.
    """
    DocumentDisposition.objects.bulk_create([DocumentDisposition(document_id=document_id)], ignore_conflicts=True)
    state, decided_by = (
        DocumentDisposition.objects.select_for_update()
        .filter(document_id=document_id)
        .values_list("state", "decided_by_id")[0]
    )
    checkpoint("purge.after_decision_lock")
    if state == DispositionState.PURGED:
        # This request's own earlier call (whose worker lost its lease before
        # moving the cursor) counts as purged here; another's as already gone.
        return PURGED_BY_US if decided_by == request.id else ALREADY
    # Read after the document's lock: every batch that names the document
    # takes that row too (``execution.outbox._dispositions_take``), so the
    # deleted records read here are all there will be until this decision ends.
    locked = sql.execute(_document_scopes_lock(), [document_id], cur=cur)
    if cur is not None:
        locked.fetchall()
    if any(not spec.has_property for spec in REGISTRY.values()):
        # Records of a kind without a property: their scope is the portfolio row alone.
        locked = sql.execute(_document_portfolios_lock(), [document_id], cur=cur)
        if cur is not None:
            locked.fetchall()
    checkpoint("purge.after_scope_lock")
    if document_held(document_id):
        if store is not None and not store.exists(ref_key(request.store, document_id)):
            # The proof says what the store says: a file it no longer has
            # (a call of an earlier decision applied after its locks were
            # gone, or removed by other means) is not "set aside".
            logger.warning(
                "purge: document %s is under a legal hold but the store no longer has it",
                document_id,
                extra={"document_id": document_id, "purge_request_id": request.id},
            )
            disposition_mark(document_id, state=DispositionState.PURGED, request_id=request.id)
            return ALREADY
        disposition_mark(document_id, state=DispositionState.SET_ASIDE, request_id=request.id)
        return HELD
    if document_still_referenced(document_id, store=request.store):
        return REFERENCED
    return CLEAR


def purge_decide_many(
    *, request: SliceRequest, refs: list[str], store: AttachmentStore, cur: Any = None
) -> dict[str, str]:
    """``purge_decide`` for a batch of documents, in the caller's transaction:
    every document's disposition row locked first (in document order, as a
    batch takes them), then the scope rows of every deleted record that named
    any of them, then — in later statements — the hold and reference checks,
    each set-based."""
    ordered = sorted(set(refs))
    DocumentDisposition.objects.bulk_create(
        [DocumentDisposition(document_id=r) for r in ordered], ignore_conflicts=True
    )
    rows = list(
        DocumentDisposition.objects.select_for_update()
        .filter(document_id__in=ordered)
        .order_by("document_id")
        .values_list("document_id", "state", "decided_by_id")
    )
    checkpoint("purge.after_decision_lock")
    verdicts: dict[str, str] = {}
    undecided = []
    for ref, state, decided_by in rows:
        if state == DispositionState.PURGED:
            verdicts[ref] = PURGED_BY_US if decided_by == request.id else ALREADY
        else:
            undecided.append(ref)
    if undecided:
        sql.execute(_document_scopes_lock_many(), [undecided], cur=cur).fetchall()
        if any(not spec.has_property for spec in REGISTRY.values()):
            # Records of a kind without a property: their scope is the portfolio row alone.
            sql.execute(_document_portfolios_lock_many(), [undecided], cur=cur).fetchall()
    checkpoint("purge.after_scope_lock")
    held = documents_held(undecided) if undecided else set()
    for ref in sorted(held):
        if store.exists(ref_key(request.store, ref)):
            disposition_mark(ref, state=DispositionState.SET_ASIDE, request_id=request.id)
            verdicts[ref] = HELD
        else:
            # As for the HTTP store: never "set aside" for a file the store does not have.
            logger.warning(
                "purge: document %s is under a legal hold but the store no longer has it",
                ref,
                extra={"document_id": ref, "purge_request_id": request.id},
            )
            disposition_mark(ref, state=DispositionState.PURGED, request_id=request.id)
            verdicts[ref] = ALREADY
    rest = [r for r in undecided if r not in held]
    referenced = documents_referenced(rest, store=request.store)
    for ref in rest:
        verdicts[ref] = REFERENCED if ref in referenced else CLEAR
    return verdicts


def _document_scopes_lock() -> pg.Composed:
    """The property and portfolio rows of every deleted record that named a
    document, ``FOR SHARE`` in property id order: the lock a batch takes on
    its scope, taken by a purge over every scope the document was named in
    (placing a hold takes one of these rows ``FOR UPDATE``). Parameter: the
    document id."""
    return sql.composed(
        """
        SELECT p.{property_pk} FROM {property} p
        JOIN {portfolio} po ON po.{portfolio_pk} = p.{property_portfolio}
        WHERE p.{property_pk} IN (SELECT a.property_id FROM {refs} a WHERE a.document_id = %s)
        ORDER BY p.{property_pk} FOR SHARE OF p, po
        """,
        refs=sql.ident(DeletedAttachment._meta.db_table),
    )


def _document_portfolios_lock() -> pg.Composed:
    """The portfolio rows of every deleted record of a kind without a
    property that named a document (``property_id`` NULL), ``FOR SHARE`` in
    id order: such a batch's scope lock, taken by the purge after
    ``_document_scopes_lock``. Parameter: the document id."""
    return sql.composed(
        """
        SELECT po.{portfolio_pk} FROM {portfolio} po
        WHERE po.{portfolio_pk} IN (
            SELECT a.portfolio_id FROM {refs} a WHERE a.document_id = %s AND a.property_id IS NULL
        )
        ORDER BY po.{portfolio_pk} FOR SHARE OF po
        """,
        refs=sql.ident(DeletedAttachment._meta.db_table),
    )


def _document_portfolios_lock_many() -> pg.Composed:
    """``_document_portfolios_lock`` for a batch of documents.
    Parameter: the document ids (an array)."""
    return sql.composed(
        """
        SELECT po.{portfolio_pk} FROM {portfolio} po
        WHERE po.{portfolio_pk} IN (
            SELECT a.portfolio_id FROM {refs} a WHERE a.document_id = ANY(%s) AND a.property_id IS NULL
        )
        ORDER BY po.{portfolio_pk} FOR SHARE OF po
        """,
        refs=sql.ident(DeletedAttachment._meta.db_table),
    )


def _document_scopes_lock_many() -> pg.Composed:
    """``_document_scopes_lock`` for a batch of documents: the
    scope rows of every deleted record that named any of them. Parameter:
    the document ids (an array)."""
    return sql.composed(
        """
        SELECT p.{property_pk} FROM {property} p
        JOIN {portfolio} po ON po.{portfolio_pk} = p.{property_portfolio}
        WHERE p.{property_pk} IN (SELECT a.property_id FROM {refs} a WHERE a.document_id = ANY(%s))
        ORDER BY p.{property_pk} FOR SHARE OF p, po
        """,
        refs=sql.ident(DeletedAttachment._meta.db_table),
    )


def documents_held(document_ids: list[str]) -> set[str]:
    """Those of ``document_ids`` that an active hold keeps: it covers a deleted
    record — of any kind, property or portfolio, deleted by any batch — that
    named the document. One query for the whole list."""
    if not document_ids:
        return set()
    return {document_id for (document_id,) in sql.execute(_documents_held(), [list(document_ids)])}


def _documents_held() -> pg.Composed:
    """The documents of a list (the parameter) named by a deleted record an
    active hold covers: the hold rule's one text
    (``retention.eligibility.deleted_record_held_sql``) over this table's
    columns, names from ``_meta``, no value of anyone's in the text."""
    return sql.composed(
        """
        SELECT DISTINCT d.document_id FROM {deleted} d
        WHERE d.document_id = ANY(CAST(%s AS varchar[])) AND {held}
        """,
        deleted=sql.ident(DeletedAttachment._meta.db_table),
        held=deleted_record_held_sql("d"),
    )


def document_held(document_id: str) -> bool:
    return bool(documents_held([document_id]))


def disposition_mark(document_id: str, *, state: str, request_id: int) -> None:
    DocumentDisposition.objects.filter(document_id=document_id).update(
        state=state, decided_by_id=request_id, decided_at=clock.now()
    )


def document_still_referenced(document_id: str, *, store: str = DOCSTORE) -> bool:
    """Does any remaining record, of any kind with attachments in the same
    store, name ``document_id`` (a canonical reference, ``stores.document_ref``)
    — spelled as its canonical key or any other way recorded for it?"""
    return bool(documents_referenced([document_id], store=store))


def documents_referenced(refs: list[str], *, store: str) -> set[str]:
    """Those of ``refs`` (canonical references) that a remaining record of a
    kind of ``store`` names: a query per such kind, by the column's value.

    A record may spell a storage's key other than its canonical name
    (``contracts//a.pdf`` for ``contracts/a.pdf``: one object to the store).
    The reference guard records each such spelling as it is written
    (``DocumentSpelling``, under the document's decision row, which this
    decision holds), so the check asks the record tables for those spellings
    too — through the column's index, never computing a canonical name per
    row (issue 37)."""
    if not refs:
        return set()
    by_key: dict[str, set[str]] = {}
    for ref in refs:
        by_key.setdefault(ref_key(store, ref), set()).add(ref)
    if store != DOCSTORE:
        spelled = DocumentSpelling.objects.filter(document_id__in=refs).values_list("document_id", "spelling")
        for ref, spelling in spelled:
            by_key.setdefault(spelling, set()).add(ref)
    named: set[str] = set()
    for spec in REGISTRY.values():
        if spec.attachment_field and (spec.attachment_storage or DOCSTORE) == store:
            field = spec.attachment_field
            values = spec.model._default_manager.filter(**{f"{field}__in": list(by_key)}).values_list(field, flat=True)
            named.update(str(v) for v in values)
    return {ref for key in named for ref in by_key.get(key, ())}
