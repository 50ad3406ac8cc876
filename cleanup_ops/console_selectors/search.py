"""Free-text search over jobs, dead letters and audit events.

One box, the same meaning everywhere: the text is matched, case-insensitively,
against what an operator has in hand during an incident — a portfolio's or a
property's name, a sweep's slot (``2026-08-21T02:00`` or its key), a failure
category (its slug or its label, "downstream"), a record kind (its slug or
its label, "maintenance"), a job's key, a document id of a purge (exactly, as
the store's log shows it) — and a number is also an id (of the job, the
letter, the sweep, the property or the portfolio; for audit events, the
object's id) and, for dead letters, the store's HTTP status (``403``). Every
search is one query per list, narrowed by the reader's portfolios like any
other read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q

from cleanup_ops.models import CleanupJob, DeadLetter, PurgeRequest, Sweep
from cleanup_ops.recovery.classification import FailureCategory
from retention.domain import matching, portfolio_model, property_model
from retention.models import AuditEvent
from retention.registry import REGISTRY
from retention.scoping import PortfolioScope, portfolio_ids_q

SEARCH_RESULTS = 20


def _categories_matching(text: str) -> list[str]:
    lowered = text.lower()
    return [value for value, label in FailureCategory.choices if lowered in value or lowered in label.lower()]


def _kinds_matching(text: str) -> list[str]:
    lowered = text.lower()
    return [kind for kind, spec in REGISTRY.items() if lowered in kind or lowered in spec.label.lower()]


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _scope_matching(text: str) -> Q:
    """Portfolio or property named like ``text`` (subqueries: jobs and letters hold plain ids)."""
    portfolios = matching(portfolio_model(), text).values("pk")
    properties = matching(property_model(), text).values("pk")
    return Q(portfolio_id__in=portfolios) | Q(property_id__in=properties)


def _purges_naming(text: str) -> Any:
    """The purge requests whose documents include ``text`` exactly (JSON
    containment, ``@>``), as a subquery: a join would make the bulk
    actions' ``SELECT … FOR UPDATE`` over a search lock an outer join's
    nullable side, which PostgreSQL refuses."""
    return PurgeRequest.objects.filter(document_ids__contains=[text]).values("pk")


def job_search_q(text: str) -> Q:
    q = _scope_matching(text) | Q(key__icontains=text) | Q(purge_request_id__in=_purges_naming(text))
    categories = _categories_matching(text)
    if categories:
        q |= Q(last_error_category__in=categories)
    kinds = _kinds_matching(text)
    if kinds:
        q |= Q(record_kind__in=kinds)
    number = _number(text)
    if number is not None:
        q |= Q(pk=number) | Q(sweep_id=number) | Q(property_id=number) | Q(portfolio_id=number)
    return q


def letter_search_q(text: str) -> Q:
    q = (
        _scope_matching(text)
        | Q(sweep__key__icontains=text)
        | Q(error_class__icontains=text)
        | Q(job_id__in=CleanupJob.objects.filter(purge_request_id__in=_purges_naming(text)).values("pk"))
    )
    categories = _categories_matching(text)
    if categories:
        q |= Q(category__in=categories)
    kinds = _kinds_matching(text)
    if kinds:
        q |= Q(record_kind__in=kinds)
    number = _number(text)
    if number is not None:
        q |= Q(pk=number) | Q(job_id=number) | Q(sweep_id=number) | Q(property_id=number) | Q(portfolio_id=number)
        if 100 <= number <= 599:  # an HTTP status the store answered
            q |= Q(http_status=number)
    return q


def audit_search_q(text: str) -> Q:
    """Action, reason, actor's username, object type or id; the names of the
    portfolios and sweeps the event names (by the object it is about)."""
    q = (
        Q(action__icontains=text)
        | Q(reason__icontains=text)
        | Q(**{f"actor__{get_user_model().USERNAME_FIELD}__icontains": text})
        | Q(object_type__icontains=text)
        | Q(object_id=text)
    )
    portfolios = [str(i) for i in matching(portfolio_model(), text).values_list("pk", flat=True)[:50]]
    if portfolios:
        q |= Q(object_type="portfolio", object_id__in=portfolios)
    categories = _categories_matching(text)
    for category in categories:
        q |= Q(details__category=category)
    kinds = _kinds_matching(text)
    if kinds:
        q |= Q(details__record_kind__in=kinds)
    sweeps = list(Sweep.objects.filter(key__icontains=text).values_list("id", flat=True)[:50])
    if sweeps:
        q |= Q(details__sweep_id__in=sweeps)
    return q


@dataclass
class SearchResults:
    text: str
    jobs: list[CleanupJob]
    letters: list[DeadLetter]
    events: list[AuditEvent]


def search_everything(
    text: str,
    *,
    job_scope: PortfolioScope | None,
    letter_scope: PortfolioScope | None,
    audit_events: Any | None,
    job_allowed: bool = True,
    letter_allowed: bool = True,
) -> SearchResults:
    """The first ``SEARCH_RESULTS`` of each list, newest first. ``audit_events``:
    the reader's scoped audit queryset, or None when they may not read it."""
    jobs: list[CleanupJob] = []
    letters: list[DeadLetter] = []
    events: list[AuditEvent] = []
    if job_allowed:
        jobs = list(
            CleanupJob.objects.filter(job_search_q(text), portfolio_ids_q(job_scope))
            .select_related("sweep")
            .order_by("-id")[:SEARCH_RESULTS]
        )
    if letter_allowed:
        letters = list(
            DeadLetter.objects.filter(letter_search_q(text), portfolio_ids_q(letter_scope))
            .select_related("sweep", "job")
            .order_by("-id")[:SEARCH_RESULTS]
        )
    if audit_events is not None:
        matching = audit_events.filter(audit_search_q(text)).select_related("actor")
        events = list(matching.order_by("-id")[:SEARCH_RESULTS])
    return SearchResults(text=text, jobs=jobs, letters=letters, events=events)
