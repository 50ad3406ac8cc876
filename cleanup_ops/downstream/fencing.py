"""The purge's calls to the store, fenced: step 2c of the protocol stated in
``cleanup_ops.downstream.decision`` (the decision's locks held across the call).

The HTTP store gets one ``DELETE`` per document with a deadline on the
database's clock (``_fence_deadline``), which it refuses after; a Django
storage, which nothing can make refuse a late call, gets one call per batch of
documents, started only while the decision's session is sure to outlive the
call's bound (``_call_gate``). Apart from the decision because this is the
part that reaches outside the database: the timeouts, the idle bound of the
decision's session and what a call whose effect is unknown leaves behind.
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from psycopg import sql as pg

from cleanup_ops import clock, sql
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.downstream.decision import CLEAR, SliceRequest, disposition_mark, purge_decide, purge_decide_many
from cleanup_ops.downstream.stores import ABSENT, DELETED, FAILED, AttachmentStore, KeyResult, ref_key
from cleanup_ops.models import DispositionState, DocumentDisposition
from cleanup_ops.recovery.classification import DownstreamConnectionError, DownstreamTimeout, StaleDecision


def idempotency_key(request_key: str, document_id: str) -> str:
    return f"{request_key}:{document_id}"


def _transaction_idle_timeout() -> pg.SQL:
    """End this transaction's session if it sits idle longer than
    the parameter (milliseconds) — the backstop for a lock held across a
    bounded HTTP call."""
    return pg.SQL("SELECT set_config('idle_in_transaction_session_timeout', %s, true)")


def check_and_delete(store: AttachmentStore, *, request: SliceRequest, document_id: str) -> tuple[str, str]:
    """Step 2b-c: the verdict, and the store's effect when the document was sent."""
    key = idempotency_key(request.key, document_id)
    outermost = not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cur:
        if outermost:
            # Backstop for the locks held across the call: PostgreSQL ends the
            # session if it sits idle in this transaction longer than the
            # call's bound — a stalled worker gives its locks back.
            sql.execute(_transaction_idle_timeout(), [str(math.ceil(lock_bound_seconds() * 1000))], cur=cur)
        verdict = purge_decide(request=request, document_id=document_id, cur=cur, store=store)
        if verdict != CLEAR:
            return verdict, ""
        checkpoint("purge.before_store_call")
        # Read right before the call, on the decision's own session: a session
        # that ended while the worker stalled (its locks gone, whatever ended
        # it) fails here and sends nothing; one that is alive now lives at
        # least its idle bound past this statement, which the deadline spans.
        deadline = _fence_deadline(cur)
        (result,) = store.delete([document_id], idempotency_keys=[key], deadline=deadline)
        effect = result.effect
        checkpoint("purge.after_store_call")
        # Still under the document's lock: no other purge decides it meanwhile.
        disposition_mark(document_id, state=DispositionState.PURGED, request_id=request.id)
        return verdict, effect


def _fence_deadline(cur: Any) -> float:
    """The instant (database clock) until which the store may apply this
    decision's DELETE: the last statement's end plus the session's idle
    bound, less the clock skew allowed between the store and the database.

    Why it holds: the decision's locks live as long as its session, and
    PostgreSQL ends the session no earlier than the idle bound after its
    last statement (this one); so a DELETE the store applies by its clock
    before the deadline is applied, in real time, before the locks can be
    gone — as long as the store's clock is within ``DOCSTORE_CLOCK_SKEW_SECONDS``
    of the database's. A worker that stalls past it is refused (412), and
    decides again under fresh locks."""
    (database_now,) = sql.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())", cur=cur).fetchone()
    return float(database_now) + lock_bound_seconds() - settings.DOCSTORE_CLOCK_SKEW_SECONDS


def lock_bound_seconds() -> float:
    """The longest one call can take under the client's timeouts (pool, connect,
    write, two reads), plus a margin and the clock skew allowed: how long
    the decision's locks may be held idle, and the fencing deadline's span."""
    connect, read = settings.DOCSTORE_CONNECT_TIMEOUT, settings.DOCSTORE_READ_TIMEOUT
    return 2 * connect + 3 * read + 5 + settings.DOCSTORE_CLOCK_SKEW_SECONDS


def check_and_delete_many(
    store: AttachmentStore, *, request: SliceRequest, refs: list[str]
) -> tuple[list[tuple[str, str, str]], BaseException | None]:
    """Step 2b-c for a store that is not fenced (a Django storage), a batch
    at a time: every document's decision in one transaction, one call for
    the clear ones (``DeleteObjects`` on S3), each key's result recorded.

    Returns (verdict, effect, code) for the documents done, in order, and
    the failure that stops at the first key the call did not settle (its
    error, raised once the documents before it are recorded), or None.
    The locks are held across the call as for the HTTP store,
    but nothing can refuse a late call: it is started only if the decision's
    session is sure to outlive the call's client-side bound
    (``_call_gate``), else nothing is sent and the job decides again."""
    outermost = not connection.in_atomic_block
    bound = _storage_lock_bound_seconds(store)
    with transaction.atomic(), connection.cursor() as cur:
        if outermost:
            sql.execute(_transaction_idle_timeout(), [str(math.ceil(bound * 1000))], cur=cur)
        verdicts = purge_decide_many(request=request, refs=refs, cur=cur, store=store)
        clear = [r for r in refs if verdicts[r] == CLEAR]
        results = {}
        if clear:
            checkpoint("purge.before_store_call")
            _call_gate(cur, store=store, bound=bound)
            results = _store_delete(store, request=request, refs=clear)
            checkpoint("purge.after_store_call")
            # Still under the documents' locks.
            _dispositions_mark_gone(results, request_id=request.id)
        return _outcomes(refs, verdicts, results)


def _storage_lock_bound_seconds(store: AttachmentStore) -> float:
    """How long a storage decision's locks may sit idle: the call's bound plus
    the same margin and skew allowance as the HTTP store's."""
    return store.call_bound_seconds() + 5 + settings.DOCSTORE_CLOCK_SKEW_SECONDS


def _call_gate(cur: Any, *, store: AttachmentStore, bound: float) -> None:
    """Right before a call the store cannot fence: read the database's clock
    on the decision's own session (a session that ended while the worker
    stalled fails here, and nothing is sent); the session then lives at
    least ``bound`` past this statement. Start the call only if what is left
    of that span — the deadline, less the clock skew allowed, less the time
    since the reading — still covers the call's client-side bound; else
    ``StaleDecision`` (nothing sent; retried under a fresh decision)."""
    sql.execute("SELECT 1", cur=cur).fetchone()
    read_at = time.monotonic()
    left = bound - settings.DOCSTORE_CLOCK_SKEW_SECONDS - (time.monotonic() - read_at)
    if left < store.call_bound_seconds():
        raise StaleDecision("the decision's locks may not outlive the call")


def _store_delete(store: AttachmentStore, *, request: SliceRequest, refs: list[str]) -> dict[str, KeyResult]:
    """One call for ``refs``; after a call whose effect is unknown (a timeout,
    a lost connection), ask the store about each key (``exists``): a file it
    no longer has is recorded as gone, one it still has as failed (retried)."""
    if not refs:
        return {}
    keys = [ref_key(request.store, r) for r in refs]
    try:
        results = store.delete(keys)
    except (DownstreamTimeout, DownstreamConnectionError) as exc:
        try:
            results = [KeyResult(FAILED, "", exc) if store.exists(key) else KeyResult(DELETED) for key in keys]
        except Exception:
            raise exc from None
    return dict(zip(refs, results, strict=True))


def _dispositions_mark_gone(results: dict[str, KeyResult], *, request_id: int) -> None:
    gone = [ref for ref, result in results.items() if result.effect in (DELETED, ABSENT)]
    if gone:
        DocumentDisposition.objects.filter(document_id__in=gone).update(
            state=DispositionState.PURGED, decided_by_id=request_id, decided_at=clock.now()
        )


def _outcomes(
    refs: list[str], verdicts: dict[str, str], results: dict[str, KeyResult]
) -> tuple[list[tuple[str, str, str]], BaseException | None]:
    done: list[tuple[str, str, str]] = []
    for ref in refs:
        verdict = verdicts[ref]
        if verdict != CLEAR:
            done.append((verdict, "", ""))
            continue
        result = results[ref]
        if result.effect == FAILED:
            return done, result.error or DownstreamTimeout(result.code or "unknown")
        done.append((verdict, result.effect, result.code))
    return done, None
