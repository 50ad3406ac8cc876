"""Dead letters: the inbox (filters and free-text search), one letter, and
the decision flow — redrive or dismiss — defined once here for its two
entry points: the ticked letters (``dead_letter_action``) and every open
letter matching the inbox's filter (``dead_letters_bulk``). Both ask for a
reason, confirm before anything changes, apply ``dead_letters_decide`` and
report the same way: the new jobs (linked, with a warning when nothing will
run them), the letters that could not be decided, those no longer open.

A reason too short (or no letter ticked) answers 400 with the ticked letters
still ticked and the typed reason kept, so the operator fixes only that.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Expression, QuerySet, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_http_methods, require_POST

from cleanup_ops.console_selectors import portfolio_choices, portfolio_names, property_names
from cleanup_ops.console_selectors.exports import LETTER_EXPORT_COLUMNS, export_rows
from cleanup_ops.console_selectors.letters import letter_facts
from cleanup_ops.console_selectors.names import SEARCH_MAX_LENGTH
from cleanup_ops.console_selectors.paging import keyset_page, page_size_parse, sort_parse
from cleanup_ops.console_selectors.search import letter_search_q
from cleanup_ops.console_selectors.waiting import open_work, why_they_will_not_run
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import MIN_REASON_LENGTH, Decision, dead_letters_decide
from cleanup_ops.selectors import DeadLetterFilter, dead_letter_filter_parse, dead_letters
from cleanup_ops.views.common import (
    LETTER_VIEW,
    PAGE_SIZE,
    bad_input_as_400,
    bad_request,
    counted,
    csv_stream,
    live_kinds_now,
    per_page_context,
    per_page_param,
    reason_problem,
    redirect_back,
    render_live,
    start_commands,
    were,
)
from cleanup_ops.views.confirm import BULK_BREAKDOWN_ROWS, bulk_confirmation
from retention.actors import request_actor
from retention.filters import text_param
from retention.inputs import MAX_TEXT_LENGTH, id_check, text_check
from retention.models import AuditEvent
from retention.scoping import portfolio_ids_where, scope_audit_events, scope_queryset

# The inbox's sortable columns (``paging.sort_parse``): word → field.
LETTER_SORTS: dict[str, str | Expression] = {
    "id": "id",
    "last_seen": "last_seen_at",
    "first_seen": "first_seen_at",
    "category": "category",
    "kind": "record_kind",
    "attempts": "attempts",
    "status": "status",
    "http_status": Coalesce("http_status", Value(0)),
    "portfolio": "portfolio_id",
    "property": Coalesce("property_id", Value(0)),
    "sweep": "sweep_id",
}


def _can(request: HttpRequest) -> dict[str, bool]:
    return {
        "can_redrive": request.user.has_perm("cleanup_ops.redrive_deadletter"),
        "can_dismiss": request.user.has_perm("cleanup_ops.dismiss_deadletter"),
    }


def _operation(raw: str | None, request: HttpRequest) -> Decision | HttpResponse:
    """The decision asked for, or the 400 naming ``operation``; refused without its permission."""
    if raw not in Decision.values:
        return bad_request(request, "operation", "operation must be redrive or dismiss.")
    decision = Decision(raw)
    if not request.user.has_perm(f"cleanup_ops.{decision}_deadletter"):
        raise PermissionDenied
    return decision


def _matching(
    request: HttpRequest, params: QueryDict, letter_filter: DeadLetterFilter, *, perm: str
) -> tuple[QuerySet[DeadLetter], str | None]:
    """The letters a filter and the free text ``q`` match, in the user's reach for ``perm``."""
    letters = scope_queryset(dead_letters(letter_filter), request.user, perm=perm)
    text = text_param(params, "q", strict=True, max_length=SEARCH_MAX_LENGTH)
    return (letters.filter(letter_search_q(text)) if text else letters), text


@login_required
@permission_required(LETTER_VIEW, raise_exception=True)
@bad_input_as_400
def dead_letters_export(request: HttpRequest) -> HttpResponseBase:
    """The inbox as CSV: its filter, search, scope and sort, every letter
    (not one page), identifiers, categories, statuses, counts and times only."""
    letter_filter = dead_letter_filter_parse(request.GET, strict=True, default_status=DeadLetter.Status.OPEN)
    letters, _ = _matching(request, request.GET, letter_filter, perm=LETTER_VIEW)
    sort = sort_parse(request.GET, LETTER_SORTS, default="-last_seen")
    rows = export_rows(letters.select_related(None), sort=sort, columns=LETTER_EXPORT_COLUMNS)
    return csv_stream(rows, filename="dead-letters.csv")


@login_required
@permission_required(LETTER_VIEW, raise_exception=True)
@bad_input_as_400
def dead_letter_inbox(request: HttpRequest) -> HttpResponse:
    letter_filter = dead_letter_filter_parse(request.GET, strict=True, default_status=DeadLetter.Status.OPEN)
    letters, text = _matching(request, request.GET, letter_filter, perm=LETTER_VIEW)
    sort = sort_parse(request.GET, LETTER_SORTS, default="-last_seen")
    size = page_size_parse(request.GET, default=PAGE_SIZE)
    page = keyset_page(letters.select_related("sweep"), request.GET, sort=sort, size=size)
    filters = letter_filter.as_params() | ({"q": text} if text else {}) | {"sort": sort.param} | per_page_param(size)
    return render_live(
        request,
        "console/dead_letters.html",
        {
            "page": page,
            "names": portfolio_names(letter.portfolio_id for letter in page.rows),
            "property_names": property_names(letter.property_id for letter in page.rows),
            "portfolios": portfolio_choices(portfolio_ids=portfolio_ids_where(request.user, LETTER_VIEW)),
            "filters": filters,
            "categories": FailureCategory.choices,
            "statuses": DeadLetter.Status.choices,
            "min_reason": MIN_REASON_LENGTH,
            **per_page_context(size),
            **_can(request),
        },
    )


@login_required
@permission_required(LETTER_VIEW, raise_exception=True)
def dead_letter_page(request: HttpRequest, letter_id: int) -> HttpResponse:
    """One dead letter: why it stopped, its job, sweep and portfolio, who
    decided what (its audit events), and redrive or dismiss with a reason."""
    letters = DeadLetter.objects.select_related("job", "job__purge_request", "sweep", "resolved_by", "redrive_job")
    letter = get_object_or_404(scope_queryset(letters, request.user, perm=LETTER_VIEW), pk=letter_id)
    events = scope_audit_events(
        AuditEvent.objects.filter(object_type="dead_letter", object_id=str(letter.pk)).select_related("actor"),
        request.user,
    )
    return render(
        request,
        "console/dead_letter.html",
        {
            "letter": letter,
            **letter_facts(letter),
            "events": list(events.order_by("id")[:50]),
            "names": portfolio_names([letter.portfolio_id]),
            "property_names": property_names([letter.property_id]),
            "min_reason": MIN_REASON_LENGTH,
            **_can(request),
        },
    )


@login_required
@require_POST
@bad_input_as_400
def dead_letter_action(request: HttpRequest) -> HttpResponse:
    """The ticked letters. Step 1 (no ``confirm``): validate and show a
    confirmation page. Step 2: apply."""
    decision = _operation(request.POST.get("operation"), request)
    if isinstance(decision, HttpResponse):
        return decision
    # Every id must be one (1 to 19 digits, at most 2^63-1): "²" or a
    # 5000-digit number is a 400 naming the field, never a 500.
    ids = [id_check(i, field="letter", from_form=True) for i in request.POST.getlist("letter")]
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    perm = f"cleanup_ops.{decision}_deadletter"
    letters = list(scope_queryset(DeadLetter.objects.filter(pk__in=ids), request.user, perm=perm).order_by("id"))
    errors = [] if letters else ["Select at least one dead letter."]
    problem = reason_problem(reason)
    if problem:
        errors.append(problem)
    if errors or request.POST.get("confirm") != "yes":
        return render(
            request,
            "console/dead_letter_confirm.html",
            {
                "operation": decision.value,
                "letters": letters,
                "reason": reason,
                "errors": errors,
                "next": request.POST.get("next", ""),
                "names": portfolio_names(letter.portfolio_id for letter in letters),
                "property_names": property_names(letter.property_id for letter in letters),
                "min_reason": MIN_REASON_LENGTH,
            },
            status=400 if errors else 200,
        )
    _decide(
        request, decision, DeadLetterFilter(letter_ids=tuple(letter.pk for letter in letters)), reason, len(letters)
    )
    return redirect_back(request, "console:dead_letters")


@login_required
@require_http_methods(["GET", "POST"])
@bad_input_as_400
def dead_letters_bulk(request: HttpRequest) -> HttpResponse:
    """Redrive or dismiss *every* open letter matching the inbox's filter.

    GET shows the count, a breakdown and asks for a reason; POST with
    ``confirm=yes`` decides with the same filter. If the number matching
    changed since the page was shown (``expected``), or the letters are not
    the ones it showed (``seen``, ``cleanup_ops.views.confirm``), nothing
    happens and the page asks again."""
    params = request.POST if request.method == "POST" else request.GET
    decision = _operation(params.get("operation"), request)
    if isinstance(decision, HttpResponse):
        return decision
    perm = f"cleanup_ops.{decision}_deadletter"
    parsed = dead_letter_filter_parse(params, strict=True)
    letter_filter = replace(parsed, status=DeadLetter.Status.OPEN, letter_ids=None)
    matching, text = _matching(request, params, letter_filter, perm=perm)
    filters = {k: v for k, v in letter_filter.as_params().items() if k != "status"} | ({"q": text} if text else {})
    page = bulk_confirmation(
        method=request.method or "GET",
        params=params,
        matching=matching,
        noun="open letters",
        none_left="No open dead letter matches this filter any more.",
    )
    if page.pinned is not None:
        # Never act beyond what was seen (the letters shown, the user's portfolios, the search): pin them.
        letter_filter = replace(letter_filter, letter_ids=page.pinned)
        _decide(request, decision, letter_filter, page.reason, page.count)
        return HttpResponseRedirect(reverse("console:dead_letters") + "?" + urlencode(filters))
    breakdown = list(
        matching.order_by()
        .values("category", "portfolio_id")
        .annotate(n=Count("id"))
        .order_by("-n", "category", "portfolio_id")[:BULK_BREAKDOWN_ROWS]
    )
    return render(
        request,
        "console/dead_letters_bulk.html",
        {
            **page.context(breakdown=breakdown),
            "operation": decision.value,
            "filters": filters,
            "names": portfolio_names([row["portfolio_id"] for row in breakdown] + [letter_filter.portfolio_id]),
        },
        status=400 if page.errors else 200,
    )


def _decide(request: HttpRequest, decision: Decision, letter_filter: DeadLetterFilter, reason: str, seen: int) -> None:
    """Apply the decision and say what happened (the one report of both entry points)."""
    try:
        decided, jobs, failed = dead_letters_decide(
            decision=decision, actor=request_actor(request), reason=reason, letter_filter=letter_filter
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return
    if decision == Decision.REDRIVE:
        _report_new_jobs(request, jobs)
    else:
        messages.success(request, f"Dismissed {counted(len(decided), 'dead letter')}.")
    if failed:
        listed = ", ".join(failure.describe() for failure in failed)
        verb = "redriven" if decision == Decision.REDRIVE else "dismissed"
        messages.error(
            request,
            f"{counted(len(failed), 'letter')} could not be {verb} and {were(len(failed), 'is', 'are')}"
            f" still open: {listed}.",
        )
    skipped = seen - len(failed) - len(decided)
    if skipped > 0:
        one = skipped == 1
        left = "was no longer open and was left as it is" if one else "were no longer open and were left as they are"
        messages.warning(request, f"{counted(skipped, 'letter')} {left}.")


def _report_new_jobs(request: HttpRequest, jobs: list[CleanupJob]) -> None:
    """The new jobs, linked (one, or the jobs list narrowed to them), and a
    warning when nothing will run them (a pause, no worker for their queue)."""
    if not jobs:
        messages.success(request, "Redrove no dead letter: no new job.")
        return
    ids = sorted(job.pk for job in jobs)
    if len(ids) == 1:
        link = format_html('<a href="{}">job {}</a>', reverse("console:job", args=[ids[0]]), ids[0])
    else:
        query = urlencode({"id_min": ids[0], "id_max": ids[-1], "redrives": "yes"})
        link = format_html('<a href="{}?{}">the {} new jobs</a>', reverse("console:jobs"), query, len(ids))
    messages.success(request, format_html("Redrove {}: see {}.", counted(len(ids), "dead letter"), link))
    now = timezone.now()
    work = open_work(now=now, portfolio_ids=None, live_kinds=live_kinds_now(now), job_ids=ids)
    for warning in why_they_will_not_run(
        work, stale_seconds=settings.CLEANUP_LIVENESS_STALE_SECONDS, start_commands=start_commands()
    ):
        messages.warning(request, warning)
