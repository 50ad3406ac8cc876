"""Reads that more than the console uses, grouped by who reads them: the
dead-letter filter (the inbox, the API, a bulk decision, ``cleanup_redrive``),
the figures ``cleanup_status`` and ``cleanup_drain`` print, the sweeps as the
reader's portfolios see them (the sweep pages of the console and the API, the
proof), the digest of a bulk decision's set (the console's confirmation
pages and the API's bulk decision) and the rate the policy review's impact
preview uses. The console's
own pages read ``console_selectors`` (the overview's figures included).

Tenant scope: the figures the console and the API show take ``portfolio_ids``
— ``None`` for the platform's staff (every portfolio), otherwise the
portfolios a customer's staff member may see
(``retention.scoping.portfolio_ids_where`` for the permission the page or
route requires) — and count only those
portfolios' jobs, ledger rows, letters and records. Pipeline-wide facts that
name no portfolio (the current sweep's key, the limits) are shown to all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.db.models import Count, Max, Min, Q, QuerySet, Sum
from django.utils import timezone

from cleanup_ops.models import (
    OPEN_STATES,
    CleanupJob,
    DeadLetter,
    JobKind,
    JobState,
    LedgerEntry,
    PipelinePause,
    PurgeRequest,
    Sweep,
    superseded_q,
)
from cleanup_ops.ratelimit import effective_limits
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.sweeps import sweep_status_seen
from retention.domain import key_json, portfolio_model
from retention.filters import MAX_AGE_HOURS, FilterError, choice_param, id_param, int_param, key_param
from retention.registry import REGISTRY
from retention.scoping import PortfolioScope, portfolio_ids_q

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


# --- Dead letters: the filter the inbox, the API, a bulk decision and cleanup_redrive share


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters: the inbox's filter, the API's, and a bulk decision's."""

    status: str | None = None
    category: str | None = None
    portfolio_id: Any = None  # the customer model's key (an int, a UUID…)
    sweep_id: int | None = None
    older_than_hours: int | None = None
    letter_ids: tuple[int, ...] | None = None
    # A cause (``console_selectors.letters.letter_groups``): the store's HTTP
    # status (``NO_HTTP_STATUS``: letters whose failure was no HTTP answer) and the record kind.
    http_status: int | None = None
    record_kind: str | None = None

    def q(self, *, now: datetime) -> Q:
        q = Q()
        if self.http_status == NO_HTTP_STATUS:
            q &= Q(http_status__isnull=True)
        elif self.http_status is not None:
            q &= Q(http_status=self.http_status)
        if self.record_kind is not None:
            q &= Q(record_kind=self.record_kind)
        if self.status is not None:
            q &= Q(status=self.status)
        if self.category is not None:
            q &= Q(category=self.category)
        if self.portfolio_id is not None:
            q &= Q(portfolio_id=self.portfolio_id)
        if self.sweep_id is not None:
            q &= Q(sweep_id=self.sweep_id)
        if self.older_than_hours is not None:
            q &= Q(last_seen_at__lte=now - timedelta(hours=self.older_than_hours))
        if self.letter_ids is not None:
            q &= Q(pk__in=self.letter_ids)
        return q

    def as_params(self) -> dict[str, str]:
        """The chosen filters as request parameters (the console keeps them in links)."""
        pairs = {
            "status": self.status,
            "category": self.category,
            "portfolio": self.portfolio_id,
            "sweep": self.sweep_id,
            "older_than_hours": self.older_than_hours,
            "http_status": self.http_status,
            "kind": self.record_kind,
        }
        return {name: str(value) for name, value in pairs.items() if value is not None}


# ``http_status=0``: the letters whose failure was not an HTTP answer (a
# timeout, an invalid input, a cancel), so that every cause is one filter.
NO_HTTP_STATUS = 0


def dead_letter_filter_parse(
    params: Mapping[str, Any], *, strict: bool, default_status: str | None = None
) -> DeadLetterFilter:
    """``status``, ``category``, ``portfolio``, ``sweep``, ``older_than_hours``,
    ``http_status`` (100 to 599, or 0 for "no HTTP answer"), ``kind`` (record kind).

    ``strict`` (the API and the console): an invalid value raises
    ``FilterError`` naming the parameter; ``older_than_hours`` is at most a
    century (``MAX_AGE_HOURS``). Not strict: an invalid value is ignored.
    """
    raw_status = params.get("status", default_status)
    return DeadLetterFilter(
        status=choice_param({"status": raw_status}, "status", DeadLetter.Status.values, strict=strict),
        category=choice_param(params, "category", FailureCategory.values, strict=strict),
        portfolio_id=key_param(params, "portfolio", model=portfolio_model(), strict=strict),
        sweep_id=id_param(params, "sweep", strict=strict),
        older_than_hours=int_param(params, "older_than_hours", strict=strict, minimum=0, maximum=MAX_AGE_HOURS),
        http_status=_http_status_param(params, strict=strict),
        record_kind=choice_param(params, "kind", list(REGISTRY), strict=strict),
    )


def _http_status_param(params: Mapping[str, Any], *, strict: bool) -> int | None:
    value = int_param(params, "http_status", strict=strict, minimum=NO_HTTP_STATUS, maximum=599)
    if value is not None and value != NO_HTTP_STATUS and value < 100:
        if strict:
            raise FilterError("http_status", "http_status must be 0 (no HTTP answer) or a status from 100 to 599.")
        return None
    return value


def dead_letters(letter_filter: DeadLetterFilter, *, now: datetime | None = None) -> Any:
    return (
        DeadLetter.objects.filter(letter_filter.q(now=now or timezone.now()))
        .select_related("job")
        .order_by("-last_seen_at", "-id")
    )


# --- The command line: the figures cleanup_status and cleanup_drain print ----------


def pipeline_status(*, now: datetime | None = None) -> dict[str, Any]:
    """The figures ``cleanup_status`` prints: a handful of aggregate queries."""
    now = now or timezone.now()
    by_state = dict(CleanupJob.objects.values_list("state").annotate(n=Count("id")).order_by())
    oldest_due = CleanupJob.objects.due(now=now).aggregate(at=Min("available_at"))["at"]
    sweeps = list(
        Sweep.objects.order_by("-slot")[:10]
        .annotate(deleted=Sum("jobs__rows_deleted"))
        .values("id", "key", "status", "jobs_admitted", "carried_over", "deleted")
    )
    return {
        "jobs_by_state": {state: by_state.get(state, 0) for state in JobState.values},
        "oldest_due_age_seconds": round((now - oldest_due).total_seconds(), 1) if oldest_due else None,
        "leased": CleanupJob.objects.live_leases(now=now).count(),
        "expired_leases": CleanupJob.objects.expired_leases(now=now).count(),
        "rows_deleted_total": LedgerEntry.objects.aggregate(n=Sum("rows_deleted"))["n"] or 0,
        "dead_letters_open": DeadLetter.objects.open().count(),
        "paused": [
            {"portfolio_id": key_json(p["portfolio_id"]), "reason": p["reason"]}
            for p in PipelinePause.objects.active().values("portfolio_id", "reason")
        ],
        "limits": effective_limits(),
        "ledger_rows": LedgerEntry.objects.count(),
        "sweeps": [
            {
                "sweep_id": s["id"],
                "key": s["key"],
                "status": s["status"],
                "jobs_admitted": s["jobs_admitted"],
                "carried_over": s["carried_over"],
                "rows_deleted": s["deleted"] or 0,
            }
            for s in sweeps
        ],
    }


def drain_summary() -> dict[str, Any]:
    jobs = CleanupJob.objects.values_list("state", "outcome").annotate(n=Count("id")).order_by()
    by_state: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    for state, outcome, n in jobs:
        by_state[state] = by_state.get(state, 0) + n
        if outcome:
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    per_kind = {
        kind: {"deleted": deleted or 0, "held": held or 0}
        for kind, deleted, held in CleanupJob.objects.values_list("record_kind")
        .annotate(d=Sum("rows_deleted"), h=Sum("rows_held"))
        .order_by("record_kind")
    }
    return {
        "jobs_by_state": by_state,
        "jobs_by_outcome": by_outcome,
        "rows_deleted": sum(v["deleted"] for v in per_kind.values()),
        "rows_held": sum(v["held"] for v in per_kind.values()),
        "per_record_kind": per_kind,
        "ledger_rows": LedgerEntry.objects.count(),
    }


# --- What a bulk decision's caller saw: the console's confirmation pages, the API's list and bulk


def selection_ids(matching: QuerySet[Any]) -> list[int]:
    return sorted(matching.values_list("id", flat=True))


def selection_digest(ids: Iterable[int]) -> str:
    """A sha256 over the sorted ids, comma-joined in decimal: the set a
    confirmation page showed, or an API list matched (all its pages). Names
    ids only (no record contents); not a secret, a compact fingerprint of the
    set, so a client can compute it too."""
    text = ",".join(str(i) for i in sorted(ids))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class SelectionChange:
    """Why a bulk decision must be asked again: ``field`` is the input that
    no longer holds (``expected``: the count; ``seen``: the digest)."""

    field: str
    message: str


def selection_changed(
    *, seen: str, ids: list[int], expected: int | None, noun: str, since: str = "the page was shown"
) -> SelectionChange | None:
    """Why confirming must ask again (the ids matching now are not the ids
    shown), or ``None``. ``seen`` is the digest the caller saw; a missing
    one (a form from before this check) counts as a change: the count alone
    lets a letter that appeared after the listing be decided unseen."""
    if expected is not None and expected != len(ids):
        return SelectionChange(
            "expected",
            f"The number of {noun} matching changed from {expected} to {len(ids)}; check and confirm again.",
        )
    if seen and seen == selection_digest(ids):
        return None
    return SelectionChange(
        "seen",
        f"The {noun} matching changed since {since} (some appeared, some are gone),"
        f" though there are still {len(ids)}; check and confirm again.",
    )


# --- Sweeps as the reader's portfolios see them: the sweep pages (console, API), the proof


def sweeps_seen(*, portfolio_ids: PortfolioScope) -> QuerySet[Sweep]:
    """Every sweep (the schedule is the platform's, not a customer's). For a
    customer's staff each sweep carries their own figures (``own_*``, see
    ``sweep_figures_seen``) in place of the pipeline-wide ones."""
    qs = Sweep.objects.order_by("-slot")
    if portfolio_ids is None:
        return qs
    mine = portfolio_ids_q(portfolio_ids, field="jobs__portfolio_id")
    return qs.annotate(
        own_admitted=Count("jobs", filter=mine & Q(jobs__job_kind=JobKind.DELETE, jobs__redrive_of__isnull=True)),
        own_open=Count("jobs", filter=mine & Q(jobs__state__in=OPEN_STATES)),
        own_dead=Count("jobs", filter=mine & Q(jobs__state=JobState.DEAD))
        - Count("jobs", filter=mine & superseded_q("jobs__")),
        own_finished_at=Max("jobs__finished_at", filter=mine),
    )


class _OwnFigures(TypedDict):
    """What ``sweeps_seen`` annotates a sweep with for a customer's staff."""

    own_admitted: int
    own_open: int
    own_dead: int
    own_finished_at: datetime | None


def sweep_figures_seen(sweep: Sweep) -> dict[str, Any]:
    """The pipeline-wide figures of a sweep from ``sweeps_seen``, replaced by
    the customer's own. ``carried_over`` is not attributed per portfolio, so a
    customer sees none rather than everyone's."""
    if not hasattr(sweep, "own_admitted"):
        return {}
    # Known, not guessed: only sweeps_seen's annotation gives a sweep own_admitted.
    own = cast("WithAnnotations[Sweep, _OwnFigures]", sweep)
    status = sweep_status_seen(own.status, open_jobs=own.own_open, dead_jobs=own.own_dead)
    drained = status in {Sweep.Status.DRAINED, Sweep.Status.DRAINED_WITH_DEAD_LETTERS}
    return {
        "status": status,
        "jobs_admitted": own.own_admitted,
        "carried_over": None,
        "finished_at": (own.own_finished_at or own.admitted_at) if drained else None,
    }


def sweep_attachments(*, sweep_id: int, portfolio_ids: PortfolioScope = None) -> dict[str, int]:
    """What a sweep's purge jobs did with the deleted records' attachments
    (two queries): purged, already gone, set aside under a legal hold (and how
    many of those still wait for the hold's release), skipped because a
    remaining record still names them, and ids that were not identifiers."""
    requests = PurgeRequest.objects.filter(
        pk__in=CleanupJob.objects.filter(sweep_id=sweep_id, job_kind=JobKind.PURGE).values("purge_request_id")
    )
    if portfolio_ids is not None:
        requests = requests.filter(portfolio_id__in=sorted(portfolio_ids))
    totals = requests.aggregate(
        purged=Sum("documents_purged"),
        absent=Sum("documents_absent"),
        held=Sum("documents_held"),
        referenced=Sum("documents_referenced"),
        invalid=Sum("invalid_ids"),
    )
    waiting = requests.filter(documents_held__gt=0).values_list("held_document_ids", flat=True)
    return {
        "documents_purged": totals["purged"] or 0,
        "documents_already_gone": totals["absent"] or 0,
        "documents_set_aside_under_hold": totals["held"] or 0,
        "documents_awaiting_hold_release": sum(len(ids) for ids in waiting if isinstance(ids, list)),
        "documents_still_referenced": totals["referenced"] or 0,
        "documents_invalid_ids": totals["invalid"] or 0,
    }


# --- The policy review's impact preview (retention.selectors.throughput_provider_set) -----


def kind_rows_per_second(record_kind: str, *, now: datetime | None = None) -> float | None:
    """Rows of ``record_kind`` deleted per second over the last day, from the
    ledger (first to last batch in that window); None with fewer than two
    batches or none deleted."""
    now = now or timezone.now()
    window = LedgerEntry.objects.filter(record_kind=record_kind, applied_at__gte=now - timedelta(days=1))
    figures = window.aggregate(rows=Sum("rows_deleted"), first=Min("applied_at"), last=Max("applied_at"))
    if not figures["rows"] or figures["first"] is None or figures["last"] <= figures["first"]:
        return None
    return float(figures["rows"]) / (figures["last"] - figures["first"]).total_seconds()


def api_tokens_of(*, user: Any) -> QuerySet[Any]:
    """``user``'s API tokens (``knox.models.AuthToken``), newest first, the expired
    ones left out (knox deletes one when it is next presented). Never the secret:
    the table holds none, and what shows a token shows its ``token_key`` only."""
    # Imported here: the app's ready() imports this module, and a host without
    # knox must reach the check that names the line to add.
    from knox.models import AuthToken

    return (
        AuthToken.objects.filter(user=user)
        .filter(Q(expiry__isnull=True) | Q(expiry__gt=timezone.now()))
        .order_by("-created", "token_key")
    )
