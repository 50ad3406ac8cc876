"""Jobs: the filter, the list (keyset-paginated), one job with its chain."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Expression, Max, Min, Q, Sum, Value
from django.db.models.functions import Coalesce

from cleanup_ops.console_selectors.letters import documents_affected
from cleanup_ops.console_selectors.names import PAGE_SIZE, SEARCH_MAX_LENGTH
from cleanup_ops.console_selectors.search import job_search_q
from cleanup_ops.models import (
    CleanupJob,
    DeadLetter,
    JobKind,
    JobState,
    LedgerEntry,
)
from cleanup_ops.recovery.classification import FailureCategory
from retention.domain import portfolio_model
from retention.filters import choice_param, id_param, key_param, text_param
from retention.models import AuditEvent
from retention.registry import REGISTRY
from retention.scoping import PortfolioScope, portfolio_ids_q

# --- Jobs: the filter, the list, one job ------------------------------------


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: the console's jobs list (and its links from other pages)."""

    sweep_id: int | None = None
    state: str | None = None
    portfolio_id: Any = None  # the customer model's key (an int, a UUID…)
    record_kind: str | None = None
    category: str | None = None
    job_kind: str | None = None
    text: str | None = None  # free-text search (``search.job_search_q``)
    # The jobs a bulk redrive created: redrives with ids in [id_min, id_max].
    id_min: int | None = None
    id_max: int | None = None
    redrives: bool = False
    job_ids: tuple[int, ...] | None = None  # one job's action, or ids pinned by a page

    def q(self) -> Q:
        q = Q()
        if self.text:
            q &= job_search_q(self.text)
        if self.id_min is not None:
            q &= Q(id__gte=self.id_min)
        if self.id_max is not None:
            q &= Q(id__lte=self.id_max)
        if self.redrives:
            q &= Q(redrive_of__isnull=False)
        if self.job_ids is not None:
            q &= Q(pk__in=self.job_ids)
        if self.sweep_id is not None:
            q &= Q(sweep_id=self.sweep_id)
        if self.state is not None:
            q &= Q(state=self.state)
        if self.portfolio_id is not None:
            q &= Q(portfolio_id=self.portfolio_id)
        if self.record_kind is not None:
            q &= Q(record_kind=self.record_kind)
        if self.category is not None:
            q &= Q(last_error_category=self.category)
        if self.job_kind is not None:
            q &= Q(job_kind=self.job_kind)
        return q

    def as_params(self) -> dict[str, str]:
        pairs = {
            "sweep": self.sweep_id,
            "state": self.state,
            "portfolio": self.portfolio_id,
            "kind": self.record_kind,
            "category": self.category,
            "job_kind": self.job_kind,
            "q": self.text,
            "id_min": self.id_min,
            "id_max": self.id_max,
            "redrives": "yes" if self.redrives else None,
        }
        return {name: str(value) for name, value in pairs.items() if value is not None}


def job_filter_parse(params: Mapping[str, Any], *, strict: bool) -> JobFilter:
    """``sweep``, ``state``, ``portfolio``, ``kind`` (record kind), ``category``
    (last failure category), ``job_kind`` (delete or purge), ``q`` (free
    text), ``id_min``/``id_max``/``redrives=yes`` (the jobs a bulk redrive made).

    ``strict``: an invalid value raises ``FilterError`` naming the parameter;
    otherwise it is ignored."""
    return JobFilter(
        sweep_id=id_param(params, "sweep", strict=strict),
        state=choice_param(params, "state", JobState.values, strict=strict),
        portfolio_id=key_param(params, "portfolio", model=portfolio_model(), strict=strict),
        record_kind=choice_param(params, "kind", list(REGISTRY), strict=strict),
        category=choice_param(params, "category", FailureCategory.values, strict=strict),
        job_kind=choice_param(params, "job_kind", JobKind.values, strict=strict),
        text=text_param(params, "q", strict=strict, max_length=SEARCH_MAX_LENGTH),
        id_min=id_param(params, "id_min", strict=strict),
        id_max=id_param(params, "id_max", strict=strict),
        redrives=choice_param(params, "redrives", ["yes"], strict=strict) == "yes",
    )


@dataclass
class JobsPage:
    jobs: list[CleanupJob]
    count: int
    older: int | None  # the ``before`` id of the next (older) page
    newest: bool  # no ``before``: the first page


def jobs_page(
    job_filter: JobFilter, *, portfolio_ids: PortfolioScope, before: int | None = None, size: int = PAGE_SIZE
) -> JobsPage:
    """Newest first, keyset-paginated on the id (``before``): two queries
    (the count and the page) whatever the page number."""
    qs = CleanupJob.objects.filter(job_filter.q(), portfolio_ids_q(portfolio_ids))
    count = qs.count()
    page = qs.order_by("-id")
    if before is not None:
        page = page.filter(id__lt=before)
    # A purge job shows its request's counts; its document ids are not read here.
    page = page.select_related("sweep", "purge_request").defer(
        "purge_request__document_ids", "purge_request__held_document_ids"
    )
    jobs = list(page[: size + 1])
    older = jobs[size - 1].pk if len(jobs) > size else None
    return JobsPage(jobs=jobs[:size], count=count, older=older, newest=before is None)


# The jobs list's sortable columns (``paging.sort_parse``): word → field.
JOB_SORTS: dict[str, str | Expression] = {
    "id": "id",
    "created": "created_at",
    "due": "available_at",
    "state": "state",
    "kind": "record_kind",
    "attempts": "attempt",
    "rows": "rows_deleted",
    "portfolio": "portfolio_id",
    "property": Coalesce("property_id", Value(0)),
    "sweep": "sweep_id",
}


def jobs_listed(job_filter: JobFilter, *, portfolio_ids: PortfolioScope) -> Any:
    """The jobs list's rows, unordered and unsliced (``paging.keyset_page``
    orders and pages them): what ``jobs_page`` reads, for any sort."""
    return (
        CleanupJob.objects.filter(job_filter.q(), portfolio_ids_q(portfolio_ids))
        .select_related("sweep", "purge_request")
        .defer("purge_request__document_ids", "purge_request__held_document_ids")
    )


LEDGER_ROWS = 50


def job_chain(job: CleanupJob) -> list[CleanupJob]:
    """The job and every redrive of its partition, oldest first, each with its
    dead letter (``dead_letter_or_none``): the failure history of the work.

    A partition has one job per sweep (a unique key) and its redrives share
    the sweep and the scope, so they are found by that, in one query."""
    scope: dict[str, Any] = {"portfolio_id": job.portfolio_id, "property_id": job.property_id}  # keys of any type
    chain = list(
        CleanupJob.objects.filter(
            sweep_id=job.sweep_id,
            **scope,
            record_kind=job.record_kind,
            job_kind=job.job_kind,
            purge_request_id=job.purge_request_id,
        )
        .select_related("dead_letter")
        .order_by("id")
    )
    for item in chain:
        try:
            letter = item.dead_letter  # loaded by select_related: no query
        except DeadLetter.DoesNotExist:
            letter = None
        item.dead_letter_or_none = letter
    return chain


def job_detail(job: CleanupJob, *, scope_audit: Any) -> dict[str, Any]:
    """Everything the job page shows: its ledger operations (the newest
    ``LEDGER_ROWS`` and the totals), its redrive chain with dead letters, and
    the audit events of those letters (narrowed by ``scope_audit``, a
    function of a queryset). Four queries."""
    ledger = LedgerEntry.objects.filter(job_id=job.pk)
    totals = ledger.aggregate(
        n=Count("id"),
        rows=Sum("rows_deleted"),
        candidates=Sum("candidates"),
        first=Min("applied_at"),
        last=Max("applied_at"),
    )
    entries = list(ledger.order_by("-id")[:LEDGER_ROWS])
    chain = job_chain(job)
    letter_ids = [str(item.dead_letter_or_none.pk) for item in chain if item.dead_letter_or_none is not None]
    events = []
    if letter_ids:
        events = list(
            scope_audit(
                AuditEvent.objects.filter(object_type="dead_letter", object_id__in=letter_ids).select_related("actor")
            ).order_by("id")[:100]
        )
    this = next((item for item in chain if item.pk == job.pk), job)
    return {
        "ledger": entries,
        "ledger_totals": {k: v or 0 for k, v in totals.items() if k not in {"first", "last"}}
        | {"first": totals["first"], "last": totals["last"]},
        "ledger_more": max(0, (totals["n"] or 0) - len(entries)),
        "chain": chain,
        "letter": getattr(this, "dead_letter_or_none", None),
        "redrives": [item for item in chain if item.redrive_of_id == job.pk],
        "events": events,
        # A purge's documents by id, as its letter's advice sends the operator here for them.
        "documents": documents_affected(job),
    }
