"""Dead letters: what one letter means (the store's answer, the documents it
concerns, what to do) and the inbox grouped by cause.

A *cause* is (category, HTTP status, record kind): letters sharing one
stopped for the same reason on the same kind of data, so one decision fits
them all (``views.letter_groups``). The advice is a pure function of the
cause (``letter_advice``); it names settings and next steps, never a
record's content. A letter whose category is a budget (attempts, age) is
advised on the failure that used the budget up (its job's last category).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.db.models import Count, Max, Min, QuerySet

from cleanup_ops.models import CleanupJob, DeadLetter, JobKind
from cleanup_ops.recovery.classification import FailureCategory

GROUP_ROWS = 50
DOCUMENTS_SHOWN = 20

_BUDGETS = {FailureCategory.RETRY_BUDGET_EXHAUSTED, FailureCategory.AGE_BUDGET_EXHAUSTED}


def status_text(status: int | None) -> str:
    """``403`` → "403 Forbidden"; an unknown status alone; None → "no HTTP answer"."""
    if status is None:
        return "no HTTP answer"
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def letter_advice(*, category: str, http_status: int | None, error_class: str = "", cause: str = "") -> str:
    """What an operator should do about letters of this cause. ``cause`` is the
    job's last failure category when ``category`` is a spent budget."""
    underlying = cause if category in _BUDGETS and cause else category
    then = "Then redrive; dismiss only if the work is meant to stay undone."
    if error_class == "DocstoreNotConfigured":
        return (
            "The worker that ran it has no document store configured (DOCSTORE_URL unset or invalid). "
            "Set DOCSTORE_URL for the cluster serving the purge queue and start it (a purge cluster), " + then
        )
    if error_class == "InvalidDocumentId":
        return (
            "The deleted records named attachments whose ids are not valid document ids; nothing was sent to the "
            "store. A redrive fails the same way: check the host application's attachment field, then dismiss "
            "with a reason saying where the files are dealt with."
        )
    if underlying == FailureCategory.CANCELLED:
        return "An operator cancelled this job. Redrive it to run it after all, or dismiss it to leave it undone."
    if http_status is not None and 300 <= http_status < 400:
        return (
            "The store answered with a redirect, which is never followed: DOCSTORE_URL points at the wrong "
            "address. Correct it for every cluster, " + then
        )
    if http_status in (401, 403):
        return (
            "The store refused this service's credentials or permission for these documents. Fix the store's "
            "access for the cleanup service, " + then
        )
    if http_status in (409, 412, 423):
        return (
            "The store reported a conflict or a lock on the documents (it may be keeping them itself). Find out "
            "why on the store's side; redrive once released, or dismiss if the store keeps them by design."
        )
    if http_status is not None and 400 <= http_status < 500:
        return (
            "The store rejected the request as invalid. Check the store's version and its request log for this "
            "idempotency key (the job page shows the documents), " + then
        )
    if underlying in (FailureCategory.DOWNSTREAM_THROTTLED, FailureCategory.DOWNSTREAM_UNAVAILABLE) or (
        http_status is not None and http_status >= 500
    ):
        return (
            "The store was throttling or unavailable on every attempt. Check its health and the delete rates "
            "(DOCSTORE_RATE_GLOBAL, DOCSTORE_RATE_PORTFOLIO), " + then
        )
    if underlying == FailureCategory.TIMEOUT:
        return (
            "Calls timed out before their effect was known; a redrive is safe (every call repeats its "
            "idempotency key). Check the store's latency and DOCSTORE_READ_TIMEOUT, " + then
        )
    if underlying == FailureCategory.POLICY_OR_INPUT:
        return (
            "The job's policy or input cannot run as it stands (see the error class). Fix the policy version in "
            "the admin, " + then
        )
    if category == FailureCategory.AGE_BUDGET_EXHAUSTED:
        return (
            "The job kept failing for longer than the age budget (CLEANUP_MAX_AGE_SECONDS). Fix the failure "
            "first (see the last failure), " + then
        )
    if underlying in (FailureCategory.TRANSIENT_DATABASE, FailureCategory.LEASE_LOST):
        return "The database or the workers' leases kept failing. Check the database and the workers page, " + then
    return "An unexpected error stopped it: look at the workers' logs for the error class, " + then


@dataclass(frozen=True)
class DocumentsAffected:
    """The documents a letter concerns: a purge job's request, counted."""

    purge: bool
    total: int = 0
    purged: int = 0
    absent: int = 0
    held: int = 0
    referenced: int = 0
    invalid: int = 0
    shown: tuple[str, ...] = ()
    # The records whose file cannot be purged (``PurgeRequest.unpurgeable``).
    unpurgeable_records: tuple[int, ...] = ()

    @property
    def waiting(self) -> int:
        """Documents still waiting for this letter's decision."""
        return max(0, self.total - self.purged - self.absent - self.held - self.referenced)


def documents_affected(job: CleanupJob) -> DocumentsAffected:
    """No query beyond the job's purge request (``select_related`` by the caller)."""
    if job.job_kind != JobKind.PURGE or job.purge_request is None:
        return DocumentsAffected(purge=False)
    request = job.purge_request
    ids = list(request.document_ids or [])
    return DocumentsAffected(
        purge=True,
        total=len(ids),
        purged=request.documents_purged,
        absent=request.documents_absent,
        held=request.documents_held,
        referenced=request.documents_referenced,
        invalid=request.invalid_ids,
        shown=tuple(str(i) for i in ids[:DOCUMENTS_SHOWN]),
        unpurgeable_records=tuple(
            int(entry["record_id"])
            for entry in (request.unpurgeable or [])[:DOCUMENTS_SHOWN]
            if isinstance(entry, dict) and isinstance(entry.get("record_id"), int)
        ),
    )


def letter_facts(letter: DeadLetter) -> dict[str, Any]:
    """What the letter page shows beyond the row itself."""
    return {
        "status_text": status_text(letter.http_status),
        "documents": documents_affected(letter.job),
        "advice": letter_advice(
            category=letter.category,
            http_status=letter.http_status,
            error_class=letter.error_class,
            cause=letter.job.last_error_category,
        ),
    }


def letter_groups(letters: QuerySet[DeadLetter]) -> list[dict[str, Any]]:
    """``letters`` (already filtered and scoped) grouped by cause, largest
    first: one query, at most ``GROUP_ROWS`` groups."""
    rows = list(
        letters.order_by()
        .values("category", "http_status", "record_kind")
        .annotate(
            n=Count("id"),
            portfolios=Count("portfolio_id", distinct=True),
            first_class=Min("error_class"),
            last_class=Max("error_class"),
            first_seen=Min("first_seen_at"),
            last_seen=Max("last_seen_at"),
            cause=Max("job__last_error_category"),
            message_class=Max("message_class"),
        )
        .order_by("-n", "category", "http_status", "record_kind")[:GROUP_ROWS]
    )
    for row in rows:
        one_class = row["first_class"] if row["first_class"] == row["last_class"] else ""
        row["error_class"] = one_class
        row["status_text"] = status_text(row["http_status"])
        row["advice"] = letter_advice(
            category=row["category"], http_status=row["http_status"], error_class=one_class, cause=row["cause"] or ""
        )
    return rows
